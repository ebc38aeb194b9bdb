"""
Reinforcement learning from the SFT checkpoint, with any loss of losses.ALGOS.

    python rl.py --loss=grpo            # or dapo, dr_grpo, kl_cov, reinforce_pp, remax, ...: losses.ALGOS
    python rl.py --loss=ppo --reward=rm  # PPO against a reward_model.py checkpoint (RLHF)
    python rl.py --loss=dpo             # or ipo, kto, simpo, orpo (--pairs=online), baselines sft, rft
    python rl.py --loss=opd --teacher_ckpt=out/sft-teacher/ckpt.pt  # or gkd: on-policy distillation

One step: train prompts -> G samples each from the KV-cache sampler, whose log-probs are the old
log-probs -> rewards (verify.py, or a reward model) -> advantages (the loss's kind; PPO: GAE on a
value head; ReMax: a greedy response per prompt) -> reference log-probs if a KL term needs them ->
ppo_epochs x minibatches updates.
Dynamic sampling drops the groups whose rewards are all equal and samples new prompts to refill.
Off-policy: --staleness=k trains on the rollout of k steps earlier, --sampler_bf16 samples in bf16;
the trainer then recomputes pi_old, and --rollout_is / --decoupled weigh the tokens by pi_old/mu.
Held-out eval at step 0, every eval_interval and at the end; writes out_dir/{ckpt,best}.pt and
metrics.jsonl. Every generator is seeded from (seed, rank, step): resume needs no RNG state.
"""
import copy
import os
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from types import SimpleNamespace
from typing import Optional

import torch

import losses as L
import pref
from checkpoint import save_checkpoint, unwrap
from config import UserError, check_bounds, print_config, run_cli
from data.tasks import ensure_data, labelled, load_records, load_split
from ddp import all_reduce, gather_objects, init_distributed, mean_over_ranks, resolve_device, world_size
from evaluate import encode_prompts, gold_rows, grade, pass_k_name, responses, verifier_of
from logger import Logger, StopFlag, fmt_time
from model import generate, response_forward, seeded
from policy import evaluate_policy, load_policy, load_teacher, optimizer_step, resume
from rm import RewardModel
from verify import exact_answer, first_wrong_token, overlong_penalty

SHOWN = ("loss", "reward_mean", "rm_reward", "accuracy", "margin", "pair_accuracy", "z", "log_ratio",
         "n_groups", "n_seqs", "zero_std_frac", "entropy", "resp_len", "logp_mismatch",
         "explained_variance", "value_loss", "old_mu_seq_mean", "is_capped_frac")  # the progress line
SEQUENCE_LOSSES = ("gspo", "gapo", "gmpo")  # one advantage per sequence: sequence weights only


@dataclass
class Config:
    loss: str = "grpo"  # a name in losses.ALGOS
    pairs: str = "offline"  # dpo, ipo, kto: "offline" (data/ files) or "online" (policy samples)
    pairs_per_step: int = 256  # offline dpo/ipo pairs per step (kto: 2x answers); sft: problems
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    reward: str = "verifier"  # "verifier" (the task's, binary) or "rm" (a reward_model.py checkpoint)
    rm_ckpt: str = "out/rm-mul/ckpt.pt"
    rm_normalize: bool = True  # RM scores -> (s - running mean) / running std
    out_dir: str = ""  # "" = out/rl-<loss>
    seed: int = 1337
    max_iters: int = 300
    max_seconds: float = 0  # > 0: stop after the step at which training time passes this
    eval_interval: int = 25
    ckpt_interval: int = 25  # ckpt.pt this often, at every eval, and on SIGINT/SIGTERM
    resume: bool = False  # continue exactly from out_dir/ckpt.pt
    prompts_per_step: int = 64
    group_size: int = 16  # G samples per prompt
    temperature: float = 1.0  # the loss sees the same tempered distribution
    max_new_tokens: int = 8
    dynamic_sampling: bool = True  # drop all-equal groups (no signal), refill with new prompts
    max_refills: int = 4  # extra rollout rounds per step to refill them
    overlong_window: Optional[int] = None  # DAPO overlong shaping (tokens), 0 = off; None = the loss's
    prompt_selection: bool = True  # skip once the prompts whose last group was all-equal
    lr: float = 2e-4
    warmup_iters: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 256  # rows per training forward/backward (identical rows run once): memory
    sample_batch_size: int = 256  # rows per sampler call: speed against memory (bench/README.md)
    staleness: int = 0  # train each step on the rollout sampled this many steps earlier (async RL)
    sampler_bf16: bool = False  # rollouts under bf16 autocast, updates in fp32: a known sampler gap
    rollout_is: str = "none"  # tis, seq_tis, icepop: weight pi_old/mu of each token (losses.rollout_weights)
    decoupled: bool = False  # decoupled PPO: clip at pi_prox = pi_old, weight pi_prox/mu, masked above 5
    teacher_ckpt: str = ""  # opd, gkd: the checkpoint to distil (the policy's tokenizer); others ignore it
    # loss hyperparameters: None = the loss's default in losses.ALGOS
    beta: Optional[float] = None
    eps_low: Optional[float] = None
    eps_high: Optional[float] = None
    kl_estimator: Optional[str] = None
    clip_c: Optional[float] = None  # dual-clip bound (off by default)
    vf_coef: Optional[float] = None  # ppo: value-loss weight
    vf_clip: Optional[float] = None  # ppo: value clipping range, 0 = off
    ent_coef: Optional[float] = None  # ppo: entropy bonus
    kl_target: Optional[float] = None  # ppo: adaptive KL controller target; None = fixed beta
    vf_lr_mult: Optional[float] = None  # ppo: the value head's lr = lr * vf_lr_mult
    gamma: Optional[float] = None  # ppo: GAE discount
    lam: Optional[float] = None  # ppo: GAE lambda; orpo: weight of the odds-ratio term
    gamma_beta_ratio: Optional[float] = None  # simpo: target margin gamma / beta
    label_smoothing: Optional[float] = None  # dpo (conservative DPO)
    rpo_alpha: Optional[float] = None  # dpo/ipo/kto: weight of the chosen answers' NLL (RPO)
    lambda_d: Optional[float] = None  # kto: weight of desirable answers
    lambda_u: Optional[float] = None  # kto: weight of undesirable answers
    gkd_beta: Optional[float] = None  # gkd: 1 reverse KL(pi || teacher), 0 forward KL, between: JSD
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8
    threads: int = 0
    device: str = "auto"  # auto = cuda > mps > cpu
    bf16: Optional[bool] = None  # bf16 autocast of rollouts and updates; None = on CUDA
    compile: bool = False  # torch.compile the training forward
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment (compare.py sets it)


