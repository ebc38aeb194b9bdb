"""The off-policy lab, opened by --staleness, --sampler_bf16, --rollout_is or --decoupled.

Async RL trains on rollouts a sampler mu made a few updates ago, or in another precision.
--staleness=k queues each rollout and trains step t on step t-k's (exact: every generator is
seeded by step, so a resume replays it). Whenever mu can differ from the trainer, pi_old is
recomputed by the trainer (Rollout.old_logp; mu stays in .mu), the ratio is anchored at it, and
--rollout_is / --decoupled weigh each token's advantage by pi_old / mu (losses.rollout_weights).
"""
from contextlib import nullcontext
from dataclasses import dataclass

import torch

import losses
from model import logprobs
from nanorl.config import UserError

KINDS = ("none", "tis", "seq_tis", "icepop")


@dataclass
class Flags:  # rl.py's flags of the lab
    staleness: int = 0  # train each step on the rollout of k steps earlier (async RL)
    sampler_bf16: bool = False  # add bf16 autocast to the rollouts: a known sampler gap
    rollout_is: str = "none"  # tis, seq_tis or icepop: weigh each token by pi_old / mu
    decoupled: bool = False  # decoupled PPO: clip at pi_prox = pi_old, weigh pi_prox / mu
    async_rollouts: bool = False  # sample in a process of its own, overlapped (asyncrl.py)
    inflight: bool = False  # the async sampler loads new weights between decode steps
    async_timeout: float = 300.0  # seconds the trainer waits for a rollout, then stops


def check(cfg, algo):
    """The lab's settings against the algorithm: a one-line error where they do not fit."""
    if cfg.staleness < 0:
        raise UserError(f"staleness must be >= 0, got {cfg.staleness}")
    if cfg.rollout_is not in KINDS:
        raise UserError(f"rollout_is must be none, tis, seq_tis or icepop, got {cfg.rollout_is}")
    fix = kind(cfg) != "none"
    if fix and algo.ratio is None:
        raise UserError(f"--rollout_is and --decoupled reweight a policy ratio; {cfg.loss} "
                        "has none")
    if cfg.staleness and algo.on_policy:
        raise UserError(f"--staleness trains on old rollouts, which needs an importance ratio; "
                        f"{cfg.loss} has none")
    if cfg.rollout_is != "none" and cfg.decoupled:
        raise UserError("--decoupled brings its own behaviour weight pi_prox/mu: leave "
                        "--rollout_is=none")
    if algo.ratio == "sequence" and (cfg.rollout_is in ("tis", "icepop") or cfg.decoupled):
        raise UserError(f"{cfg.loss} weighs whole sequences: only --rollout_is=seq_tis fits it")
    if cfg.sampler_bf16 and algo.family != "pg":
        raise UserError(f"--sampler_bf16 measures the sampler's gap to pi_old; {cfg.loss} has "
                        "no pi_old")


def on(cfg):
    """Whether the lab is open: a stale or bf16 rollout (pi_old recomputed) or a correction."""
    return any((cfg.staleness, cfg.sampler_bf16, cfg.bf16, cfg.decoupled, cfg.rollout_is != "none"))


class Lab:
    """rl.py's step (rl.pg_step) in the lab: it trains on the rollout of k = --staleness steps ago
    (queued; none while the queue fills; a sampler's in bf16 with --sampler_bf16), pi_old
    recomputed by the trainer wherever mu may differ, and the capped share of --rollout_is's or
    --decoupled's weights measured (offpolicy.weighed applies them to the advantages)."""

    def __init__(self, step, collect):
        self.step, self.collect = step, collect  # rl.py's

    def __call__(self, cfg, algo, run, lr, gen, given=None):
        fresh, rollout = {}, given  # fresh: this step's own sampling stats, under --staleness
        if rollout is None:  # sampled here (the async sampler and a replay bring their own)
            dev = next(run.model.parameters()).device  # a bf16 sampler, or the run's precision
            with torch.autocast(dev.type, torch.bfloat16) if cfg.sampler_bf16 else nullcontext():
                rollout = self.collect(cfg, algo, run, gen)
            if cfg.staleness:  # the rollout of k steps ago, or (None, {})
                fresh = run.ranks.mean(rollout[1])
                rollout = stale(run.queue, *rollout, cfg.staleness)
        batch, lab = rollout[0], {}
        if not run.ranks.reduce(float(batch is None), "max").item():  # the step updates
            if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:  # mu is not the trainer's pi_old
                lab = recompute(run.model, batch, cfg)
            if kind(cfg) != "none":
                lab["rl/is_capped_frac"] = losses.rollout_weights(
                    batch.old_logp, batch.mu, batch.mask, kind(cfg))[1].item()
        return {**self.step(cfg, algo, run, lr, gen, rollout), **run.ranks.mean(lab), **fresh}


def kind(cfg):
    """The correction of the advantages: decoupled, a --rollout_is kind, or none."""
    return "decoupled" if cfg.decoupled else cfg.rollout_is


@torch.no_grad()
def recompute(model, batch, cfg):
    """pi_old, the trainer's log-probs of a rollout that mu sampled, into batch.old_logp -> the gap
    |sum_t (log pi_old - log mu)| per sequence, its mean and max."""
    batch.old_logp = logprobs(model, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                              max_rows=cfg.micro_batch_size)[0]
    gap = losses.masked_sum(batch.old_logp - batch.mu, batch.mask, 1).abs()  # (N,)
    return {"rl/old_mu_seq_mean": gap.mean().item(), "rl/old_mu_seq_max": gap.max().item()}


def stale(queue, batch, stats, staleness):
    """Queue this rollout and its stats -> those of k = staleness steps ago, or (None, {})."""
    queue.append((batch, stats))
    return queue.popleft() if len(queue) > staleness else (None, {})


def weighed(stage):
    """rl.py's advantage stage, its advantages times --rollout_is's or --decoupled's weights
    (losses.rollout_weights); a sequence-ratio algorithm takes seq_tis's one weight per row."""
    def weighed_advantages(cfg, algo, run, batch):
        adv, inputs = stage(cfg, algo, run, batch)
        w = losses.rollout_weights(batch.old_logp, batch.mu, batch.mask, kind(cfg))[0]  # (N, L)
        if algo.ratio == "sequence":
            return adv * w[:, 0], inputs  # (N,)
        return (adv[:, None] if adv.dim() == 1 else adv) * w, inputs  # (N, L)
    return weighed_advantages
