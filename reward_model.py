"""
Bradley-Terry reward model: the SFT GPT with a scalar head read at the EOS position, trained so that
the right answer scores above a wrong one, -log sigmoid(s_chosen - s_rejected) (losses.bt_loss), with

    s(x, y) = head(h at y's EOS) + lik_coef * log p(y | x)    (y's log-likelihood under the RM's own LM head)

plus lm_coef * the NLL of the right answers, so the trunk keeps learning the task while the head trains
(an LM regulariser as in GRM, Yang et al. 2024). Why the likelihood term: the head alone (lik_coef=0)
checks answers only as far as the trunk has memorised them (held-out pair accuracy 0.85, and chance on
the SFT policy's own mistakes), while the trunk's log-likelihood separates the documented wrong answers
before any training and, as the NLL carries the trunk past the policy, the policy's mistakes too.

    python reward_model.py configs/mul_rm.py                       # ~3.5 min on 2 CPU cores -> out/rm-mul/ckpt.pt
    python reward_model.py configs/mul_rm.py --sft_ckpt=out/sft-mul-seed2/ckpt.pt --out_dir=out/rm-try
    python reward_model.py configs/mul_rm.py --lik_coef=0 --lm_coef=0   # the classic head-only RM
    python rl.py --loss=ppo --reward=rm                            # RLHF: PPO against this model

Training pairs: data/<task>/pairs_train.jsonl (right answer vs a plausible wrong one of five
documented kinds) plus "policy" pairs: `policy_samples` answers sampled per train prompt
from the SFT policy, each wrong one paired with the right answer (the mistakes PPO will meet).
Held-out: `eval/pair_accuracy` on the test-split pairs (and per kind), `eval/policy_pair_accuracy`
on wrong answers the SFT policy samples for test prompts; the mean of the same two on the val split
(`val/pair_accuracy`, `val/policy_pair_accuracy`) picks best.pt.
"""
import os
import time
from dataclasses import asdict, dataclass

import torch

import losses as L
from config import UserError, print_config, run_cli
from ddp import all_reduce, init_distributed, mean_over_ranks, resolve_device
from evaluate import gold_rows, pack, record_rows, responses
from logger import Logger, fmt_time
from data.tasks import ensure_data, load_problems, load_records
from checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint, save_checkpoint
from model import generate, rm_scores


@dataclass
class Config:
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/rm-mul"
    seed: int = 1337
    batch_size: int = 128  # pairs per step
    lr: float = 1e-3
    warmup_iters: int = 50
    max_iters: int = 1500
    lik_coef: float = 1.0  # score = head at EOS + lik_coef * the answer's log-likelihood (0 = head only)
    lm_coef: float = 1.0  # + lm_coef * NLL of the chosen (right) answers: the trunk keeps learning the task
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 250
    policy_samples: int = 4  # answers per train prompt from the SFT policy for extra pairs; 0 = off
    eval_policy_samples: int = 8  # answers per test prompt for eval/policy_pair_accuracy
    temperature: float = 1.0  # the RL sampling temperature
    max_new_tokens: int = 8
    threads: int = 0
    device: str = "auto"  # auto = cuda > mps > cpu
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment


def scores(model, rows, pad_id, lik_coef):
    """rm_scores of [(prompt ids, response ids)] rows -> scores (N,), log-probs (N, T-1), their mask (N, T-1)."""
    dev = next(model.parameters()).device
    ids, mask = (t.to(dev) for t in pack(rows, pad_id))
    return *rm_scores(model, ids, mask, None, lik_coef), mask[:, 1:]