def check_config(cfg):
    """Reject bad values before any work starts."""
    if cfg.loss not in L.ALGOS:
        kinds = {"pg": "policy gradient", "pref": "preference", "sft": "baselines"}
        valid = "; ".join(f"{v}: {', '.join(n for n, a in L.ALGOS.items() if a.family == k)}"
                          for k, v in kinds.items())
        raise UserError(f"unknown loss {cfg.loss!r}; valid: {valid}")
    family = L.ALGOS[cfg.loss].family
    if cfg.reward not in ("verifier", "rm") or cfg.pairs not in ("offline", "online"):
        raise UserError(f"reward must be 'verifier' or 'rm' and pairs must be 'offline' or 'online', "
                        f"got {cfg.reward!r}, {cfg.pairs!r}")
    binary = cfg.loss in ("cliff", "gapo", "maxrl")  # their advantages assume 0/1 rewards
    if cfg.reward == "rm" and (family != "pg" or binary):
        raise UserError(f"--reward=rm gives real-valued rewards; {cfg.loss} needs the binary verifier")
    check_bounds(cfg, ("lr grad_clip temperature", "> 0", lambda v: v > 0),
                 ("group_size", ">= 2", lambda v: v >= 2),
                 ("max_new_tokens prompts_per_step eval_interval ckpt_interval pairs_per_step "
                  "ppo_epochs minibatches sample_batch_size", ">= 1", lambda v: v >= 1),
                 ("max_iters max_seconds warmup_iters weight_decay max_refills eval_samples staleness "
                  "eps_low eps_high beta", ">= 0", lambda v: v is None or v >= 0),  # None: a default
                 ("gkd_beta", "in [0, 1]", lambda v: v is None or 0 <= v <= 1),
                 ("rollout_is", "none, tis, seq_tis or icepop",
                  lambda v: v in ("none", "tis", "seq_tis", "icepop")))
    if (binary or family == "pref") and overlong_window(cfg) > 0:
        raise UserError(f"{cfg.loss} needs binary rewards: overlong shaping must be off "
                        "(--overlong_window=0)")
    if cfg.clip_c is not None and cfg.clip_c <= 1:  # c < 1 would raise PPO's objective for A < 0
        raise UserError(f"clip_c must be > 1 (dual clip bounds the objective below at clip_c*A for "
                        f"A < 0; 3 is usual), or unset (off); got {cfg.clip_c}")
    on_policy_only = family != "pg" or cfg.loss in ("reinforce", "rloo", "maxrl", "remax")
    if on_policy_only and cfg.ppo_epochs * cfg.minibatches > 1:
        why = ("later steps would be off-policy with no importance weight" if family == "pg"
               else "its update has no epochs or minibatches")
        raise UserError(f"{cfg.loss} takes one optimizer step per batch ({why}): "
                        "ppo_epochs and minibatches must be 1")
    fix = cfg.rollout_is != "none" or cfg.decoupled  # the off-policy lab's corrections
    if fix and (on_policy_only or distills(cfg)):
        raise UserError(f"--rollout_is and --decoupled reweight a clipped policy ratio; {cfg.loss} has none")
    if cfg.staleness and on_policy_only:
        raise UserError(f"--staleness trains on old rollouts, which needs an importance ratio; {cfg.loss} "
                        "has none")
    if cfg.rollout_is != "none" and cfg.decoupled:
        raise UserError("--decoupled brings its own behaviour weight pi_prox/mu: leave --rollout_is=none")
    if cfg.loss in SEQUENCE_LOSSES and (cfg.rollout_is in ("tis", "icepop") or cfg.decoupled):
        raise UserError(f"{cfg.loss} weighs whole sequences: only --rollout_is=seq_tis fits it")
    if distills(cfg) and not cfg.teacher_ckpt:  # other losses ignore it, as they do rm_ckpt
        raise UserError(f"{cfg.loss} distils a teacher: set --teacher_ckpt (a nanorl checkpoint with the "
                        "policy's tokenizer)")


