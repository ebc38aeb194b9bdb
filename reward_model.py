"""
Bradley-Terry reward model: the SFT GPT plus a scalar head, trained so that the right answer y+
scores above a wrong one y-; the NLL keeps the trunk learning the task (an LM regulariser, GRM, Yang
et al. 2024) and the likelihood term scores answers the head alone (lik_coef=0) never memorised:

    loss = -log sigmoid(s(x, y+) - s(x, y-)) + lm_coef * NLL(y+ | x)  (losses.bt_loss, nll_loss) 
    s(x, y) = head(h at y's EOS) + lik_coef * log p(y | x)             (rm.rm_scores)

Pairs: data/<task>/pairs_<split>.jsonl (five documented kinds of wrong answer) and "policy" pairs,
whose wrong answer the SFT policy sampled (the mistakes PPO will meet). best.pt: the mean of the two
val pair accuracies (the documented ones alone are near 1 from step 0).

    python reward_model.py configs/mul_rm.py                            # -> out/rm-mul/ckpt.pt
    python reward_model.py configs/mul_rm.py --lik_coef=0 --lm_coef=0   # the classic head-only RM
    python rl.py --loss=ppo --reward=rm                                 # RLHF: PPO against it
"""
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from data.tasks import load_problems
from losses import bt_loss, nll_loss
from model import adamw, generate, responses, seeded
from nanorl.checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from nanorl.config import UserError, run_cli
from nanorl.ddp import all_reduce
from nanorl.evaluate import env_of
from nanorl import loop
from nanorl.loop import TrainConfig, start
from nanorl.pref import ensure_pairs, load_records
from nanorl.rm import rm_scores
from nanorl.rows import gold_rows, pack, record_rows


@dataclass
class Config(TrainConfig):
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/rm-mul"
    batch_size: int = 128  # pairs per step
    min_lr: Optional[float] = None  # constant lr after warmup
    warmup_iters: int = 50
    max_iters: int = 1500
    lik_coef: float = 1.0  # score = head at EOS + lik_coef * log p(answer); 0: head only
    lm_coef: float = 1.0  # + lm_coef * NLL of the right answers: the trunk keeps learning the task
    policy_samples: int = 4  # answers per train prompt from the SFT policy for extra pairs; 0 = off
    eval_policy_samples: int = 8  # answers per val / test prompt for the policy pair accuracies
    temperature: float = 1.0  # the RL sampling temperature
    max_new_tokens: int = 8


def scores(model, rows, pad_id, lik_coef):
    """rm_scores of [(prompt ids, answer ids)] -> scores (N,), log-probs and their mask (N, T-1)."""
    ids, _, mask = (t.to(next(model.parameters()).device) for t in pack(rows, pad_id))
    return *rm_scores(model, ids, mask, None, lik_coef), mask[:, 1:]


@torch.no_grad()
def policy_pairs(model, tok, problems, reverse, n, cfg, gen):
    """(chosen rows, rejected rows, kinds): the right answer against each distinct wrong one of n
    answers the policy samples per problem."""
    chosen, rejected = [], []
    model.eval()
    for i in range(0, len(problems), 256):
        rows = gold_rows(tok, problems[i:i + 256], reverse)  # [(prompt ids, gold answer ids + EOS)]
        out = generate(model, [p for p, _ in rows], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=n,
                       temperature=cfg.temperature, generator=gen)
        resp = responses(out)
        for j, (prompt, gold) in enumerate(rows):
            for r in dict.fromkeys(tuple(r) for r in resp[j * n:(j + 1) * n]):  # distinct, in order
                if list(r) != gold:
                    chosen.append((prompt, gold))
                    rejected.append((prompt, list(r)))
    return chosen, rejected, ["policy"] * len(chosen)


@torch.no_grad()
def pair_accuracy(model, pairs, pad_id, lik_coef):
    """Fraction of pairs (chosen rows, rejected rows, kinds) whose chosen answer scores higher:
    {"": of all, "/kind": of each kind's}."""
    model.eval()
    chosen, rejected, kinds = pairs
    rows, n = chosen + rejected, len(chosen)
    s = torch.cat([scores(model, rows[i:i + 512], pad_id, lik_coef)[0]
                   for i in range(0, len(rows), 512)])  # (2N,), 512 rows at a time: memory
    win = (s[:n] > s[n:]).tolist()
    out = {"": sum(win) / n}
    for k in sorted(set(kinds)):
        hits = [w for w, x in zip(win, kinds) if x == k]
        out["/" + k] = sum(hits) / len(hits)
    return out


def load_pairs(cfg, model, tok, task, reverse, rank, world):
    """{name: (chosen rows, rejected rows, kinds)}: the documented pairs of "train" (plus policy
    pairs of this rank's share of its prompts), "val", "test"; "val_policy", "test_policy"."""
    root, dev = ensure_pairs(task), next(model.parameters()).device

    def sampled(split, n, share=slice(None)):
        gen = seeded(dev, "policy_pairs", split, cfg.seed, rank)
        problems = load_problems(root / f"{split}.txt")[share]
        return policy_pairs(model, tok, problems, reverse, n, cfg, gen)

    pairs = {}
    for split in ("train", "val", "test"):
        recs = load_records(root / f"pairs_{split}.jsonl", "pairs")
        rows, _ = record_rows(tok, recs, reverse)  # chosen rows, then rejected rows
        pairs[split] = rows[:len(recs)], rows[len(recs):], [r.get("kind", "?") for r in recs]
        if split != "train":
            pairs[split + "_policy"] = sampled(split, cfg.eval_policy_samples)
    if not pairs["test_policy"][0]:
        raise UserError("the SFT policy sampled no wrong answer on the test split: no RM eval")
    if cfg.policy_samples:
        own = sampled("train", cfg.policy_samples, slice(rank, None, world))
        pairs["train"] = tuple(a + b for a, b in zip(pairs["train"], own))
    return pairs


