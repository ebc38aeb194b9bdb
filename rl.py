"""
Reinforcement learning from the SFT checkpoint: any loss of losses.ALGOS.

    python rl.py --loss=grpo          # or dapo, dr_grpo, gspo, sapo, cispo, gapo, pnpo, cliff, reinforce, rloo, ppo
    python rl.py --loss=dapo --lr=1e-4 --group_size=8 --max_iters=50
    python rl.py --loss=ppo --reward=rm   # PPO against a reward_model.py checkpoint (RLHF)
    python rl.py --loss=dpo           # or ipo, kto: preference optimisation; --pairs=online samples them
    python rl.py --loss=sft --max_seconds=120   # baselines: continued SFT, or rft (rejection-sampling FT)

One step: pick train prompts -> G samples each with the KV-cache sampler -> rewards (binary exact
match from verify.py, or `--reward=rm` a reward model's score) -> advantages (the loss's kind; PPO:
GAE on its value head) -> reference log-probs (only when a KL term needs them) -> `ppo_epochs` x
`minibatches` clipped updates. Dynamic sampling (on by default) drops groups whose answers are all
right or all wrong (`--reward=rm`: whose scores are equal) and refills the batch with new prompts.
The sampler's log-probs are the old log-probs (same tempered distribution, dropout off), so nothing
is recomputed; `rl/logp_mismatch` checks that the trainer agrees at the first update. The reference,
value and update forwards run each prompt once for its G rows (model.response_forward), and the
sampler and every forward take `micro_batch_size` rows at a time (gradients accumulate): memory.
Held-out eval (test greedy accuracy, pass@1, pass@8; val accuracy picks best.pt) at step 0, every
`eval_interval` and at the end, with KL to the reference on fresh samples for every loss.
Writes out_dir/{ckpt.pt,best.pt,metrics.jsonl}.

Preference losses (dpo, ipo, kto) take the same eval, checkpoint and logging path. `--pairs=offline`
reads data/<task>/pairs_train.jsonl (kto: kto_train.jsonl), pairs_per_step pairs (kto: 2x that
many labelled answers) per step; `--pairs=online` samples G answers per train prompt from the
current policy and pairs a verified-correct with a verified-wrong one (prompts without both are
dropped, counted in rl/zero_std_frac, and refilled like dynamic sampling).

Supervised baselines (losses.BASELINES), same eval/checkpoint/logging path, so compare.py can ask
whether RL beats them: `--loss=sft` continues SFT on the gold answers of pairs_per_step train
problems per step; `--loss=rft` (rejection-sampling fine-tuning) samples G answers per prompt like
the RL losses and trains on the verified-correct ones (all-correct groups are kept). Both minimise
the per-token NLL at temperature 1. `--max_seconds` stops after the step at which training time
(evals excluded) passes it, then evaluates; `--eval_seconds` adds an eval each time training time
passes another eval_seconds (for time-budgeted runs).
"""
import copy
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Optional

import torch

import losses as L
from config import UserError, print_config, run_cli
from ddp import all_reduce, gather_objects, init_distributed, mean_over_ranks, resolve_device, sync_grads, world_size
from evaluate import encode_prompts, evaluate, gold_rows, grade, pack, pass_k_name, record_rows, responses, verifier_of
from logger import Logger, StopFlag, fmt_time, nonfinite, truncate_metrics
from data.tasks import ensure_data, load_records, load_split
from checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint, save_checkpoint, unwrap
from model import generate, response_forward, rm_scores
from tokenizer import CharTokenizer
from verify import exact_answer, first_wrong_token, overlong_penalty

# The progress line shows those of these rl/ keys that the step logged
SHOWN = ("loss", "reward_mean", "rm_reward", "accuracy", "margin", "pair_accuracy", "z", "log_ratio", "n_groups", "n_seqs",
         "zero_std_frac", "entropy", "resp_len", "logp_mismatch", "explained_variance", "value_loss")


@dataclass
class Config:
    loss: str = "grpo"  # a name in losses.ALGOS: policy gradient, preference (dpo, ipo, kto) or sft, rft
    pairs: str = "offline"  # preference losses: "offline" (data/ files) or "online" (from policy samples)
    pairs_per_step: int = 256  # offline preference losses: pairs per step (kto: 2x as many labelled answers); sft: problems
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    reward: str = "verifier"  # "verifier" (binary exact match) or "rm" (a reward_model.py checkpoint)
    rm_ckpt: str = "out/rm-mul/ckpt.pt"
    rm_normalize: bool = True  # RM scores -> (s - running mean) / running std
    out_dir: str = ""  # "" = out/rl-<loss>
    seed: int = 1337
    max_iters: int = 300  # ~5 min on 2 CPU cores
    max_seconds: float = 0  # > 0: stop after the step at which training time (evals excluded) passes this
    eval_interval: int = 25
    ckpt_interval: int = 25  # ckpt.pt every this many steps (and at every eval, and on SIGINT/SIGTERM)
    resume: bool = False  # continue exactly (weights, optimizer, step, prompt order, RNGs) from out_dir/ckpt.pt
    eval_seconds: float = 0  # > 0: also evaluate each time training time passes another eval_seconds
    # rollouts
    prompts_per_step: int = 64
    group_size: int = 16  # G samples per prompt
    temperature: float = 1.0  # sampling temperature; the loss sees the same tempered distribution
    max_new_tokens: int = 8
    dynamic_sampling: bool = True  # DAPO's: drop all-equal groups (no signal), refill with new prompts
    max_refills: int = 4  # extra rollout rounds per step to refill dropped groups
    overlong_window: Optional[int] = None  # DAPO overlong shaping window in tokens, 0 = off; None = the loss's
    prompt_selection: bool = True  # skip (once) prompts whose group was all-right or all-wrong last visit
    # optimisation
    lr: float = 2e-4
    warmup_iters: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 64  # rows per forward/backward and per sampler call (whole groups): memory, not the math
    # loss hyperparameters: None = the loss's own default (losses.ALGOS), printed and logged
    beta: Optional[float] = None
    eps_low: Optional[float] = None
    eps_high: Optional[float] = None
    kl_estimator: Optional[str] = None
    clip_c: Optional[float] = None  # dual-clip bound (clipped losses; off by default)
    vf_coef: Optional[float] = None  # ppo: value-loss weight
    vf_clip: Optional[float] = None  # ppo: value clipping range, 0 = off
    ent_coef: Optional[float] = None  # ppo: entropy bonus
    kl_target: Optional[float] = None  # ppo: adaptive KL controller target (per-token k1); unset = fixed beta
    vf_lr_mult: Optional[float] = None  # ppo: the value head's lr = lr * vf_lr_mult
    gamma: Optional[float] = None  # ppo: GAE discount
    lam: Optional[float] = None  # ppo: GAE lambda
    label_smoothing: Optional[float] = None  # dpo (conservative DPO)
    rpo_alpha: Optional[float] = None  # dpo/ipo/kto: weight of the chosen (kto: desirable) answers' NLL (RPO)
    lambda_d: Optional[float] = None  # kto: weight of desirable answers
    lambda_u: Optional[float] = None  # kto: weight of undesirable answers
    # eval / io
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8
    threads: int = 0
    device: str = "auto"  # auto = cuda > mps > cpu
    bf16: Optional[bool] = None  # bf16 autocast of rollouts and updates (log-softmax stays fp32); None = on CUDA
    compile: bool = False  # torch.compile the training forward (checkpoints hold the plain model)
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment (compare.py sets it)