def distills(cfg):
    """Whether the loss learns from a teacher's log-probs (opd, gkd), not from rewards."""
    return L.ALGOS[cfg.loss].advantage == "teacher"


def overlong_window(cfg):
    return cfg.overlong_window if cfg.overlong_window is not None else L.ALGOS[cfg.loss].overlong


class PromptSampler:
    """Epochs over n prompts, each epoch in the order seeded by (key, epoch). With selection on, a
    prompt whose group was all-correct or all-wrong at its last visit is skipped once (then forgotten)."""

    def __init__(self, n, key, selection):
        self.n, self.key, self.selection = n, key, selection
        self.load_state_dict({"epoch": 0, "pos": 0, "saturated": []})

    def take(self, k):
        out = []
        while len(out) < k:
            if self.pos >= self.n:  # the next epoch, in its own order
                self.load_state_dict({"epoch": self.epoch + 1, "pos": 0, "saturated": self.saturated})
            i = self.order[self.pos]
            self.pos += 1
            if self.selection and i in self.saturated:
                self.saturated.discard(i)
            else:
                out.append(i)
        return out

    def record(self, idx, group_rewards):
        self.saturated |= {i for i, r in zip(idx, group_rewards.tolist()) if min(r) == max(r)}

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "saturated": sorted(self.saturated)}

    def load_state_dict(self, s):
        self.epoch, self.pos, self.saturated = s["epoch"], s["pos"], set(s["saturated"])
        self.order = torch.randperm(self.n, generator=seeded("cpu", self.key, self.epoch)).tolist()


