"""
The policy around rl.py's loop: load it from the SFT checkpoint, step its optimizer (DDP gradient
sum, NaN check, clip), evaluate it (held-out accuracy, pass@k, KL to the reference) and resume it.
"""
import torch

import losses as L
from checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint, restore
from config import UserError
from ddp import sync_grads
from evaluate import encode_prompts, evaluate, responses
from logger import nonfinite
from model import generate, response_forward
from tokenizer import CharTokenizer


def load_policy(cfg, dev):
    """The SFT checkpoint -> (model, tok, task, reverse, verifier name, n_train: how many train
    problems its labels came from, 0 = all), in eval mode (no dropout in any log-prob). PPO's critic
    is a value head on the policy's own trunk (one forward gives logits and values), zero at the
    start, not noise."""
    ckpt = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
    ppo = cfg.loss == "ppo"
    model, tok = model_from_checkpoint(ckpt, cfg.sft_ckpt, scalar_head=True if ppo else None)
    if ppo and not ckpt["model_args"].get("scalar_head"):
        torch.nn.init.zeros_(model.score_head.weight)
    task, reverse, vname = ckpt_settings(ckpt, cfg.sft_ckpt, "task", "reverse", "verifier")
    if cfg.loss == "cliff" and (vname != "exact" or not isinstance(tok, CharTokenizer)):
        raise UserError(f"cliff finds the first wrong token against the gold answer's tokens, which only "
                        f"the exact verifier with the char tokenizer makes unique; this checkpoint has "
                        f"verifier {vname!r} and a {type(tok).__name__}")
    return model.to(dev).eval(), tok, task, reverse, vname, ckpt["config"].get("n_train", 0)


def load_teacher(path, tok, dev):
    """A frozen nanorl checkpoint to distil (opd, gkd), which must share the policy's tokenizer."""
    teacher, ttok = model_from_checkpoint(load_checkpoint(path, hint="train one with sft.py"), path)
    if ttok.to_dict() != tok.to_dict():
        raise UserError(f"{path}: the teacher's tokenizer differs from the policy's; distillation compares "
                        "their next-token distributions token by token")
    return teacher.to(dev).eval().requires_grad_(False)


def optimizer_step(model, opt, loss, lr, grad_clip, backward=True):
    """Backward (unless the caller accumulated the gradients; loss is then their total), sum the
    gradients over DDP ranks, refuse a NaN/inf (FloatingPointError naming the tensor), clip, step
    at lr (times a param group's lr_scale). Returns the gradient norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if backward:
        opt.zero_grad()
        loss.backward()
    sync_grads(model)  # each rank's loss divides by the global counts: the sum is the batch's gradient
    gnorm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    if not (torch.isfinite(loss) and torch.isfinite(gnorm)):  # a finite norm: every gradient is finite
        raise FloatingPointError(nonfinite(loss, model))
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), grad_clip, gnorm)
    opt.step()
    return gnorm


@torch.no_grad()
def eval_kl(model, ref, tok, problems, reverse, cfg, gen, n=256):
    """KL(policy || ref) (k3, mean over answer tokens) on 4 fresh samples for n test prompts, and on
    the same samples the mean response length (tokens incl. EOS) and the fraction truncated."""
    idx = torch.randperm(len(problems), generator=gen, device=gen.device)[:n].tolist()
    prompts = encode_prompts(tok, [problems[i][0] for i in idx], reverse)
    k = max(1, cfg.sample_batch_size // 4)
    kl, lengths, finished = 0.0, [], []
    for i in range(0, len(prompts), k):  # k prompts x 4 samples at a time: memory
        out = generate(model, prompts[i:i + k], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=4,
                       temperature=cfg.temperature, generator=gen)
        P, mask = out["prompt_len"], out["response_mask"][:, out["prompt_len"]:]  # mask (n, L)
        ref_lp = L.token_logps(response_forward(ref, out["ids"], out["offsets"], P), out["ids"][:, P:],
                               mask, cfg.temperature)  # (n, L)
        kl += L.masked_sum(L.kl_estimate(out["logps"], ref_lp, "k3"), mask).item()
        resp = responses(out)
        lengths += [len(r) for r in resp]
        finished += [r[-1:] == [tok.eos_id] for r in resp]
    return {"eval/kl": kl / max(1, sum(lengths)), "eval/resp_len": sum(lengths) / len(lengths),
            "eval/truncated_frac": 1 - sum(finished) / len(finished)}


def evaluate_policy(model, ref, tok, val, test, reverse, cfg, verifier, gen):
    """Greedy accuracy on test and val, pass@1 / pass@k on eval_samples samples, KL to the reference
    -> (metrics, a few examples)."""
    kw = dict(verifier=verifier, batch_size=cfg.sample_batch_size)
    m, examples = evaluate(model, tok, test, reverse, cfg.max_new_tokens, n_samples=cfg.eval_samples,
                           temperature=cfg.temperature, generator=gen, **kw)
    m.update(evaluate(model, tok, val, reverse, cfg.max_new_tokens, prefix="val", **kw)[0])
    return {**m, **eval_kl(model, ref, tok, test, reverse, cfg, gen)}, examples


def resume(path, cfg, model, opt, world, master):
    """Load the weights and optimizer of an rl.py ckpt.pt of the same loss, model, number of ranks and
    staleness (0 before it existed) -> the checkpoint (its run state, each rank's sampler and queue)."""
    ck = load_checkpoint(path, hint="nothing to resume; drop --resume")
    loss, ranks, k = ck["config"].get("loss"), len(ck.get("ranks", [])), ck["config"].get("staleness", 0)
    if loss != cfg.loss or ck["model_args"] != model.config.__dict__ or ranks != world or k != cfg.staleness:
        raise UserError(f"{path}: cannot resume, it is not a {cfg.loss} run of this model on {world} rank(s) "
                        f"at staleness {cfg.staleness} (loss {loss!r}, {ranks} rank(s), staleness {k}, "
                        f"model {ck['model_args']})")
    restore(path, ck, model, opt, master)
    return ck