def check_config(cfg):
    """Reject bad values before any work starts."""
    if cfg.loss not in L.ALGOS:
        raise UserError(f"unknown loss {cfg.loss!r}; valid: {', '.join(sorted(L.LOSSES))} "
                        f"(preference: {', '.join(sorted(L.PREF_LOSSES))}; baselines: {', '.join(sorted(L.BASELINES))})")
    if cfg.reward not in ("verifier", "rm"):
        raise UserError(f"reward must be 'verifier' or 'rm', got {cfg.reward!r}")
    family = L.ALGOS[cfg.loss].family  # pg, pref or sft
    if cfg.reward == "rm" and (family != "pg" or cfg.loss in ("cliff", "gapo")):
        raise UserError(f"--reward=rm gives real-valued rewards; {cfg.loss} needs the binary verifier")
    if cfg.pairs not in ("offline", "online"):
        raise UserError(f"pairs must be 'offline' or 'online', got {cfg.pairs!r}")
    if cfg.lr <= 0 or cfg.max_iters < 0 or cfg.max_new_tokens < 1 or cfg.prompts_per_step < 1:
        raise UserError("lr must be > 0, max_iters >= 0, max_new_tokens >= 1, prompts_per_step >= 1")
    for k in ("eval_interval", "ckpt_interval", "pairs_per_step", "ppo_epochs", "minibatches"):
        if getattr(cfg, k) < 1:
            raise UserError(f"{k} must be >= 1, got {getattr(cfg, k)}")
    if cfg.warmup_iters < 0 or cfg.weight_decay < 0 or cfg.grad_clip <= 0 or cfg.max_refills < 0 or cfg.eval_samples < 0:
        raise UserError("warmup_iters, weight_decay, max_refills and eval_samples must be >= 0, grad_clip > 0")
    if cfg.max_seconds < 0 or cfg.eval_seconds < 0:
        raise UserError("max_seconds and eval_seconds must be >= 0 (0 = off)")
    if cfg.group_size < 2:
        raise UserError(f"group_size must be >= 2 for group-relative advantages, got {cfg.group_size}")
    if cfg.temperature <= 0:
        raise UserError(f"temperature must be > 0 for sampled rollouts, got {cfg.temperature}")
    for k in ("eps_low", "eps_high", "beta"):
        if getattr(cfg, k) is not None and getattr(cfg, k) < 0:
            raise UserError(f"{k} must be >= 0, got {getattr(cfg, k)}")
    if cfg.clip_c is not None and cfg.clip_c <= 1:  # c = 0.5 at r = 1, A = -1 would turn PPO's -1 into -0.5
        raise UserError(f"clip_c must be > 1 (dual clip bounds the objective below at clip_c*A for A < 0; "
                        f"3 is usual), or unset (off); got {cfg.clip_c}")
    if (family != "pg" or cfg.loss in ("reinforce", "rloo")) and (cfg.ppo_epochs > 1 or cfg.minibatches > 1):
        why = ("later steps would be off-policy with no importance weight" if cfg.loss in ("reinforce", "rloo")
               else "its update has no epochs or minibatches")
        raise UserError(f"{cfg.loss} takes one optimizer step per batch ({why}): "
                        "ppo_epochs and minibatches must be 1")


def overlong_window(cfg):
    return cfg.overlong_window if cfg.overlong_window is not None else L.ALGOS[cfg.loss].overlong


class PromptSampler:
    """Epochs over the train prompts in a seeded order. With selection on, a prompt whose group was
    all-correct or all-wrong at its last visit is skipped once (and forgotten, so it comes back)."""

    def __init__(self, n, gen, selection):
        self.n, self.gen, self.selection = n, gen, selection
        self.order, self.pos, self.saturated = [], 0, set()

    def take(self, k):
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order, self.pos = torch.randperm(self.n, generator=self.gen).tolist(), 0
            i = self.order[self.pos]
            self.pos += 1
            if self.selection and i in self.saturated:
                self.saturated.discard(i)
                continue
            out.append(i)
        return out

    def record(self, idx, group_rewards):
        for i, r in zip(idx, group_rewards.tolist()):
            if min(r) == max(r):
                self.saturated.add(i)

    def state_dict(self):
        return {"order": self.order, "pos": self.pos, "saturated": sorted(self.saturated), "gen": self.gen.get_state()}

    def load_state_dict(self, s):
        self.order, self.pos, self.saturated = s["order"], s["pos"], set(s["saturated"])
        self.gen.set_state(s["gen"])