def rollout(model, tok, problems, idx, cfg, gen, reverse, rm=None, verifier=None, rm_stats=True):
    """G samples for each problem in idx -> generate's dict plus, per row (N,): correct (the task's
    verifier, default exact_answer), reward (correct + DAPO's overlong shaping; with rm, a RewardModel,
    its score instead of correct, normalised by the running statistics, which only rm_stats rows
    update), first_wrong (CLIFF's first wrong token, -1 if none), length and
    finished (ended with EOS)."""
    rows, G = gold_rows(tok, [problems[i] for i in idx], reverse), cfg.group_size  # [(prompt, gold ids)]
    n = max(1, cfg.sample_batch_size // G)  # prompts per sampler call
    out = cat_rollouts([generate(model, [p for p, _ in rows[i:i + n]], cfg.max_new_tokens, tok.eos_id,
                                 tok.pad_id, G=G, temperature=cfg.temperature, generator=gen)
                        for i in range(0, len(rows), n)])
    window, facts, seen = overlong_window(cfg), [], {}
    for row, ids in enumerate(responses(out)):
        key = (row // G, *ids)  # a group's identical samples are graded once
        if key not in seen:
            c = grade(tok, ids, problems[idx[row // G]][1], reverse, verifier or exact_answer)  # truncated: 0
            shaped = c + (overlong_penalty(len(ids), cfg.max_new_tokens, window) if window > 0 else 0.0)
            wrong = first_wrong_token(ids, rows[row // G][1])
            seen[key] = (c, shaped, -1 if wrong is None else wrong, float(len(ids)), ids[-1:] == [tok.eos_id])
        facts.append(seen[key])
    for k, v in zip(("correct", "reward", "first_wrong", "length", "finished"), zip(*facts)):
        out[k] = torch.tensor(v, device=out["ids"].device)
    if rm is not None:
        raw = rm(out)  # (N,)
        if cfg.rm_normalize and rm_stats:
            rm.update(raw)
        score = rm.normalize(raw) if cfg.rm_normalize else raw
        out.update(rm_reward=raw, reward=score + out["reward"] - out["correct"])  # keeps overlong shaping
    return out


def cat_rollouts(parts):
    """One rollout from several: prompts left-padded to the longest, responses right-padded."""
    if len(parts) == 1:
        return parts[0]
    P, R = max(p["prompt_len"] for p in parts), max(p["logps"].size(1) for p in parts)
    pad = torch.nn.functional.pad
    for p in parts:
        left, right = P - p["prompt_len"], R - p["logps"].size(1)
        p.update(ids=pad(p["ids"], (left, right)), response_mask=pad(p["response_mask"], (left, right)),
                 logps=pad(p["logps"], (0, right)), offsets=p["offsets"] + left)
    return {**{k: torch.cat([p[k] for p in parts]) for k in parts[0] if k != "prompt_len"}, "prompt_len": P}


def select_groups(out, keep, G):
    """Keep whole groups (bool (n_groups,)) of a rollout dict."""
    rows = keep.repeat_interleave(G)
    return {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in out.items()}


def collect(model, tok, train, prompts, cfg, gen, reverse, dyn, rm=None, verifier=None):
    """Rollouts for one step: this rank's share of prompts_per_step prompts x G samples. Dynamic
    sampling drops the groups without signal and refills (up to max_refills more rounds): with the
    verifier, all-right or all-wrong groups (DAPO keeps 0 < accuracy < 1), with an RM equal scores;
    ReMax's greedy reward counts as one more member. Returns (batch or None, stats)."""
    parts, n_groups, n_sampled, n_zero_std, greedy_sum, G = [], 0, 0, 0, 0.0, cfg.group_size
    want = cfg.prompts_per_step // world_size()
    for _ in range(1 + (cfg.max_refills if dyn else 0)):
        idx = prompts.take(want - n_groups)
        out = rollout(model, tok, train, idx, cfg, gen, reverse, rm, verifier)
        R = (out["correct"] if rm is None else out["reward"]).view(-1, G)  # (groups, G)
        prompts.record(idx, out["correct"].view(-1, G))
        if cfg.loss == "remax":  # ReMax's baseline: each prompt's greedy response, rewarded alike
            greedy = rollout(model, tok, train, idx, replace(cfg, group_size=1, temperature=0.0), gen,
                             reverse, rm, verifier, rm_stats=False)["reward"]  # (groups,) the samples' scale
            out["baseline"], R = greedy.repeat_interleave(G), torch.cat([R, greedy[:, None]], 1)
            greedy_sum += greedy.sum().item()
        zero_std = R.max(1).values == R.min(1).values  # (groups,) no signal
        n_sampled, n_zero_std = n_sampled + len(idx), n_zero_std + int(zero_std.sum())
        if dyn:
            out = select_groups(out, ~zero_std, G)
        if out["ids"].size(0):
            parts.append(out)
            n_groups += out["ids"].size(0) // G
        if not dyn or n_groups >= want:
            break
    stats = {"rl/zero_std_frac": n_zero_std / n_sampled, "rl/n_groups": n_groups,
             **({"rl/greedy_reward": greedy_sum / n_sampled} if cfg.loss == "remax" else {})}
    return (cat_rollouts(parts) if parts else None), stats


def advantages(cfg, batch, hp, ref_logp):
    """(N,) or (N, L) advantages for the loss, plus the extra keyword inputs some losses need."""
    G, R, kind = cfg.group_size, batch["reward"], L.ALGOS[cfg.loss].advantage  # R (N,)
    mask = batch["response_mask"][:, batch["prompt_len"]:]  # (N, L)
    if kind == "teacher":  # opd, gkd: the teacher's log-probs (gkd: tempered logits) are in batch (update)
        extra = {"teacher_logits": batch["teacher_logits"]} if cfg.loss == "gkd" else {}
        return L.teacher_advantages(batch["logps"], batch["teacher_logps"], mask), extra
    if kind in ("gae", "rpp", "rpp_baseline"):  # token rewards -beta*k1 + score at the end, whitened:
        lp, gae = batch["logps"], kind == "gae"  # PPO as InstructGPT: GAE; REINFORCE++: return-to-go
        if kind == "rpp_baseline":  # R - its group's mean (Dr. GRPO's advantage), then the pipeline
            R = L.group_advantages(R.view(-1, G), "mean").flatten()
        rewards = L.kl_in_reward(R, lp, ref_logp if hp["beta"] else lp, mask, hp["beta"])  # (N, L)
        v = batch["values"] if gae else torch.zeros_like(rewards)  # V = 0, gamma = lam = 1: return-to-go
        adv, returns = L.gae(rewards, v, mask, *((hp["gamma"], hp["lam"]) if gae else (1.0, 1.0)))
        n, s, s2 = all_reduce([mask.sum(), L.masked_sum(adv, mask), L.masked_sum(adv * adv, mask)]).tolist()
        adv = L.whiten(adv, mask, s / n, s2 / n - (s / n) ** 2)  # every rank's moments: DDP = one process
        return adv, (dict(old_values=v, returns=returns) if gae else {})
    if cfg.loss in ("reinforce", "rloo", "remax") and hp["beta"] > 0:  # KL in the reward: R - beta*sum_t k1
        R = L.kl_in_reward(R, batch["logps"], ref_logp, mask, hp["beta"]).sum(1)
    if kind == "remax":  # baseline: the reward of the prompt's greedy response
        return R - batch["baseline"], {}
    R = R.view(-1, G)  # (n_groups, G)
    if kind == "cliff":
        adv = L.cliff_advantages(R, batch["first_wrong"].view(-1, G), mask.view(R.size(0), G, -1))
        return adv.flatten(0, 1), {}  # (N, L)
    extra = {}
    if cfg.loss == "gapo":
        extra = dict(group_correct=batch["correct"].view(-1, G).sum(1).repeat_interleave(G), group_size=G)
    if cfg.loss in ("clip_cov", "kl_cov"):  # their tokens (N, L), chosen by update minibatch by minibatch
        extra = dict(cov_mask=torch.zeros(mask.shape, dtype=torch.bool, device=mask.device))
    return L.group_advantages(R, kind).flatten(), extra  # (N,)


def policy_logps(model, ids, offsets, full_mask, P, temperature, values=False):
    """Trainer-side log-probs of the response tokens (N, L), the logits that score them (N, L, V) and,
    with values=True, PPO's values V_t = head(h_t) * pi(y_<t | x) (N, L): an exact-match return is 0
    once a token is wrong, so the value scales with the policy's probability of the path so far.
    Identical rows and prompts run once (model.response_forward)."""
    out = response_forward(model, ids, offsets, P, return_scalar=values)
    logits, v = out if values else (out, None)
    logp = L.token_logps(logits, ids[:, P:], full_mask[:, P:], temperature)  # (N, L)
    return logp, logits, (v * L.prefix_prob(logp.detach()) if values else None)


@torch.no_grad()
def frozen_logps(model, batch, temperature, rows, values=False, logits=False):
    """policy_logps of a rollout without gradient, `rows` rows (whole groups) at a time: memory
    -> (logp (N, L), values (N, L) or None, tempered logits (N, L, V) or None)."""
    ids, offsets, mask, P = batch["ids"], batch["offsets"], batch["response_mask"], batch["prompt_len"]
    parts = [policy_logps(model, ids[i:i + rows], offsets[i:i + rows], mask[i:i + rows], P, temperature,
                          values) for i in range(0, ids.size(0), rows)]
    return (torch.cat([p[0] for p in parts]), torch.cat([p[2] for p in parts]) if values else None,
            torch.cat([p[1] for p in parts]) / temperature if logits else None)


def prepare(model, ref, teacher, batch, cfg, hp, rows, mask):
    """A rollout's inputs before its first step -> (ref_logp (N, L) if a KL term needs it, advantages
    times the weight of --rollout_is / --decoupled (losses.rollout_weights), advantages' extras, stats).
    Into batch: PPO's V_old; the teacher's log-probs (gkd: logits); when mu, the sampler, can differ
    from the trainer, pi_old as "logps" (recomputed) and mu as "mu_logps"."""
    ref_logp = frozen_logps(ref, batch, cfg.temperature, rows)[0] if hp.get("beta") else None
    recompute, stats = cfg.staleness or cfg.sampler_bf16, {}
    if cfg.loss == "ppo" or recompute:
        lp, v, _ = frozen_logps(unwrap(model), batch, cfg.temperature, rows, cfg.loss == "ppo")
        if v is not None:  # the rollout's values V_old, from the same forward shape as the update's
            batch["values"] = torch.where(mask.bool(), v, 0.0)
    if teacher is not None:
        batch["teacher_logps"], _, batch["teacher_logits"] = frozen_logps(
            teacher, batch, cfg.temperature, rows, logits=cfg.loss == "gkd")
    if recompute:  # the gap |sum_t (log pi_old - log mu)| per sequence (N,)
        gap = L.masked_sum(lp - batch["logps"], mask, 1).abs()
        batch.update(mu_logps=batch["logps"], logps=lp)
        stats = {"rl/old_mu_seq_mean": gap.mean().item(), "rl/old_mu_seq_max": gap.max().item()}
    adv, extra = advantages(cfg, batch, hp, ref_logp)
    kind = "decoupled" if cfg.decoupled else cfg.rollout_is
    if kind != "none":  # w (N, L); the sequence losses take seq_tis's one weight per row
        w, cut = L.rollout_weights(batch["logps"], batch.get("mu_logps", batch["logps"]), mask, kind)
        adv = adv * w[:, 0] if cfg.loss in SEQUENCE_LOSSES else (adv[:, None] if adv.dim() == 1 else adv) * w
        stats["rl/is_capped_frac"] = cut.item()
    return ref_logp, adv, extra, stats


def update(model, ref, opt, batch, cfg, hp, gen, lr, teacher=None):
    """Exactly ppo_epochs x minibatches optimizer steps on one rollout. Each loss divides by its
    minibatch's token/sequence counts summed over DDP ranks and accumulates over micro-batches of
    whole groups, so ranks holding any share of the groups take one process's step on all of them.
    Raises FloatingPointError on a NaN/inf."""
    G, ppo, N = cfg.group_size, cfg.loss == "ppo", batch["ids"].size(0)
    rows = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    mask = batch["response_mask"][:, batch["prompt_len"]:].float()  # (N, L) response tokens incl. EOS
    ref_logp, adv, extra, pre = prepare(model, ref, teacher, batch, cfg, hp, rows, mask)
    fewest = -int(all_reduce(-N, "max").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} rows this step "
                        f"(dynamic sampling kept few groups): lower --minibatches")

    def loss_of(r, lp, values, ent, counts, logits):
        kw = {k: (v[r] if torch.is_tensor(v) else v) for k, v in extra.items()}
        if ppo:
            kw.update(values=values, **({"entropy": ent} if hp["ent_coef"] else {}))
        if cfg.loss == "gkd":  # the divergence of the student's whole next-token distribution
            kw["logits"] = logits / cfg.temperature
        ref_r = ref_logp[r] if ref_logp is not None else None
        return L.LOSSES[cfg.loss](lp, batch["logps"][r], adv[r], mask[r], ref_r, *counts, **hp, **kw)

    stats, steps = {}, []  # steps: each optimizer step's loss stats, averaged for the log
    for _ in range(cfg.ppo_epochs):
        perm = torch.randperm(N, generator=gen, device=gen.device) if cfg.minibatches > 1 else torch.arange(N)
        for mb in perm.tensor_split(cfg.minibatches):  # exactly minibatches parts
            counts = all_reduce([mask[mb].sum().item(), float(len(mb))]).clamp_min(1).tolist()  # every rank's
            total, kept = 0.0, []
            if cfg.loss in ("clip_cov", "kl_cov"):  # their token selection spans the minibatch
                first = not stats  # no optimizer step on this rollout yet
                extra["cov_mask"][mb] = cov_mask(model, batch, mb, adv, mask, cfg, hp, gen, rows, first)
            opt.zero_grad()
            for ub in mb.split(rows):  # gradient accumulation over micro-batches
                lp, logits, values = policy_logps(model, batch["ids"][ub], batch["offsets"][ub],
                                                  batch["response_mask"][ub], batch["prompt_len"],
                                                  cfg.temperature, ppo)
                with torch.set_grad_enabled(bool(ppo and hp["ent_coef"])):  # grad only for PPO's bonus
                    ent = (L.token_entropy(logits, cfg.temperature)
                           if not stats or ppo and hp["ent_coef"] else None)
                loss, st = loss_of(ub, lp, values, ent, counts, logits)
                loss.backward()
                total += loss.detach()
                gkd_logits = logits if cfg.loss == "gkd" else None
                kept.append([t.detach() if t is not None else None for t in (lp, values, ent, gkd_logits)])
            lp, values, ent, logits = (torch.cat(ts) if ts[0] is not None else None for ts in zip(*kept))
            if not stats:  # first update of a fresh rollout: the trainer against the sampler, ratio 1 at k=0
                d, m = (lp - batch.get("mu_logps", batch["logps"])[mb]).abs(), mask[mb]  # (len(mb), L) each
                stats = {"rl/logp_mismatch": d.max().item(), "rl/entropy": L.masked_mean(ent, m).item(),
                         "rl/logp_mismatch_mean": L.masked_mean(d, m).item()}
            if len(kept) > 1:  # the minibatch's diagnostics, as if it had run in one piece
                with torch.no_grad():
                    st = loss_of(mb, lp, values, ent, counts, logits)[1]
            gnorm = optimizer_step(unwrap(model), opt, total, lr, cfg.grad_clip, backward=False)
            steps.append({k: float(v) for k, v in st.items()})
    stats.update({f"rl/{k}": sum(s[k] for s in steps) / len(steps) for k in steps[0]})
    stats.update(rollout_stats(batch, ref_logp, extra.get("returns"), hp.get("beta")), **pre)
    return {**stats, "rl/loss": total.item() * world_size(), "rl/grad_norm": gnorm.item(), "rl/lr": lr,
            "rl/n_tokens": mask.sum().item()}


def cov_mask(model, batch, mb, adv, mask, cfg, hp, gen, rows, first):
    """Clip-Cov / KL-Cov's tokens of minibatch mb (len(mb), L), from the current policy's log-probs
    (a no-grad forward; at a rollout's first optimizer step theta = theta_old: the sampler's serve)."""
    old = now = batch["logps"][mb]  # (len(mb), L)
    if not first:
        sub = {**batch, **{k: batch[k][mb] for k in ("ids", "offsets", "response_mask")}}
        now = frozen_logps(unwrap(model), sub, cfg.temperature, rows)[0]
    return L.cov_select(now, old, adv[mb], mask[mb], gen, kind=cfg.loss, **hp)


def rollout_stats(batch, ref_logp=None, returns=None, beta=None):
    """A rollout's diagnostics: reward, accuracy, lengths; KL to the reference when it ran; PPO's value
    fit (returns given); the RM score beside the verifier's accuracy (over-optimisation is a gap)."""
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


def offline(cfg):
    """Whether this loss trains on a step's worth of data files rather than on fresh samples."""
    family = L.ALGOS[cfg.loss].family
    return family == "pref" and cfg.pairs == "offline" or cfg.loss == "sft"


def train_step(cfg, s, lr, gen):
    """One step of any loss -> its stats (no update when some rank has nothing to learn from, or while
    --staleness=k fills its queue: then step t trains on the rollout of step t-k)."""
    family, batch, stats, rows, t0 = L.ALGOS[cfg.loss].family, None, {}, None, time.time()
    if offline(cfg):
        n = cfg.pairs_per_step // world_size() * (2 if cfg.loss == "kto" else 1)
        rows, labels = pref.offline_rows(cfg.loss, s.tok, [s.data[i] for i in s.sampler.take(n)], s.reverse)
    else:  # online pairs need a right and a wrong answer in each group; rft keeps every group
        dyn = cfg.dynamic_sampling and not distills(cfg) if family == "pg" else family == "pref"
        with torch.autocast(s.dev.type, torch.bfloat16) if cfg.sampler_bf16 else nullcontext():
            batch, stats = collect(s.model, s.tok, s.data, s.sampler, cfg, gen, s.reverse, dyn, s.rm,
                                   s.verifier)
        dt = time.time() - t0  # this step's rollout, whichever one the step trains on
        stats.update({"perf/rollout_s": dt, "perf/rollout_tok_s": (batch["length"].sum().item() if batch
                                                                    else 0) / dt})
        s.fifo.append(batch)  # --staleness=k: train on the rollout of k steps ago (mu is k updates old)
        if len(s.fifo) <= cfg.staleness:
            return stats
        batch = s.fifo.popleft()
        if batch is not None and family != "pg":
            rows, labels = pref.rollout_rows(batch, cfg.loss, cfg.group_size)
        if all_reduce(float(batch is None or rows == []), "max").item():  # on any rank: no update
            return stats
    if family == "pg":
        return {**stats, **update(s.fwd, s.ref, s.opt, batch, cfg, s.hp, gen, lr, s.teacher)}
    loss, st = pref.loss(s.fwd, s.ref, s.tok, rows, labels, cfg.loss, s.hp)
    gnorm = optimizer_step(unwrap(s.model), s.opt, loss, lr, cfg.grad_clip)
    return {**stats, **st, **(rollout_stats(batch) if batch is not None else {}), "rl/loss": loss.item(),
            "rl/grad_norm": gnorm.item(), "rl/lr": lr}


def setup(cfg):
    """What the loop reads, as one namespace: the policy with its frozen reference and optimizer, the
    hyperparameters resolved once, this rank's data and prompt sampler, the reward, the run state."""
    out_dir, dev = cfg.out_dir or f"out/rl-{cfg.loss}", resolve_device(cfg.device)
    rank, world = init_distributed(dev)  # torchrun: each rank samples its share of the prompts
    master = rank == 0  # rank 0 alone evaluates, prints, saves and logs
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError(f"prompts_per_step={cfg.prompts_per_step} and pairs_per_step={cfg.pairs_per_step} "
                        f"must divide by the {world} ranks")
    model, tok, task, reverse, vname, n_train = load_policy(cfg, dev)
    knobs = {k for a in L.ALGOS.values() for k in a.defaults} & {f.name for f in fields(Config)}
    knobs -= {"max_new_tokens"}
    try:  # None: the loss's default; dr_grpo's constant normaliser is max_new_tokens
        hp = L.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in sorted(knobs)}, **(
            {"max_new_tokens": cfg.max_new_tokens} if "max_new_tokens" in L.ALGOS[cfg.loss].defaults else {}))
    except ValueError as e:
        raise UserError(str(e)) from None
    if master:
        print_config(cfg)
        print(f"resolved: {hp} overlong_window={overlong_window(cfg)} out_dir={out_dir} ranks={world}",
              flush=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    train, val, test = (load_split(task, s) for s in ("train", "val", "test"))  # a text task in words
    longest = max(map(len, encode_prompts(tok, [p for p, _ in train], reverse)))
    if longest + cfg.max_new_tokens > model.config.block_size:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens} does not fit "
                        f"block_size={model.config.block_size}")
    rm = RewardModel.load(cfg.rm_ckpt, tok, dev) if cfg.reward == "rm" else None
    ref = copy.deepcopy(model).requires_grad_(False)  # the frozen reference
    teacher = load_teacher(cfg.teacher_ckpt, tok, dev) if distills(cfg) else None
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (0.9, 0.99), hp.get("vf_lr_mult"))
    data = (labelled(train, n_train) if cfg.loss == "sft" else train)[rank::world]  # sft: the SFT's labels
    if offline(cfg) and cfg.loss != "sft":
        kind = "kto" if cfg.loss == "kto" else "pairs"
        data = load_records(ensure_data(task) / f"{kind}_train.jsonl", kind)[rank::world]
    select = cfg.prompt_selection and not offline(cfg) and not distills(cfg)  # distillation needs no reward
    sampler = PromptSampler(len(data), ("prompts", cfg.seed, rank), select)
    fwd = torch.compile(model) if cfg.compile else model
    bf16 = dev.type == "cuda" if cfg.bf16 is None else cfg.bf16
    amp = torch.autocast(dev.type, torch.bfloat16, enabled=bf16)
    task_verifier = verifier_of(vname)
    verifier = None if vname == "exact" else task_verifier  # rollouts: None = exact_answer
    conf = {**asdict(cfg), "task": task, "reverse": reverse, "verifier": vname, "n_train": n_train}
    run = dict(step=0, best_val=-1.0, hparams=hp, start_eval=None, last_eval=None, t_train=0.0)
    fifo = deque()  # the rollouts sampled and not yet trained on, oldest first (staleness)
    if cfg.resume:  # the weights, optimizer, run state and samplers: every generator is seeded by step
        ck = resume(os.path.join(out_dir, "ckpt.pt"), cfg, model, opt, world, master)
        run, hp = {k: ck[k] for k in run}, ck["hparams"]
        sampler.load_state_dict(ck["ranks"][rank]["sampler"])
        fifo.extend({k: v.to(dev) if torch.is_tensor(v) else v for k, v in b.items()} if b else None
                    for b in ck["ranks"][rank].get("fifo", []))  # staleness: rollouts not yet trained on
        if rm is not None:
            rm.load_state_dict(ck["ranks"][rank]["rm"])
    logger = Logger(out_dir, cfg, enabled=master, resolved={**conf, "out_dir": out_dir, "hparams": hp})
    return SimpleNamespace(model=model, fwd=fwd, ref=ref, teacher=teacher, opt=opt, tok=tok, hp=hp, rm=rm,
                           data=data, sampler=sampler, fifo=fifo, val=val, test=test, reverse=reverse,
                           verifier=verifier, task_verifier=task_verifier, amp=amp, run=run, conf=conf,
                           logger=logger, out_dir=out_dir, dev=dev, rank=rank, world=world, master=master)


def save(s, name):
    """ckpt.pt (every rank's sampler state, gathered) or best.pt (rank 0's), written by rank 0."""
    mine = {"sampler": s.sampler.state_dict(), "fifo": list(s.fifo),  # plain dicts of tensors: weights_only
            **({"rm": s.rm.state_dict()} if s.rm else {})}
    ranks = gather_objects(mine) if name == "ckpt.pt" else [mine]
    if s.master:
        save_checkpoint(os.path.join(s.out_dir, name), s.model, s.opt, s.conf, s.run["step"], s.tok,
                        ranks=ranks, **{k: v for k, v in s.run.items() if k != "step"})


def run_eval(cfg, s):
    """Rank 0's held-out eval: logged, printed, best.pt when val accuracy improves."""
    t0, run = time.time(), s.run
    m, examples = evaluate_policy(s.model, s.ref, s.tok, s.val, s.test, s.reverse, cfg, s.task_verifier,
                                  seeded(s.dev, "eval", cfg.seed, run["step"]))
    run["last_eval"] = m = {**m, "perf/train_s": run["t_train"]}
    if m["val/accuracy"] > run["best_val"]:
        run["best_val"] = m["val/accuracy"]
        save(s, "best.pt")
    s.logger.log({"step": run["step"], **m, "eval/examples": examples})
    print(f"step {run['step']:4d} | eval " + " ".join(f"{k} {v:.4f}" for k, v in m.items() if "/n" not in k)
          + f" | took {time.time() - t0:.1f}s", flush=True)
    return m


def main(cfg):
    check_config(cfg)
    s = setup(cfg)
    run, stop, t_start = s.run, StopFlag(), time.time()
    try:
        if not cfg.resume:
            s.logger.log({"step": 0, **{f"hparams/{k}": v for k, v in s.hp.items() if v is not None}})
            run["start_eval"] = run_eval(cfg, s) if s.master else None
            save(s, "ckpt.pt")
        while run["step"] < cfg.max_iters and not 0 < cfg.max_seconds <= run["t_train"]:
            t0, step = time.time(), run["step"] + 1
            try:
                with s.amp:
                    stats = train_step(cfg, s, cfg.lr * min(1.0, step / max(1, cfg.warmup_iters)),
                                       seeded(s.dev, "rollout", cfg.seed, s.rank, step))
            except FloatingPointError as e:
                raise UserError(f"step {step}: non-finite {e}; stopped, last good checkpoint kept at "
                                f"{os.path.join(s.out_dir, 'ckpt.pt')}") from None
            stats = mean_over_ranks(stats)
            if s.hp.get("kl_target") and "rl/kl_k1" in stats:  # PPO's adaptive KL controller
                s.hp["beta"] = L.adaptive_beta(s.hp["beta"], stats["rl/kl_k1"], s.hp["kl_target"],
                                               stats["rl/n_groups"] * cfg.group_size * s.world)
            run.update(step=step, t_train=run["t_train"] + time.time() - t0)
            s.logger.log({"step": step, **stats, "perf/step_s": time.time() - t0})
            if s.master:
                print(progress(cfg, run, stats, time.time() - t0, time.time() - t_start), flush=True)
            flags = [0 < cfg.max_seconds <= run["t_train"], stop.signal is not None]
            out_of_time, stopping = (all_reduce(flags, "max") > 0).tolist()  # every rank stops together
            if s.master and (step % cfg.eval_interval == 0 or step == cfg.max_iters or out_of_time):
                run_eval(cfg, s)
            if step % cfg.ckpt_interval == 0 or step % cfg.eval_interval == 0 or out_of_time or stopping:
                save(s, "ckpt.pt")  # after the step's log and eval: a resume repeats nothing
            if s.master and stopping:
                print(f"{stop.signal or 'SIGTERM'}: saved {s.out_dir}/ckpt.pt at step {step}; continue with "
                      "--resume=true", flush=True)
            if stopping:
                break
    finally:
        stop.restore()
    if s.master:
        m0, m, pk = run["start_eval"], run["last_eval"], "eval/" + pass_k_name(cfg.eval_samples)
        print(f"held-out (test) greedy accuracy: {m0['eval/accuracy']:.4f} -> {m['eval/accuracy']:.4f} "
              f"({100 * (m['eval/accuracy'] - m0['eval/accuracy']):+.1f} points) "
              f"in {time.time() - t_start:.0f}s; "
              + (f"{pk[5:]} {m0[pk]:.4f} -> {m[pk]:.4f}; " if cfg.eval_samples else "")
              + f"checkpoint {s.out_dir}/ckpt.pt", flush=True)
    s.logger.finish()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"metrics": run["last_eval"], "model": s.model, "ref": s.ref}


def progress(cfg, run, stats, t_step, elapsed):
    """The step's line: the SHOWN rl/ stats it logged, its time, the ETA (capped by max_seconds)."""
    left = run["t_train"] / run["step"] * (cfg.max_iters - run["step"])
    left = min(left, cfg.max_seconds - run["t_train"]) if cfg.max_seconds > 0 else left
    shown = " ".join(f"{k} {stats['rl/' + k]:.4g}" for k in SHOWN if "rl/" + k in stats) or "no update"
    return (f"step {run['step']:4d}/{cfg.max_iters} | {shown} | {t_step:.2f}s | {fmt_time(elapsed)}, "
            f"ETA {fmt_time(left)}")


if __name__ == "__main__":
    run_cli(main, Config)