def main(cfg):
    dev, rank, world = start(cfg, positive=("batch_size", "log_interval",
                                            "temperature", "max_new_tokens", "eval_policy_samples"),
                             non_negative=("policy_samples",))
    ckpt = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
    model, tok = model_from_checkpoint(ckpt, cfg.sft_ckpt, scalar_head=True)  # + a fresh head
    model.to(dev)
    task, reverse = ckpt_settings(ckpt, cfg.sft_ckpt, "task", "reverse")
    if env_of(task):  # the pairs files hold answers, not episodes
        raise UserError(f"a reward model scores direct answers; task {task!r} plays episodes")
    t0 = time.time()
    pairs = load_pairs(cfg, model, tok, task, reverse, rank, world)
    chosen, rejected, kinds = pairs["train"]
    if rank == 0:
        sizes = ", ".join(f"{len(p[0])} {k}" for k, p in pairs.items())
        print(f"{sizes} pairs ({kinds.count('policy')} of train's from policy samples; "
              f"{time.time() - t0:.0f}s)", flush=True)

    return train(cfg, model, tok, pairs, {**asdict(cfg), "task": task, "reverse": reverse}, rank,
                 world)  # the config: what rl.py reads (ckpt_settings)


def train(cfg, model, tok, pairs, run_config, rank, world):
    """The loop: batch_size pairs a step (this rank's share), the Bradley-Terry loss plus
    lm_coef times the right answers' NLL; val pair accuracy on rank 0 (its mean over both kinds
    of pairs picks best.pt), test's per kind too at each full eval."""
    chosen, rejected, _ = pairs["train"]
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    state = loop.resume(cfg, model, opt, tok, rank == 0, run_config)[0] if cfg.resume \
        else loop.State()
    with loop.Clock(cfg, state, rank) as clock:
        while True:
            now = clock.tick()
            if now.evaluate and rank == 0:
                m = {**run_eval(cfg, model, tok, pairs, "val"),
                     **(run_eval(cfg, model, tok, pairs, "test") if now.full else {})}
                if clock.new_best(clock.log_eval(m), "val/mean_pair_accuracy"):
                    loop.save(cfg, "best.pt", model, opt, run_config, state, tok)
            if now.save:
                loop.save(cfg, "ckpt.pt", model, opt, run_config, state, tok)
            if now.stop:
                break
            with clock.step():  # this rank's share of batch_size pairs
                model.train()
                opt.zero_grad()
                dropout = seeded("cpu", "dropout", cfg.seed, rank, state.step)
                torch.manual_seed(dropout.initial_seed())
                B = cfg.batch_size // world
                idx = torch.randint(len(chosen), (B,), generator=seeded(
                    "cpu", "batch", cfg.seed, rank, state.step)).tolist()
                rows = [chosen[i] for i in idx] + [rejected[i] for i in idx]
                s, logp, mask = scores(model, rows, tok.pad_id, cfg.lik_coef)  # (2B,), (2B, T-1) x2
                bt, bt_stats = bt_loss(s[:B], s[B:])  # this rank's mean; / world: the batch's
                nll, _ = nll_loss(logp[:B], mask[:B], all_reduce(mask[:B].sum()).item())
                loss = bt / world + cfg.lm_coef * nll  # the NLL over every rank's right answers
                loss.backward()
                stats, _ = loop.supervised_update(cfg, model, opt, state, {
                    "train/loss": loss.detach(),
                    "train/pair_accuracy": bt_stats["pair_accuracy"] / world,
                    "train/margin": bt_stats["margin"] / world, "train/nll": nll.detach()},
                    mask.numel())
            if state.step % cfg.log_interval == 0 or state.step == 1:
                clock.log(stats, " ".join(f"{k[6:]} {v:.4g}" for k, v in stats.items()))
    return state.last_eval


def run_eval(cfg, model, tok, pairs, split):
    """test: the pair accuracy of each kind and of the policy's own; val: the mean of both."""
    def acc(name):
        return pair_accuracy(model, pairs[name], tok.pad_id, cfg.lik_coef)
    if split == "test":
        return {**{f"eval/pair_accuracy{k}": v for k, v in acc("test").items()},
                "eval/policy_pair_accuracy": acc("test_policy")[""]}
    m = {"val/pair_accuracy": acc("val")[""]}
    if pairs["val_policy"][0]:  # none if the policy never erred on val
        m["val/policy_pair_accuracy"] = acc("val_policy")[""]
    return {**m, "val/mean_pair_accuracy": sum(m.values()) / len(m)}


if __name__ == "__main__":
    run_cli(main, Config)