class RewardModel:
    """A frozen reward_model.py checkpoint that scores rollouts (reward_model.rm_scores: the head at the
    last token, the EOS of a finished answer, plus lik_coef times the answer's log-likelihood under the
    RM's LM head, lik_coef as the RM was trained), and the running mean and std of every score so far
    (parallel-variance update) that normalise them."""

    def __init__(self, model, lik_coef):
        self.model, self.lik_coef = model.eval().requires_grad_(False), lik_coef
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    @classmethod
    def load(cls, path, tok, dev):
        ckpt = load_checkpoint(path, hint="make one with: python reward_model.py configs/mul_rm.py")
        if not ckpt["model_args"].get("scalar_head"):
            raise UserError(f"{path}: not a reward model (no scalar head); make one with reward_model.py")
        model, rm_tok = model_from_checkpoint(ckpt, path)
        if rm_tok.to_dict() != tok.to_dict():
            raise UserError(f"{path}: the reward model's tokenizer differs from the policy's")
        return cls(model.to(dev), *ckpt_settings(ckpt, path, "lik_coef"))

    @torch.no_grad()
    def __call__(self, out, rows=128):
        """(N,) raw score of each response of a rollout, rows at a time (memory)."""
        ids, mask, offsets = out["ids"], out["response_mask"], out["offsets"]
        return torch.cat([rm_scores(self.model, ids[i:i + rows], mask[i:i + rows], offsets[i:i + rows],
                                    self.lik_coef)[0] for i in range(0, ids.size(0), rows)])

    def update(self, x):
        n, mean = x.numel(), x.mean().item()
        delta, total = mean - self.mean, self.n + n
        self.m2 += ((x - mean) ** 2).sum().item() + delta ** 2 * self.n * n / total
        self.mean, self.n = self.mean + delta * n / total, total

    def normalize(self, x):
        return (x - self.mean) / (math.sqrt(self.m2 / max(1, self.n - 1)) + 1e-8)