@torch.no_grad()
def policy_pairs(model, tok, problems, reverse, n, cfg, gen):
    """Pairs (right answer, a wrong answer the policy sampled) for each problem: n samples each, every
    distinct wrong one kept. Returns (chosen rows, rejected rows)."""
    chosen, rejected = [], []
    model.eval()
    for i in range(0, len(problems), 256):
        chunk = problems[i:i + 256]
        rows = gold_rows(tok, chunk, reverse)  # [(prompt ids, gold answer ids + EOS)]
        out = generate(model, [p for p, _ in rows], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=n,
                       temperature=cfg.temperature, generator=gen)
        resp = responses(out)
        for j, (prompt, gold) in enumerate(rows):
            seen = set()
            for r in resp[j * n:(j + 1) * n]:
                if r != gold and tuple(r) not in seen:
                    seen.add(tuple(r))
                    chosen.append((prompt, gold))
                    rejected.append((prompt, r))
    return chosen, rejected


@torch.no_grad()
def pair_accuracy(model, chosen, rejected, pad_id, lik_coef, kinds=None):
    """Fraction of pairs whose chosen answer scores higher; with kinds, also per kind."""
    model.eval()
    def s(rows):  # 512 rows at a time: memory
        return torch.cat([scores(model, rows[i:i + 512], pad_id, lik_coef)[0] for i in range(0, len(rows), 512)])
    win = (s(chosen) > s(rejected)).float()  # (N,)
    out = {"": win.mean().item()}
    for k in sorted(set(kinds or [])):
        out["/" + k] = win[torch.tensor([x == k for x in kinds], device=win.device)].mean().item()
    return out