def rollout(model, tok, problems, idx, cfg, gen, reverse, rm=None, verifier=None):
    """G samples for each problem in idx -> dict of tensors, rewards and per-row facts. `correct` is
    the task's verifier (default exact_answer); with rm (a RewardModel) the reward is the RM's
    (normalised) score instead."""
    rows = gold_rows(tok, [problems[i] for i in idx], reverse)  # [(prompt ids, gold answer ids + EOS)]
    prompts = [p for p, _ in rows]
    n = max(1, cfg.micro_batch_size // cfg.group_size)  # prompts per generate call: memory, one prefill each
    out = cat_rollouts([generate(model, prompts[i:i + n], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=cfg.group_size,
                                 temperature=cfg.temperature, generator=gen) for i in range(0, len(prompts), n)])
    window = overlong_window(cfg)
    correct, reward, first_wrong, lengths, finished = [], [], [], [], []
    for row, ids in enumerate(responses(out)):
        gold = problems[idx[row // cfg.group_size]][1]
        done = len(ids) > 0 and ids[-1] == tok.eos_id
        c = grade(tok, ids, gold, reverse, verifier or exact_answer)  # truncated -> 0
        correct.append(c)
        reward.append(c + (overlong_penalty(len(ids), cfg.max_new_tokens, window) if window > 0 else 0.0))
        fw = first_wrong_token(ids, rows[row // cfg.group_size][1])
        first_wrong.append(-1 if fw is None else fw)
        lengths.append(len(ids))
        finished.append(done)
    dev = out["ids"].device
    out.update(correct=torch.tensor(correct, device=dev), reward=torch.tensor(reward, device=dev),
               first_wrong=torch.tensor(first_wrong, device=dev), length=torch.tensor(lengths, dtype=torch.float, device=dev),
               finished=torch.tensor(finished, device=dev))
    if rm is not None:
        raw = rm(out)  # (N,)
        if cfg.rm_normalize:
            rm.update(raw)
        score = rm.normalize(raw) if cfg.rm_normalize else raw
        out.update(rm_reward=raw, reward=score + out["reward"] - out["correct"])  # keeps any overlong shaping
    return out


def cat_rollouts(parts):
    """Concatenate rollouts whose prompts may differ in padded length (left-pad to the longest)."""
    if len(parts) == 1:
        return parts[0]
    P = max(p["prompt_len"] for p in parts)
    Lr = max(p["ids"].size(1) - p["prompt_len"] for p in parts)
    ids, rmask, logps, offsets = [], [], [], []
    for p in parts:
        left, right = P - p["prompt_len"], Lr - (p["ids"].size(1) - p["prompt_len"])
        ids.append(torch.nn.functional.pad(p["ids"], (left, right), value=0))
        rmask.append(torch.nn.functional.pad(p["response_mask"], (left, right)))
        logps.append(torch.nn.functional.pad(p["logps"], (0, right)))
        offsets.append(p["offsets"] + left)
    out = {k: torch.cat([p[k] for p in parts]) for k in ("correct", "reward", "first_wrong", "length", "finished", "rm_reward")
           if k in parts[0]}
    out.update(ids=torch.cat(ids), response_mask=torch.cat(rmask), logps=torch.cat(logps),
               offsets=torch.cat(offsets), prompt_len=P)
    return out


def select_groups(out, keep, G):
    """Keep whole groups (bool (n_groups,)) of a rollout dict."""
    rows = keep.repeat_interleave(G)
    return {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in out.items()}


def advantages(cfg, batch, hp, ref_logp):
    """(N,) or (N, L) advantages for the loss, plus extra keyword inputs some losses need."""
    G = cfg.group_size
    R = batch["reward"]  # (N,)
    kind = L.ALGOS[cfg.loss].advantage
    if kind == "gae":  # PPO as InstructGPT: token rewards -beta*k1 + score at the last token, GAE, whitened
        mask = batch["response_mask"][:, batch["prompt_len"]:]
        lp = batch["logps"]
        rewards = L.kl_in_reward(R, lp, ref_logp if hp["beta"] else lp, mask, hp["beta"])  # (N, L)
        adv, returns = L.gae(rewards, batch["values"], mask, hp["gamma"], hp["lam"])  # (N, L) each
        n, s, s2 = all_reduce([mask.sum(), L.masked_sum(adv, mask), L.masked_sum(adv * adv, mask)]).tolist()
        mean = s / n  # over every rank's tokens, so DDP whitens as one process would
        adv = L.whiten(adv, mask, mean, s2 / n - mean * mean)
        return adv, dict(old_values=batch["values"], returns=returns)
    if cfg.loss in ("reinforce", "rloo") and hp["beta"] > 0:  # KL in the reward: R - beta * sum_t k1
        mask = batch["response_mask"][:, batch["prompt_len"]:]
        R = L.kl_in_reward(R, batch["logps"], ref_logp, mask, hp["beta"]).sum(1)
    R = R.view(-1, G)  # (n_groups, G)
    extra = {}
    if kind == "cliff":
        mask = batch["response_mask"][:, batch["prompt_len"]:].view(R.size(0), G, -1)
        adv = L.cliff_advantages(R, batch["first_wrong"].view(-1, G), mask).flatten(0, 1)  # (N, L)
    else:
        adv = L.group_advantages(R, kind).flatten()  # (N,)
    if cfg.loss == "gapo":
        extra = dict(group_correct=batch["correct"].view(-1, G).sum(1).repeat_interleave(G), group_size=G)
    return adv, extra


def policy_logps(model, ids, offsets, full_mask, P, temperature, values=False, G=1):
    """Trainer-side log-probs of the response tokens (N, L), the logits that score them (N, L, V), and
    with values=True PPO's values at the same positions (N, L): V_t for the state before token t,
        V_t = head(h_t) * pi(y_<t | x)   (the policy's probability of the tokens sampled so far, detached)
    An exact-match return is 0 once a token is wrong, and how likely the policy found the path it took
    is the best predictor of that we measured: a linear head on h_t alone explains 15% of the returns'
    variance on unseen prompts, times pi(y_<t | x) 34% (bench/value_probe.py).
    G > 1: rows come in groups of G sharing a prompt (a rollout), and each prompt runs once."""
    out = response_forward(model, ids, offsets, P, G, return_scalar=values)
    logits, v = out if values else (out, None)
    logp = L.token_logps(logits, ids[:, P:], full_mask[:, P:], temperature)  # (N, L)
    if values:
        v = v * L.prefix_prob(logp.detach())
    return logp, logits, v


def collect(model, tok, train, prompts, cfg, gen, reverse, dyn, rm=None, verifier=None):
    """Rollouts for one step: P prompts x G samples; dynamic sampling drops the groups with no
    signal and refills (up to max_refills more rounds): with the verifier, groups whose answers are
    all right or all wrong (DAPO keeps 0 < accuracy < 1, as verl's recipe; the overlong shaping of an
    all-wrong group may still differ), with a reward model, groups of equal scores.
    Returns (batch or None, stats)."""
    parts, n_groups, n_sampled, n_zero_std = [], 0, 0, 0
    for _ in range(1 + (cfg.max_refills if dyn else 0)):
        idx = prompts.take(cfg.prompts_per_step - n_groups)
        out = rollout(model, tok, train, idx, cfg, gen, reverse, rm, verifier)
        R = (out["correct"] if rm is None else out["reward"]).view(-1, cfg.group_size)  # (groups, G)
        prompts.record(idx, out["correct"].view(-1, cfg.group_size))
        zero_std = R.max(1).values == R.min(1).values  # (groups,) no signal
        n_sampled, n_zero_std = n_sampled + len(idx), n_zero_std + int(zero_std.sum())
        if dyn:
            out = select_groups(out, ~zero_std, cfg.group_size)
        if out["ids"].size(0):
            parts.append(out)
            n_groups += out["ids"].size(0) // cfg.group_size
        if not dyn or n_groups >= cfg.prompts_per_step:
            break
    stats = {"rl/zero_std_frac": n_zero_std / n_sampled, "rl/n_groups": n_groups}
    return (cat_rollouts(parts) if parts else None), stats


@torch.no_grad()
def frozen_logps(model, ids, offsets, full_mask, P, temperature, G, rows, values=False):
    """policy_logps without gradient in chunks of `rows` rows (whole groups of G), concatenated:
    the same numbers in a fraction of the memory -> (logp (N, L), values (N, L) or None)."""
    parts = [policy_logps(model, ids[i:i + rows], offsets[i:i + rows], full_mask[i:i + rows], P, temperature, values, G)
             for i in range(0, ids.size(0), rows)]
    return torch.cat([p[0] for p in parts]), (torch.cat([p[2] for p in parts]) if values else None)


def update(model, ref, opt, batch, cfg, hp, gen, lr):
    """Exactly ppo_epochs x minibatches optimizer steps on one rollout batch, each normalised by its
    minibatch's token/sequence counts summed over DDP ranks (whatever share of the groups each holds),
    its gradient accumulated over micro-batches of whole groups (each prompt runs once) and summed over
    ranks: one process's step on all the groups. Raises FloatingPointError on a NaN/inf."""
    raw, world = unwrap(model), world_size()
    ids, offsets, full_mask, P = batch["ids"], batch["offsets"], batch["response_mask"], batch["prompt_len"]
    mask = full_mask[:, P:].float()  # (N, L) response tokens incl. EOS
    old_logp = batch["logps"]  # (N, L) sampler log-probs = old policy, nothing recomputed
    G = cfg.group_size
    rows = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    ref_logp = None
    if hp.get("beta"):  # the reference runs only when the loss has a KL term
        ref_logp = frozen_logps(ref, ids, offsets, full_mask, P, cfg.temperature, G, rows)[0]
    ppo = cfg.loss == "ppo"
    if ppo:  # the rollout's values V_old, from the same forward pass shape as the update's
        batch["values"] = torch.where(mask.bool(), frozen_logps(raw, ids, offsets, full_mask, P, cfg.temperature, G, rows, True)[1], 0.0)
    adv, extra = advantages(cfg, batch, hp, ref_logp)
    N, stats, steps = ids.size(0), {}, []  # steps: each optimizer step's loss stats, averaged for the log

    def loss_of(r, lp, values, entropy, n_tokens, n_seqs):
        kw = {k: (v[r] if torch.is_tensor(v) else v) for k, v in extra.items()}
        if ppo:
            kw.update(values=values, **({"entropy": entropy} if hp["ent_coef"] else {}))
        return L.LOSSES[cfg.loss](lp, old_logp[r], adv[r], mask[r], ref_logp[r] if ref_logp is not None else None,
                                  n_tokens=n_tokens, n_seqs=n_seqs, **hp, **kw)

    fewest = -int(all_reduce(-N, "max").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} rows this step "
                        f"(dynamic sampling kept few groups): lower --minibatches")
    g = G if cfg.minibatches == 1 else 1  # a shuffled minibatch holds no whole groups
    for epoch in range(cfg.ppo_epochs):
        perm = torch.randperm(N, generator=gen, device=gen.device) if cfg.minibatches > 1 else torch.arange(N)
        for mb in perm.tensor_split(cfg.minibatches):  # exactly minibatches parts (chunk may give fewer)
            n_tokens, n_seqs = all_reduce([mask[mb].sum().item(), float(len(mb))]).tolist()  # every rank's counts
            n_tokens, first, kept, total = max(n_tokens, 1.0), not stats, [], 0.0
            opt.zero_grad()
            for ub in mb.split(rows):  # gradient accumulation; the loss divides by the minibatch's counts
                lp, logits, values = policy_logps(model, ids[ub], offsets[ub], full_mask[ub], P, cfg.temperature, ppo, g)
                with torch.set_grad_enabled(bool(ppo and hp["ent_coef"])):  # a gradient only for PPO's entropy bonus
                    ent = L.token_entropy(logits, cfg.temperature) if first or (ppo and hp["ent_coef"]) else None
                loss, st = loss_of(ub, lp, values, ent, n_tokens, n_seqs)
                loss.backward()
                total += loss.detach()
                kept.append([t.detach() if t is not None else None for t in (lp, values, ent)])
            lp, values, ent = (torch.cat(ts) if ts[0] is not None else None for ts in zip(*kept))
            if first:  # first update of a fresh rollout: the ratio must be exactly 1
                stats["rl/logp_mismatch"] = (lp - old_logp[mb]).abs().max().item()  # both 0 off the mask
                stats["rl/entropy"] = L.masked_mean(ent, mask[mb]).item()
            if len(kept) > 1:  # the minibatch's diagnostics, as if it had run in one piece
                with torch.no_grad():
                    st = loss_of(mb, lp, values, ent, n_tokens, n_seqs)[1]
            gnorm = optimizer_step(raw, opt, total, lr, cfg.grad_clip, backward=False)
            steps.append({k: float(v) for k, v in st.items()})
    stats.update({f"rl/{k}": sum(s[k] for s in steps) / len(steps) for k in steps[0]})  # clip fractions etc.: every step's
    stats.update(rollout_stats(batch, ref_logp, extra.get("returns"), hp.get("beta")))
    return {**stats, "rl/loss": total.item() * world, "rl/grad_norm": gnorm.item(), "rl/lr": lr,
            "rl/n_tokens": mask.sum().item()}


def rollout_stats(batch, ref_logp=None, returns=None, beta=None):
    """A rollout's own diagnostics: reward, accuracy, lengths; KL to the reference when it ran; PPO's
    value fit (returns given); the RM score beside the verifier's accuracy (over-optimisation shows
    as a gap)."""
    mask, old_logp = batch["response_mask"][:, batch["prompt_len"]:], batch["logps"]  # (N, L) each
    stats = {"rl/reward_mean": batch["reward"].mean().item(), "rl/accuracy": batch["correct"].mean().item(),
             "rl/resp_len": batch["length"].mean().item(),
             "rl/empty_frac": (batch["length"] <= 1).float().mean().item(),
             "rl/truncated_frac": 1 - batch["finished"].float().mean().item()}
    if ref_logp is not None:
        stats["rl/kl"] = L.masked_mean(L.kl_estimate(old_logp, ref_logp, "k3"), mask).item()
    if returns is not None:
        v = batch["values"]
        kl_k1 = L.masked_mean(old_logp - ref_logp, mask).item() if ref_logp is not None else 0.0
        stats.update({"rl/explained_variance": L.explained_variance(v, returns, mask).item(), "rl/beta": beta,
                      "rl/values_mean": L.masked_mean(v, mask).item(), "rl/kl_k1": kl_k1,
                      "rl/returns_mean": L.masked_mean(returns, mask).item()})
    if "rm_reward" in batch:
        stats["rl/rm_reward"] = batch["rm_reward"].mean().item()
    return stats


# ----------------------------------------------------------------------------- preference losses

def seq_logps(model, rows, pad_id):
    """(N,) sum of the response tokens' log-probs of each (prompt ids, response ids) row."""
    dev = next(model.parameters()).device
    ids, mask = (t.to(dev) for t in pack(rows, pad_id))
    lp, m = L.response_logps(model(ids), ids, mask)
    return L.masked_sum(lp, m, dim=1)


def online_rows(batch, G):
    """One (correct, wrong) pair per group of a rollout whose groups all hold both -> chosen rows
    then rejected rows, as (prompt ids, sampled response ids incl. EOS)."""
    correct = batch["correct"].view(-1, G)  # (groups, G)
    chosen = [g * G + int(correct[g].argmax()) for g in range(correct.size(0))]
    rejected = [g * G + int(correct[g].argmin()) for g in range(correct.size(0))]
    return sample_rows(batch, chosen + rejected)


def sample_rows(batch, rows):
    """(prompt ids, sampled response ids incl. EOS) of the given rows of a rollout batch."""
    P, resp = batch["prompt_len"], responses(batch)
    return [(batch["ids"][r, int(batch["offsets"][r]):P].tolist(), resp[r]) for r in rows]


def pref_update(model, ref, opt, tok, rows, labels, cfg, hp, lr):
    """One optimizer step of DPO / IPO (rows: n chosen then n rejected) or KTO (rows with labels;
    the mismatched pairs for z put answer i+1 after prompt i). Raises FloatingPointError on NaN.
    Under DDP the batch mean is rescaled to a mean over every rank's rows (KTO's z stays per rank)."""
    raw = unwrap(model)
    with torch.no_grad():
        ref_lp = seq_logps(ref, rows, tok.pad_id)  # (N,) computed once, no grad
        if cfg.loss == "kto":
            mismatched = [(p, rows[(i + 1) % len(rows)][1]) for i, (p, _) in enumerate(rows)]
            pi_mis, ref_mis = seq_logps(raw, mismatched, tok.pad_id), seq_logps(ref, mismatched, tok.pad_id)
    pi = seq_logps(model, rows, tok.pad_id)  # (N,)
    length = torch.tensor([float(len(r)) for _, r in rows], device=pi.device)  # (N,) |y| for rpo_alpha's per-token NLL
    if cfg.loss == "kto":
        loss, st = L.PREF_LOSSES["kto"](pi, ref_lp, labels.to(pi.device), pi_mis, ref_mis, length=length, **hp)
    else:
        n = len(rows) // 2
        loss, st = L.PREF_LOSSES[cfg.loss](pi[:n], pi[n:], ref_lp[:n], ref_lp[n:], chosen_len=length[:n], **hp)
    n_all = all_reduce(float(len(rows))).item()  # rows on every rank: the batch mean over all of them
    gnorm = optimizer_step(raw, opt, loss * (len(rows) / n_all), lr, cfg.grad_clip)  # ranks' gradients summed
    log_ratio = (pi.detach() - ref_lp).mean().item()  # mean sequence log pi/ref of the batch's answers
    return {**{f"rl/{k}": float(v) for k, v in st.items()}, "rl/loss": loss.item(), "rl/grad_norm": gnorm.item(),
            "rl/lr": lr, "rl/log_ratio": log_ratio, "rl/n_seqs": len(rows)}


# ----------------------------------------------------------------------------- supervised baselines

def nll_update(model, opt, rows, cfg, lr, pad_id, batch=None):
    """One optimizer step of a supervised baseline (losses.BASELINES): the per-token NLL of the
    responses of rows [(prompt ids, response ids)] at temperature 1. batch: rft's rollout, for its
    reward stats. Raises FloatingPointError on NaN/inf."""
    dev = next(model.parameters()).device
    ids, mask = (t.to(dev) for t in pack(rows, pad_id))  # (N, T) each
    lp, m = L.response_logps(model(ids), ids, mask)  # (N, T-1) each
    loss, st = L.BASELINES[cfg.loss](lp, m, n_tokens=all_reduce(m.sum().item()).item())  # every rank's tokens
    gnorm = optimizer_step(unwrap(model), opt, loss, lr, cfg.grad_clip)
    stats = {**{f"rl/{k}": float(v) for k, v in st.items()}, "rl/loss": loss.item(), "rl/grad_norm": gnorm.item(),
             "rl/lr": lr, "rl/n_seqs": len(rows), "rl/n_tokens": m.sum().item()}
    return {**stats, **(rollout_stats(batch) if batch is not None else {})}


def main(cfg):
    check_config(cfg)
    out_dir = cfg.out_dir or f"out/rl-{cfg.loss}"
    dev = resolve_device(cfg.device)
    rank, world = init_distributed(dev)  # torchrun: each rank samples its own share of the prompts, groups whole
    master = rank == 0  # rank 0 alone evaluates, prints, saves and logs
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError(f"prompts_per_step={cfg.prompts_per_step} and pairs_per_step={cfg.pairs_per_step} must divide "
                        f"by the {world} ranks")
    local = replace(cfg, prompts_per_step=cfg.prompts_per_step // world, pairs_per_step=cfg.pairs_per_step // world)
    ckpt = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
    # PPO's critic is a value head on the policy's own trunk (one forward pass gives logits and values;
    # a separate critic would double the compute of every step at this scale); vf_coef keeps its
    # gradient small next to the policy's. Only --loss=ppo adds it and trains it.
    fresh_head = cfg.loss == "ppo" and not ckpt.get("model_args", {}).get("scalar_head")
    model, tok = model_from_checkpoint(ckpt, cfg.sft_ckpt, scalar_head=True if cfg.loss == "ppo" else None)
    model.to(dev)
    if fresh_head:
        torch.nn.init.zeros_(model.score_head.weight)  # V = 0 everywhere at the start, not noise
    task, reverse, vname = ckpt_settings(ckpt, cfg.sft_ckpt, "task", "reverse", "verifier")  # vname: its reward
    task_verifier = verifier_of(vname)
    if cfg.loss == "cliff" and (vname != "exact" or not isinstance(tok, CharTokenizer)):
        raise UserError(f"cliff finds the first wrong token against the gold answer's tokens, which only "
                        f"the exact verifier with the char tokenizer makes unique; this checkpoint has "
                        f"verifier {vname!r} and a {type(tok).__name__}")
    verifier = None if vname == "exact" else task_verifier  # rollouts: None = exact_answer
    del ckpt  # its weights and SFT optimizer state (~10 MB at the default size) are not needed again
    knobs = {k for d in L.DEFAULTS.values() for k in d} & {f.name for f in fields(Config)} - {"max_new_tokens"}
    try:  # the loss hyperparameters (None: the loss's default); dr_grpo's normaliser is max_new_tokens
        hp = L.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in sorted(knobs)},
                               **({"max_new_tokens": cfg.max_new_tokens} if "max_new_tokens" in L.DEFAULTS[cfg.loss] else {}))
    except ValueError as e:
        raise UserError(str(e)) from None
    pref, base = L.ALGOS[cfg.loss].family == "pref", L.ALGOS[cfg.loss].family == "sft"
    dyn, window = cfg.dynamic_sampling, overlong_window(cfg)
    if (cfg.loss in ("cliff", "gapo") or pref) and window > 0:
        raise UserError(f"{cfg.loss} needs binary rewards: overlong shaping must be off (--overlong_window=0)")
    if master:
        print_config(cfg)
        print(f"resolved: loss={cfg.loss} {hp} dynamic_sampling={dyn} overlong_window={window} out_dir={out_dir} "
              f"ranks={world}", flush=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    root = ensure_data(task)
    train, val, test = (load_split(task, s) for s in ("train", "val", "test"))  # a text task's prompts in words
    if max(len(p) for p in encode_prompts(tok, [p for p, _ in train], reverse)) + cfg.max_new_tokens > model.config.block_size:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens} does not fit block_size={model.config.block_size}")

    rm = RewardModel.load(cfg.rm_ckpt, tok, dev) if cfg.reward == "rm" else None  # a frozen Bradley-Terry RM
    ref = copy.deepcopy(model).eval().requires_grad_(False)  # frozen reference, never updated
    model.eval()  # dropout off for every log-prob; there is no other train-mode layer
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (0.9, 0.99))
    if cfg.loss == "ppo":  # the value head starts at zero and must catch up with the returns: a larger lr
        head = {id(p) for p in model.score_head.parameters()}
        for g in opt.param_groups:
            g["params"] = [p for p in g["params"] if id(p) not in head]
        opt.add_param_group({"params": list(model.score_head.parameters()), "weight_decay": 0.0,
                             "lr_scale": hp["vf_lr_mult"]})
    seed = cfg.seed + 1000 * rank  # per-rank seeds; rank 0 of a DDP run samples like a single process
    gen = torch.Generator(dev).manual_seed(seed)  # rollouts
    eval_gen = torch.Generator(dev).manual_seed(cfg.seed + 1)
    shard = train[rank::world]  # this rank's train prompts
    prompts = PromptSampler(len(shard), torch.Generator().manual_seed(seed + 2), cfg.prompt_selection)
    if pref and cfg.pairs == "offline":
        kind = "kto" if cfg.loss == "kto" else "pairs"
        recs = load_records(root / f"{kind}_train.jsonl", kind)[rank::world]
        records = PromptSampler(len(recs), torch.Generator().manual_seed(seed + 2), selection=False)
    fwd = torch.compile(model) if cfg.compile else model  # under DDP, ddp.sync_grads sums the gradients
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.bf16 if cfg.bf16 is not None else dev.type == "cuda")
    ckpt_path, best, start, m0, m = os.path.join(out_dir, "ckpt.pt"), -1.0, 0, None, None
    t_train, next_eval_t = 0.0, cfg.eval_seconds  # training time so far (evals excluded); next timed eval
    if cfg.resume:  # every piece of state that the next step reads comes back from ckpt.pt
        ck = load_checkpoint(ckpt_path, hint="nothing to resume; drop --resume")
        if ck["config"].get("loss") != cfg.loss or ck["model_args"] != asdict(model.config) or len(ck.get("ranks", [])) != world:
            raise UserError(f"{ckpt_path}: cannot resume, it is not a {cfg.loss} run of this model on {world} rank(s) "
                            f"(loss {ck['config'].get('loss')!r}, {len(ck.get('ranks', []))} rank(s), model {ck['model_args']})")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start, best, hp, m0, m = ck["step"], ck["best_val"], ck["hparams"], ck["start_eval"], ck["last_eval"]
        t_train, next_eval_t = ck["t_train"], ck["next_eval_t"]
        mine = ck["ranks"][rank]  # this rank's samplers and generators
        gen.set_state(mine["rollout"])
        eval_gen.set_state(ck["eval_rng"])
        torch.set_rng_state(mine["torch"])
        prompts.load_state_dict(mine["sampler"])
        if "records" in mine:
            records.load_state_dict(mine["records"])
        if rm is not None:
            rm.n, rm.mean, rm.m2 = mine["rm_moments"]
        if master:
            truncate_metrics(os.path.join(out_dir, "metrics.jsonl"), start)
            print(f"resumed from {ckpt_path} at step {start}", flush=True)
    logger = Logger(out_dir, cfg, enabled=master, resolved={"out_dir": out_dir, "task": task, "reverse": reverse,
                                                            "verifier": vname, **{f"hparams/{k}": v for k, v in hp.items()}})
    if not cfg.resume:
        logger.log({"step": 0, **{f"hparams/{k}": v for k, v in hp.items() if v is not None},
                    "hparams/dynamic_sampling": dyn, "hparams/overlong_window": window})
    t_start = time.time()

    def rank_state():
        """What only this rank knows: its generators and samplers (gathered into every ckpt.pt)."""
        s = {"rollout": gen.get_state(), "torch": torch.get_rng_state(), "sampler": prompts.state_dict()}
        if pref and cfg.pairs == "offline":
            s["records"] = records.state_dict()
        if rm is not None:
            s["rm_moments"] = (rm.n, rm.mean, rm.m2)
        return s

    def save(name, step, ranks):
        if master:
            save_checkpoint(os.path.join(out_dir, name), model, opt,
                            {**asdict(cfg), "task": task, "reverse": reverse, "verifier": vname}, step, tok, ranks=ranks,
                            eval_rng=eval_gen.get_state(), start_eval=m0, last_eval=m, best_val=best, hparams=dict(hp),
                            t_train=t_train, next_eval_t=next_eval_t)

    def run_eval(step):
        nonlocal best
        t_eval = time.time()
        print(f"step {step:4d} | evaluating: {len(test)} test problems (greedy, {cfg.eval_samples} samples each), "
              f"{len(val)} val, KL on 256 ...", flush=True)
        m, examples = evaluate(model, tok, test, reverse, cfg.max_new_tokens, n_samples=cfg.eval_samples,
                               temperature=cfg.temperature, generator=eval_gen, verifier=task_verifier)
        m.update(evaluate(model, tok, val, reverse, cfg.max_new_tokens, prefix="val", verifier=task_verifier)[0])
        m.update(eval_kl(model, ref, tok, test, reverse, cfg, eval_gen))
        m["perf/train_s"] = t_train
        if m["val/accuracy"] > best:
            best = m["val/accuracy"]
            save("best.pt", step, [rank_state()])
        logger.log({"step": step, **m, "eval/examples": examples})
        print(f"step {step:4d} | eval " + " ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float) and "perf/" not in k)
              + f" | took {time.time() - t_eval:.1f}s | {fmt_time(time.time() - t_start)}", flush=True)
        return m

    stop = StopFlag()
    try:
        if not cfg.resume:
            m = m0 = run_eval(0) if master else None
            save("ckpt.pt", 0, gather_objects(rank_state()))
        for step in range(start, cfg.max_iters):
            if 0 < cfg.max_seconds <= t_train:  # resumed after its time ran out (a running step stops below)
                break
            t0 = time.time()
            lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_iters))
            rows = None
            if pref and cfg.pairs == "offline":
                n = local.pairs_per_step * (2 if cfg.loss == "kto" else 1)
                (rows, labels), batch, stats = record_rows(tok, [recs[i] for i in records.take(n)], reverse), None, {}
            elif cfg.loss == "sft":  # continued SFT: the gold answers of train problems
                rows, batch, stats = gold_rows(tok, [shard[i] for i in prompts.take(local.pairs_per_step)], reverse), None, {}
            else:  # preference losses online: only groups holding a right and a wrong answer are kept; rft keeps all
                with amp:
                    batch, stats = collect(model, tok, shard, prompts, local, gen, reverse, (dyn or pref) and not base, rm, verifier)
                if cfg.loss == "rft" and batch is not None:  # rejection sampling: the verified-correct samples are the data
                    rows = sample_rows(batch, batch["correct"].nonzero().flatten().tolist())
                if all_reduce(float(batch is None or (base and not rows)), "max").item():  # on any rank: no update, no NaN
                    if master:
                        print(f"step {step + 1}: " + ("no sample was correct" if base else "every sampled group had equal "
                                                      "rewards") + " (on some rank); no update", flush=True)
                    batch, rows = None, None
                elif pref:
                    rows = online_rows(batch, cfg.group_size)
                    labels = torch.arange(len(rows)) < len(rows) // 2  # kto: the correct half is desirable
            t_roll = time.time() - t0
            if batch is not None or rows is not None:
                try:
                    with amp:
                        stats.update(pref_update(fwd, ref, opt, tok, rows, labels, cfg, hp, lr) if pref
                                     else nll_update(fwd, opt, rows, cfg, lr, tok.pad_id, batch) if base
                                     else update(fwd, ref, opt, batch, cfg, hp, gen, lr))
                except FloatingPointError as e:
                    raise UserError(f"step {step + 1}: non-finite {e}; stopped, last good checkpoint kept at {ckpt_path}") from None
            stats = mean_over_ranks(stats)
            if cfg.loss == "ppo" and hp["kl_target"] and "rl/kl_k1" in stats:  # adaptive KL controller
                hp["beta"] = L.adaptive_beta(hp["beta"], stats["rl/kl_k1"], hp["kl_target"], batch["ids"].size(0) * world)
            t_step = time.time() - t0
            t_train += t_step
            if "rl/loss" in stats:
                stats.update({"perf/rollout_s": t_roll, "perf/step_s": t_step})
                if batch is not None:
                    stats["perf/rollout_tok_s"] = batch["length"].sum().item() / t_roll
            if master and "rl/loss" in stats:
                print(f"step {step + 1:4d}/{cfg.max_iters} | " + " ".join(f"{k} {stats['rl/' + k]:.4g}" for k in SHOWN if 'rl/' + k in stats)
                      + f" | {t_step:.2f}s (rollout {t_roll:.2f}s) | {fmt_time(time.time() - t_start)}, ETA {eta(step + 1, t_train, cfg)}",
                      flush=True)
            logger.log({"step": step + 1, **stats})
            # the stop decisions are every rank's (the max over ranks): all of them stop at the same step
            out_of_time, timed, stopping = (all_reduce([0 < cfg.max_seconds <= t_train, 0 < next_eval_t <= t_train,
                                                        stop.signal is not None], "max") > 0).tolist()
            while 0 < next_eval_t <= t_train:
                next_eval_t += cfg.eval_seconds
            due = (step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.max_iters or out_of_time or timed
            if master and due:
                m = run_eval(step + 1)
            if due or (step + 1) % cfg.ckpt_interval == 0 or stopping:
                save("ckpt.pt", step + 1, gather_objects(rank_state()))  # after the step's log and eval: a resume repeats nothing
            if master and out_of_time:
                print(f"training time {t_train:.1f}s reached max_seconds={cfg.max_seconds:g}: stopping after step {step + 1}", flush=True)
            if master and stopping:
                print(f"{stop.signal or 'SIGTERM'}: saved {ckpt_path} at step {step + 1}; continue with --resume=true", flush=True)
            if out_of_time or stopping:
                break
    finally:
        stop.restore()
    if master:
        pk = pass_k_name(cfg.eval_samples)
        print(f"held-out (test) greedy accuracy: {m0['eval/accuracy']:.4f} -> {m['eval/accuracy']:.4f} "
              f"({100 * (m['eval/accuracy'] - m0['eval/accuracy']):+.1f} points) in {time.time() - t_start:.0f}s; "
              + (f"{pk} {m0['eval/' + pk]:.4f} -> {m['eval/' + pk]:.4f}; " if cfg.eval_samples else "")
              + f"checkpoint {ckpt_path}", flush=True)
    logger.finish()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"metrics": m, "model": model, "ref": ref}