def main(cfg):
    dev = resolve_device(cfg.device)
    rank, world = init_distributed(dev)  # torchrun: each rank samples its share of policy pairs and of every batch
    master = rank == 0  # rank 0 alone evaluates, prints, saves and logs
    if cfg.batch_size % world:
        raise UserError(f"batch_size={cfg.batch_size} must divide by the {world} ranks")
    if master:
        print_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ckpt = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
    model, tok = model_from_checkpoint(ckpt, cfg.sft_ckpt, scalar_head=True)  # fresh head on the SFT trunk
    model.to(dev)
    task, reverse = ckpt_settings(ckpt, cfg.sft_ckpt, "task", "reverse")
    root = ensure_data(task)
    gen = torch.Generator(dev).manual_seed(cfg.seed + 1000 * rank)  # policy samples, then batch order
    t0 = time.time()

    def documented(split):
        recs = load_records(root / f"pairs_{split}.jsonl", "pairs")
        rows, _ = record_rows(tok, recs, reverse)
        return rows[:len(recs)], rows[len(recs):], [r.get("kind", "?") for r in recs]

    tr_c, tr_r, tr_k = documented("train")
    va_c, va_r, _ = documented("val")
    te_c, te_r, te_k = documented("test")
    test = load_problems(root / "test.txt")
    if master:
        print(f"sampling SFT-policy answers: {cfg.eval_policy_samples} per test prompt ({len(test)}), "
              f"{cfg.policy_samples} per train prompt ...", flush=True)
    ev_c, ev_r = policy_pairs(model, tok, test, reverse, cfg.eval_policy_samples, cfg, torch.Generator(dev).manual_seed(cfg.seed + 1)) \
        if master else ([], [])
    vp_c, vp_r = policy_pairs(model, tok, load_problems(root / "val.txt"), reverse, cfg.eval_policy_samples, cfg,
                              torch.Generator(dev).manual_seed(cfg.seed + 2)) if master else ([], [])
    if cfg.policy_samples:
        train = load_problems(root / "train.txt")[rank::world]  # this rank's share of the train prompts
        pc, pr = policy_pairs(model, tok, train, reverse, cfg.policy_samples, cfg, gen)
        tr_c, tr_r, tr_k = tr_c + pc, tr_r + pr, tr_k + ["policy"] * len(pc)
    if master:
        print(f"{len(tr_c)} train pairs ({tr_k.count('policy')} from policy samples), {len(te_c)} test pairs, "
              f"{len(ev_c)} test / {len(vp_c)} val pairs with policy-sampled wrong answers ({time.time() - t0:.0f}s)", flush=True)
        if not ev_c:
            raise UserError("the SFT policy sampled no wrong answer on the test split; nothing to evaluate the RM on")

    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (0.9, 0.99))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model  # all-reduces gradients in backward
    logger = Logger(cfg.out_dir, cfg, enabled=master)
    best = -1.0

    def run_eval(step):
        nonlocal best
        doc = pair_accuracy(model, te_c, te_r, tok.pad_id, cfg.lik_coef, te_k)
        m = {f"eval/pair_accuracy{k}": v for k, v in doc.items()}
        m["eval/policy_pair_accuracy"] = pair_accuracy(model, ev_c, ev_r, tok.pad_id, cfg.lik_coef)[""]
        m["val/pair_accuracy"] = pair_accuracy(model, va_c, va_r, tok.pad_id, cfg.lik_coef)[""]
        if vp_c:  # best.pt: the mean of the documented and the policy-sampled val pairs (the ones PPO meets)
            m["val/policy_pair_accuracy"] = pair_accuracy(model, vp_c, vp_r, tok.pad_id, cfg.lik_coef)[""]
        sel = (m["val/pair_accuracy"] + m.get("val/policy_pair_accuracy", m["val/pair_accuracy"])) / 2
        logger.log({"step": step, **m})
        print(f"step {step:5d} | eval " + " ".join(f"{k} {v:.4f}" for k, v in m.items()) +
              f" | {time.time() - t0:.0f}s", flush=True)
        conf = {**asdict(cfg), "task": task, "reverse": reverse}
        if sel > best:
            best = sel
            save_checkpoint(os.path.join(cfg.out_dir, "best.pt"), model, opt, conf, step, tok, best_val=best)
        save_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"), model, opt, conf, step, tok, best_val=best)
        return m

    m = run_eval(0) if master else None
    t_train = time.time()
    for step in range(1, cfg.max_iters + 1):
        model.train()
        lr = cfg.lr * min(1.0, step / cfg.warmup_iters)
        for g in opt.param_groups:
            g["lr"] = lr
        B = cfg.batch_size // world  # every rank the same share: DDP's gradient average is the batch mean
        idx = torch.randint(len(tr_c), (B,), generator=gen, device=dev).tolist()
        s, logp, rmask = scores(ddp, [tr_c[i] for i in idx] + [tr_r[i] for i in idx], tok.pad_id, cfg.lik_coef)  # (2B,)
        loss, st = L.bt_loss(s[:B], s[B:])
        n_tok = all_reduce(rmask[:B].sum()).item() / world  # every rank's right-answer tokens: DDP averages, so / world
        nll, _ = L.nll_loss(logp[:B], rmask[:B], n_tok)
        loss = loss + cfg.lm_coef * nll
        if not all_reduce(loss.detach()).isfinite():
            raise UserError(f"non-finite loss at step {step}; last good checkpoint kept in {cfg.out_dir}")
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if step % 50 == 0:
            st = mean_over_ranks({"train/loss": loss.item(), "train/pair_accuracy": st["pair_accuracy"].item(),
                                  "train/margin": st["margin"].item(), "train/nll": nll.item()})
            logger.log({"step": step, **st, "train/grad_norm": gnorm.item(), "train/lr": lr})
            if master:
                eta = (time.time() - t_train) / step * (cfg.max_iters - step)  # mean step time so far, evals included
                print(f"step {step:5d}/{cfg.max_iters} | loss {st['train/loss']:.4f} acc {st['train/pair_accuracy']:.3f} "
                      f"nll {st['train/nll']:.4f} "
                      f"| {fmt_time(time.time() - t0)}, ETA {fmt_time(eta)}", flush=True)
        if master and (step % cfg.eval_interval == 0 or step == cfg.max_iters):
            m = run_eval(step)
    if master:
        print(f"done in {time.time() - t0:.0f}s: test pair accuracy {m['eval/pair_accuracy']:.4f}, on policy-sampled "
              f"wrong answers {m['eval/policy_pair_accuracy']:.4f}; checkpoint {cfg.out_dir}/ckpt.pt", flush=True)
    logger.finish()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return m

if __name__ == "__main__":
    run_cli(main, Config)