def eta(done, t_train, cfg):
    """Time left from the mean step time so far (evals excluded), capped by max_seconds."""
    left = t_train / max(1, done) * (cfg.max_iters - done)
    return fmt_time(min(left, cfg.max_seconds - t_train) if cfg.max_seconds > 0 else left)


@torch.no_grad()
def eval_kl(model, ref, tok, problems, reverse, cfg, gen, n=256):
    """KL(policy || ref) on fresh policy samples for n test prompts x 4 (k3, mean over response tokens),
    logged at every eval for every loss, also when beta is 0; and, on the same samples, the mean
    response length (tokens incl. EOS) and the fraction truncated at max_new_tokens (no EOS)."""
    idx = torch.randperm(len(problems), generator=gen, device=gen.device)[:n].tolist()
    prompts, k = encode_prompts(tok, [problems[i][0] for i in idx], reverse), max(1, cfg.micro_batch_size // 4)
    kl, count, lengths, truncated = 0.0, 0, [], []
    for i in range(0, len(prompts), k):  # k prompts x 4 samples at a time: memory
        out = generate(model, prompts[i:i + k], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=4,
                       temperature=cfg.temperature, generator=gen)
        P, mask = out["prompt_len"], out["response_mask"][:, out["prompt_len"]:]
        ref_lp = policy_logps(ref, out["ids"], out["offsets"], out["response_mask"], P, cfg.temperature, G=4)[0]
        kl, count = kl + L.masked_sum(L.kl_estimate(out["logps"], ref_lp, "k3"), mask).item(), count + int(mask.sum())
        length = mask.sum(1)  # (n,)
        last = out["ids"][:, P:].gather(1, (length - 1).clamp_min(0)[:, None]).squeeze(1)  # (n,) last sampled token
        lengths.append(length.float())
        truncated.append(((last != tok.eos_id) | (length == 0)).float())
    return {"eval/kl": kl / max(1, count), "eval/resp_len": torch.cat(lengths).mean().item(),
            "eval/truncated_frac": torch.cat(truncated).mean().item()}


def optimizer_step(model, opt, loss, lr, grad_clip, backward=True):
    """Backward (backward=False: the caller accumulated the gradients, loss is their total), sum the
    gradients over DDP ranks (each rank's loss divides by the global counts), refuse a
    NaN/inf (FloatingPointError naming the tensor), clip, step at lr (times a param group's lr_scale,
    the PPO value head's). Returns the gradient norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if backward:
        opt.zero_grad()
        loss.backward()
    sync_grads(model)  # DDP: every rank's gradients summed, so every rank takes the same step
    gnorm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    if not (torch.isfinite(loss) and torch.isfinite(gnorm)):  # a finite norm means every gradient is finite
        raise FloatingPointError(nonfinite(loss, model))
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), grad_clip, gnorm)
    opt.step()
    return gnorm


if __name__ == "__main__":
    run_cli(main, Config)
