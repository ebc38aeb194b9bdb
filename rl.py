"""
RL from the SFT checkpoint. A row of losses.ALGOS declares the algorithm; this loop obeys.

    python rl.py --loss=grpo               # dapo, dr_grpo, ppo, gspo, ...: losses.ALGOS
    python rl.py --loss=ppo --reward=rm    # PPO against a reward_model.py checkpoint
    python rl.py --loss=dpo --pairs=online # preference rows; baselines sft, rft
    python rl.py --help                    # every flag, by the file that declares it

A step: prompts -> G samples each (log-probs mu) -> rewards -> advantages -> updates.
Features off by default live in nanorl/, a file each, called only when their flag or
column is on. The words (score, reward, episode return, episodes, old_logp, value targets)
mean one thing each: docs/guides.md#words.
"""
import copy
import time
from collections import Counter, deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch

import losses
from model import generate, logprobs, seeded
from nanorl import (asyncrl, cliff, cov, distill, explore, loop, offpolicy, pref, remax,
                    rm, rollout_log, rows, turns)
from nanorl.config import UserError, check_bounds, run_cli
from nanorl.ddp import all_reduce, bf16_default, mean_over_ranks, world_size
from nanorl.evaluate import Task, evaluate_policy, load_policy, pass_k_name
from nanorl.rm import RewardModel
from verify import overlong_penalty

SHOWN = ("loss reward_mean rm_reward accuracy margin pair_accuracy z n_groups "
         "zero_std_frac entropy resp_len logp_mismatch explained_variance "
         "old_mu_seq_mean").split()  # the step's line


@dataclass  # and the flags of the loop, the losses (None: the row's) and the features
class Config(rm.Flags, pref.Flags, distill.Flags, offpolicy.Flags, rollout_log.Flags,
             explore.Flags, losses.Knobs, loop.LoopConfig):
    loss: str = "grpo"  # a row of losses.ALGOS
    out_dir: str = ""  # "" = out/rl-<loss>
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    max_iters: int = 300
    lr: float = 2e-4  # a fresh optimizer at SFT's lr collapses the policy
    min_lr: Optional[float] = None  # the cosine decay's end; None: lr, constant
    warmup_iters: int = 10
    weight_decay: float = 0.0
    eval_interval: int = 25  # held-out eval this often, at step 0 and at the end
    prompts_per_step: int = 64
    group_size: int = 16  # G samples per prompt
    temperature: float = 1.0  # sampler and loss; the end of temperature_start's anneal
    env_args: dict = field(default_factory=dict)  # the task's environment's arguments
    max_new_tokens: Optional[int] = None  # None: the SFT checkpoint's
    dynamic_sampling: bool = True  # drop groups without signal, refill them
    max_refills: int = 4  # extra rollout rounds per step
    overlong_window: Optional[int] = None  # DAPO's shaping, None = the row's; it counts
    # every response token, the environment's too: they fill max_new_tokens as well
    prompt_selection: bool = True  # skip once a prompt last seen all-equal
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 256  # rows per forward/backward: memory
    sample_batch_size: int = 256  # rows per sampler call: memory
    eval_samples: int = 8  # samples per test problem: pass@1, pass@8, KL to the reference
    bf16: Optional[bool] = None  # autocast rollouts and updates; None = on CUDA
    compile: bool = False  # torch.compile the training forward


@dataclass
class Run:  # what setup builds once and every step reads
    model: torch.nn.Module  # the policy
    compiled: torch.nn.Module  # the policy as updates run it: torch.compile'd, or itself
    ref: torch.nn.Module  # the frozen reference
    opt: torch.optim.Optimizer
    task: Task  # tokenizer, verifier, environment, this rank's train rows, val, test
    prompts: rows.PromptSampler  # seeded epochs over task.train
    hp: dict  # the row's hyperparameters (adaptive KL moves beta)
    rm: Optional[RewardModel] = None
    teacher: Optional[torch.nn.Module] = None
    queue: deque = field(default_factory=deque)  # (rollout, sampling stats) to train on
    state: loop.State = field(default_factory=loop.State)  # a resume restores it
    counts: Counter = field(default_factory=Counter)  # (state, action) -> N: explore.py
    values: dict = field(default_factory=dict)  # state -> (N, V): VinePPO's value table

# -------------------- rollouts, rewards


def rollout(cfg, algo, run, idx, gen, G, temperature):
    """G scored samples of each train problem of idx -> a Rollout."""
    task, tok = run.task, run.task.tok
    problems, parts = [task.train[i] for i in idx], []
    prompts = rows.encode_prompts(tok, [p for p, _ in problems], task.reverse)
    n = max(1, cfg.sample_batch_size // G)  # prompts per sampler call
    for i in range(0, len(problems), n):
        episodes = task.episodes(problems[i:i + n], G)  # None without an environment
        out = generate(run.model, prompts[i:i + n], cfg.max_new_tokens, tok.eos_id, tok.pad_id,
                       G=G, temperature=temperature, generator=gen, episodes=episodes)
        parts.append(scored(cfg, algo, run, out, problems[i:i + n], G, episodes))
    batch = rows.cat(parts)
    if algo.advantage == "first_wrong":  # CLIFF: against the gold answer's tokens
        batch.first_wrong = cliff.first_wrong(batch, task.gold_rows(problems), G)
    return batch


def scored(cfg, algo, run, out, problems, G, episodes):
    """A sampler call's result -> its Rollout: each row's score (a group's identical
    samples scored once) and reward, with DAPO's overlong shaping and an environment's
    turn rewards (and the count bonus's)."""
    P, window, seen, task = out["prompt_len"], cfg.overlong_window, {}, run.task
    batch = rows.Rollout(ids=out["ids"], offsets=out["offsets"], mask=out["action_mask"][:, P:],
                    mu=out["logps"], old_logp=out["logps"], turn_rewards=out.get("turn_rewards"),
                    length=out["response_mask"][:, P:].sum(1).float(), version=out.get("version"))
    responses, score, shaped = rows.responses(batch), [], []
    for r, (ids, act) in enumerate(zip(responses, batch.mask.tolist())):
        key = (r // G, *ids)  # one problem, so one answer (and one secret) per group
        if key not in seen:
            seen[key] = task.score(ids, act, problems[r // G], episodes, r)
        penalty = overlong_penalty(len(ids), cfg.max_new_tokens, window) if window else 0
        score.append(seen[key])
        shaped.append(seen[key] + penalty)
    dev = batch.ids.device
    batch.score, batch.reward = torch.tensor(score, device=dev), torch.tensor(shaped, device=dev)
    batch.finished = torch.tensor([ids[-1:] == [task.tok.eos_id] for ids in responses], device=dev)
    if episodes:  # an environment: its turns' rewards join the reward
        batch.turns, batch.invalid = (t.to(dev) for t in episodes.stats())
        batch.reward = batch.reward + batch.turn_rewards.sum(1)
        if cfg.count_bonus or cfg.repeat_penalty:  # exploration: nanorl/explore.py
            batch = explore.bonus(cfg, run.counts, batch, episodes, G)
    if algo.binary and ((batch.reward != 0) & (batch.reward != 1)).any():
        raise UserError(f"{cfg.loss} needs 0/1 rewards; this task gave partial credit or "
                        "rewards every turn")
    return batch


def collect(cfg, algo, run, gen):
    """This rank's prompts x G samples -> (Rollout or None, stats). Dynamic sampling
    drops groups without signal and refills, up to max_refills more rounds."""
    parts, n_groups, n_sampled, n_flat, G, extra = [], 0, 0, 0, cfg.group_size, {}
    # every row sampled, dropped or not: tokens, rows cut short, groups all lost or won
    n_tok, n_cut, n_lost, n_won = 0.0, 0, 0, 0  # n_lost: groups all scored 0
    want = cfg.prompts_per_step // world_size()
    for _ in range(1 + (cfg.max_refills if cfg.dynamic_sampling else 0)):
        idx = run.prompts.take(want - n_groups)
        batch = rollout(cfg, algo, run, idx, gen, G, cfg.temperature)
        n_tok, n_cut = n_tok + batch.length.sum().item(), n_cut + int((~batch.finished).sum())
        if run.rm:  # the reward model's score instead of the verifier's
            run.rm.score(batch, cfg.rm_normalize, update=True)
        # (groups, G) each row's reward without DAPO's shaping, the signal tested below
        R = (batch.reward if run.rm else batch.episode_return()).view(-1, G)
        if "greedy" in algo.needs:  # ReMax: each prompt's greedy answer
            greedy = rollout(cfg, algo, run, idx, gen, 1, 0.0)
            n_tok += greedy.length.sum().item()
            R, extra = remax.baseline(batch, greedy, R, run.rm, cfg.rm_normalize, extra)
        flat = R.max(1).values == R.min(1).values  # (groups,) no signal
        lo, hi = batch.score.view(-1, G).aminmax(dim=1)  # (groups,) each
        n_lost, n_won = n_lost + int((hi <= 0).sum()), n_won + int((lo >= 1).sum())
        run.prompts.record(idx, flat)
        n_sampled, n_flat = n_sampled + len(idx), n_flat + int(flat.sum())
        # dynamic sampling (DAPO): only the groups with signal, refilled up to want
        batch = rows.take(batch, (~flat).repeat_interleave(G)) if cfg.dynamic_sampling else batch
        if len(batch.ids):  # VinePPO's values, GiGPO's states: nanorl/turns.py
            parts.append(batch if algo.advantage not in turns.KINDS else
                         turns.credit(cfg, algo, run, batch, idx, flat, gen))
            n_groups += len(batch.ids) // G
        if not cfg.dynamic_sampling or n_groups >= want:
            break
    cut, sampled = all_reduce([n_cut, n_sampled * G]).tolist()  # all cut: the line warns
    stats = {"rl/zero_std_frac": n_flat / n_sampled, "rl/n_groups": n_groups,
             "rl/all_lost_frac": n_lost / n_sampled, "rl/all_won_frac": n_won / n_sampled,
             "rl/sampled_truncated_frac": cut / sampled, "perf/rollout_tokens": n_tok,
             **{k: v / n_sampled for k, v in extra.items()}}
    return (rows.cat(parts) if parts else None), stats

# -------------------- advantages


def advantages(cfg, algo, hp, batch, ref_lp):
    """The row's kind's (N,) or (N, L) advantages (ADVANTAGES), its objective's inputs."""
    R = batch.reward  # (N,) a token kind spreads beta's k1 over the tokens itself
    if algo.kl == "reward" and hp["beta"] and algo.advantage not in (*TOKEN_KINDS, "signed"):
        R = losses.kl_in_reward(R, batch.old_logp, ref_lp, batch.mask, hp["beta"]).sum(1)
    return ADVANTAGES[algo.advantage](cfg, algo, hp, batch, R, ref_lp)


def group_kind(cfg, algo, hp, batch, R, ref_lp):
    """(N,) each reward against its group's (losses.group_advantages); GAPO's inputs."""
    G, inputs = cfg.group_size, {}
    if "group_correct" in algo.needs:  # each group's right answers
        inputs = dict(group_correct=batch.score.view(-1, G).sum(1).repeat_interleave(G),
                      group_size=G)
    return losses.group_advantages(R.view(-1, G), algo.advantage).flatten(), inputs


def pass_k_kind(cfg, algo, hp, batch, R, ref_lp):
    """(N,) pass@k training's: each sample's share of its group's best-of-k."""
    G = cfg.group_size
    return losses.pass_k_advantages(R.view(-1, G), hp["pass_k"]).flatten(), {}


def cliff_kind(cfg, algo, hp, batch, R, ref_lp):
    """(N, L) CLIFF's: the group's, split at a wrong answer's first wrong token."""
    G, L = cfg.group_size, batch.mask.size(1)
    adv = losses.cliff_advantages(R.view(-1, G), batch.first_wrong.view(-1, G),
                                  batch.mask.view(-1, G, L))
    return adv.flatten(0, 1), {}


def token_kind(cfg, algo, hp, batch, R, ref_lp):
    """GAE (PPO), return-to-go (REINFORCE++) or VinePPO's turn advantages of the rewards
    -beta k1 + R at the end, whitened over all ranks, or GiGPO's -> ((N, L), inputs)."""
    kind, G = algo.advantage, cfg.group_size
    if kind == "rpp_baseline":  # R minus its group's mean first
        R = losses.group_advantages(R.view(-1, G), "mean").flatten()
    m, turn_rewards = batch.mask, batch.turn_rewards  # (N, L) each; no environment: None
    if turn_rewards is not None:  # each turn's reward at its token, the rest at the last
        R = R - turn_rewards.sum(1)
    beta = 0.0 if kind == "step_group" else hp["beta"]  # GiGPO's KL term: in the loss
    ref = ref_lp if beta else batch.old_logp  # beta 0: no KL term
    rewards = losses.kl_in_reward(R, batch.old_logp, ref, m, beta)
    if turn_rewards is not None:
        rewards = rewards + turn_rewards
    if kind == "step_group":  # the episode's advantage in its group + the turn's in its
        groups = torch.arange(len(m), device=m.device) // G  # (N,)
        turn = losses.step_advantages(rewards, batch.states, groups, m, hp["gamma"])
        episode = losses.group_advantages(rewards.sum(1).view(-1, G), "std").flatten()
        return torch.where(m.bool(), episode[:, None] + hp["step_weight"] * turn, 0.0), {}
    gae = kind == "gae"
    v = batch.values if gae else torch.zeros_like(rewards)  # V = 0, gamma = lam = 1
    gamma, lam = (hp["gamma"], hp["lam"]) if gae else (1.0, 1.0)
    if kind == "vine":  # a turn's r + V(next state) - V(its state), V from branches
        adv = losses.vine_advantages(rewards, batch.values, m)
    else:
        adv, targets = losses.gae(rewards, v, m, gamma, lam)
    # count, sum and squares over every rank's tokens: ranks whiten as one process does
    n, s, s2 = all_reduce([m.sum(), losses.masked_sum(adv, m),
                           losses.masked_sum(adv * adv, m)]).tolist()
    adv = losses.whiten(adv, m, s / n, s2 / n - (s / n) ** 2)
    return adv, (dict(old_values=v, value_targets=targets) if gae else {})


def signed_kind(cfg, algo, hp, batch, R, ref_lp):
    """(N, L) NSR's and W-REINFORCE's: no baseline, each turn's reward and the outcome; beta's
    in-reward KL per token, -beta k1 summed from the token on (REINFORCE++'s return-to-go)."""
    turn_rewards, m = batch.turn_rewards, batch.mask  # the outcome: R without the turns'
    outcome = R if turn_rewards is None else R - turn_rewards.sum(1)
    adv = losses.signed_advantages(outcome, turn_rewards, m, hp["pos_weight"])
    if hp["beta"]:
        kl = losses.kl_in_reward(torch.zeros_like(R), batch.old_logp, ref_lp, m, hp["beta"])
        adv = adv + losses.gae(kl, torch.zeros_like(kl), m, 1.0, 1.0)[0]  # (N, L)
    return adv, {}


TOKEN_KINDS = ("gae", "rpp", "rpp_baseline", *turns.KINDS)  # (N, L), their KL per token
ADVANTAGES = {  # Algo.advantage -> f(cfg, algo, hp, batch, R, ref_lp) -> (adv, inputs)
    **dict.fromkeys(losses.GROUP_KINDS, group_kind),
    **dict.fromkeys(TOKEN_KINDS, token_kind),  # GAE, REINFORCE++, VinePPO, GiGPO
    "greedy": lambda cfg, algo, hp, batch, R, ref_lp: (R - batch.baseline, {}),  # ReMax
    "signed": signed_kind,  # NSR, W-REINFORCE
    "pass_k": pass_k_kind,
    "first_wrong": cliff_kind}  # distillation's (teacher, None): distill.advantages

# -------------------- a step


def sample(cfg, algo, run, gen):
    """collect, timed -> (this step's Rollout or None, stats with tokens per second)."""
    t0, dev = time.time(), next(run.model.parameters()).device
    with torch.autocast(dev.type, torch.bfloat16) if cfg.sampler_bf16 else nullcontext():
        batch, stats = collect(cfg, algo, run, gen)
    stats["perf/rollout_s"] = dt = time.time() - t0
    stats["perf/rollout_tok_s"] = stats["perf/rollout_tokens"] / dt  # every token sampled
    return batch, stats


def pg_step(cfg, algo, run, lr, gen):
    """One step of a policy-gradient row: sample, then train on the rollout (or, with
    --staleness=k, on the one of k steps ago) -> the step's sampling stats and the update's."""
    batch, stats = sample(cfg, algo, run, gen)
    if cfg.staleness:  # the off-policy lab: the rollout of k steps ago, or (None, {})
        old = offpolicy.stale(run.queue, batch, stats, cfg.staleness)
        return {**train(cfg, algo, run, *old, lr, gen), **mean_over_ranks(stats)}
    return train(cfg, algo, run, batch, stats, lr, gen)


def train(cfg, algo, run, batch, sampled, lr, gen):
    """Train on a Rollout (None on any rank: no update) with its sampling stats: pg_step's,
    the async sampler's or --replay's -> those stats and the update's, averaged over ranks."""
    if all_reduce(float(batch is None), "max").item():  # on any rank: no update
        if cfg.log_rollouts < 0 and cfg.log_every == 1:  # a replayable log holds it too
            rollout_log.write(cfg, run, None, sampled, None, None)
        return mean_over_ranks(sampled)
    ref_lp, adv, inputs, lab = prepare(cfg, algo, run, batch)  # lab: the off-policy lab's
    if cfg.log_rollouts and (run.state.step == 0 or (run.state.step + 1) % cfg.log_every == 0):
        rollout_log.write(cfg, run, batch, sampled, adv, ref_lp)  # nanorl/rollout_log.py
    stats = {**sampled, **lab, **update(cfg, algo, run, batch, lr, gen, adv=adv,
                                        inputs=inputs, ref_lp=ref_lp)}
    stats = mean_over_ranks({**stats, **rollout_metrics(
        batch, ref_lp, inputs.get("value_targets"), run.hp.get("beta"))})
    if run.hp.get("kl_target"):  # PPO's adaptive KL controller, on every rank's rows
        n = all_reduce(len(batch.ids)).item()  # the rows trained on
        run.hp["beta"] = losses.adaptive_beta(run.hp["beta"], stats["rl/kl_k1_seq"],
                                              run.hp["kl_target"], n)
    return stats


def pref_step(cfg, algo, run, lr, gen):
    """One step of a preference or supervised row (nanorl/pref.py) -> its stats: online
    pairs from this step's samples, else from the data files."""
    batch, stats = (None, {}) if pref.offline(cfg, algo) else sample(cfg, algo, run, gen)
    out = pref.step(cfg, algo, run, batch, lr)  # {}: some rank had no rows, none updated
    metrics = rollout_metrics(batch) if out and batch else {}
    return mean_over_ranks({**stats, **out, **metrics})


def explained_variance(values, targets, mask):
    """1 - Var(targets - values) / Var(targets) over the masked tokens: 1 = exact."""
    unexplained = losses.masked_var(targets - values, mask)
    return 1 - unexplained / losses.masked_var(targets, mask).clamp_min(1e-8)


def rollout_metrics(batch, ref_lp=None, value_targets=None, beta=None):
    """A rollout's rl/ diagnostics: reward, accuracy, lengths (the policy's tokens),
    episodes; the KL to the reference if it ran; PPO's value fit (given targets); RM's."""
    m, old = batch.mask, batch.old_logp  # (N, L) each
    out = {"rl/reward_mean": batch.reward.mean().item(),
           "rl/accuracy": (batch.score == 1).float().mean().item(),
           "rl/resp_len": m.sum(1).float().mean().item(),
           "rl/empty_frac": (batch.length <= 1).float().mean().item(),
           "rl/truncated_frac": 1 - batch.finished.float().mean().item()}
    if ref_lp is not None:
        out["rl/kl"] = losses.masked_mean(losses.kl_estimate(old, ref_lp, "k3"), m).item()
    if value_targets is not None:  # PPO's value fit
        k1 = 0.0 if ref_lp is None else losses.masked_sum(old - ref_lp, m, 1).mean().item()
        ev = explained_variance(batch.values, value_targets, m).item()
        out.update({"rl/explained_variance": ev, "rl/beta": beta, "rl/kl_k1_seq": k1,
                    "rl/values_mean": losses.masked_mean(batch.values, m).item(),
                    "rl/value_target_mean": losses.masked_mean(value_targets, m).item()})
    if batch.turns is not None:  # an environment's episodes; their return: unshaped
        invalid = batch.invalid.sum() / batch.turns.sum().clamp_min(1)
        out.update({"rl/turns": batch.turns.mean().item(), "rl/invalid_frac": invalid.item(),
                    "rl/env_token_frac": 1 - (m.sum() / batch.length.sum()).item(),
                    "rl/episode_return": batch.episode_return().mean().item()})
    if batch.rm_reward is not None:
        out["rl/rm_reward"] = batch.rm_reward.mean().item()
    return out


@torch.no_grad()
def prepare(cfg, algo, run, batch):
    """-> (ref log-probs for a KL term, advantages, the objective's inputs, the off-policy
    lab's stats)."""
    max_rows, ref_lp, stats = cfg.micro_batch_size, None, {}
    if algo.kl and run.hp["beta"]:
        ref_lp = logprobs(run.ref, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                          max_rows=max_rows)[0]
    # the off-policy lab, and bf16: the sampler's mu is not the trainer's pi_old
    if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:
        stats = offpolicy.recompute(run.model, batch, cfg)
    if "values" in algo.needs:  # PPO's V_old, as the update's forward computes V
        lp, head, _ = logprobs(run.model, batch.ids, batch.offsets, batch.mask,
                               cfg.temperature, scalar=True, max_rows=max_rows)
        batch.values = torch.where(batch.mask.bool(), losses.prefix_value(head, lp), 0.0)
    if run.teacher is not None:  # distillation: from the teacher's log-probs [and logits]
        adv, inputs = distill.advantages(run.teacher, batch, cfg, algo)
    else:
        adv, inputs = advantages(cfg, algo, run.hp, batch, ref_lp)
    if cfg.rollout_is != "none" or cfg.decoupled:  # the off-policy lab's corrections
        adv, stats = offpolicy.weigh(adv, batch, cfg, algo, stats)
    return ref_lp, adv, inputs, stats


def update(cfg, algo, run, batch, lr, gen, adv, inputs, ref_lp):
    """ppo_epochs x minibatches updates; losses divide by the minibatch's counts over all
    ranks, so micro-batches and ranks add up. Stats: each one's mean over the updates that
    measured it (the sampler gap and the entropy: the first update's)."""
    N, G = len(batch.ids), cfg.group_size
    micro = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    fewest = int(all_reduce(N, "min").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:  # dynamic sampling kept few groups
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} rows")
    updates = []  # each optimizer step's stats
    for epoch in range(cfg.ppo_epochs):
        order = torch.arange(N) if cfg.minibatches == 1 else \
            torch.randperm(N, generator=gen, device=gen.device)
        # exactly `minibatches` parts; the first update's pi = pi_old: the sampler gap
        for i, mb in enumerate(order.tensor_split(cfg.minibatches)):
            run.opt.zero_grad()
            loss, stats = accumulate(cfg, algo, run, batch, mb, micro, gen, adv=adv,
                                     inputs=inputs, ref_lp=ref_lp, first=epoch == i == 0)
            gnorm = loop.optimizer_step(run.model, run.opt, loss, lr, cfg.grad_clip)
            updates.append(stats)
    keys = dict.fromkeys(k for stats in updates for k in stats)  # every stat, in order
    measured = {k: [stats[k] for stats in updates if k in stats] for k in keys}
    # each rank's loss is its share of the batch's (it divides by all counts): x ranks
    last = {"rl/loss": loss.item() * world_size(), "rl/grad_norm": gnorm.item()}
    means = {f"rl/{k}": sum(v) / len(v) for k, v in measured.items()}  # over the updates
    return {**means, **last, "rl/lr": lr, "rl/n_tokens": batch.mask.sum().item()}


def accumulate(cfg, algo, run, batch, mb, micro, gen, adv, inputs, ref_lp, first):
    """Backward of minibatch mb in micro-batches -> (its loss, its stats)."""
    n_tokens, n_seqs = all_reduce([batch.mask[mb].sum(), len(mb)]).clamp_min(1).tolist()
    if algo.select:  # Clip-/KL-Cov: the tokens chosen over the minibatch
        chosen = torch.zeros_like(batch.mask, dtype=torch.bool)  # (N, L)
        chosen[mb] = cov.select(run.model, batch, mb, adv, run.hp, cfg, algo.select,
                                micro, gen, moved=not first)
        inputs = {**inputs, "cov_mask": chosen}
    bonus, total, stats = bool(run.hp.get("ent_coef")), 0.0, {}  # bonus: PPO's entropy
    for ub in mb.split(micro):
        part = rows.take(batch, ub)
        lp, head, logits = logprobs(run.compiled, part.ids, part.offsets, part.mask,
                                    cfg.temperature, "values" in algo.needs, logits=True)
        m = part.mask  # (n, L)
        kw = {k: v[ub] if torch.is_tensor(v) else v for k, v in inputs.items()}
        if "values" in algo.needs:  # PPO's value head and its entropy bonus
            kw["values"] = losses.prefix_value(head, lp)
            kw.update({"entropy": losses.token_entropy(logits)} if bonus else {})
        if "teacher_logits" in algo.needs:  # the student's next-token distribution
            kw["logits"] = logits
        ref = None if ref_lp is None else ref_lp[ub]
        loss, micro_stats = losses.algo_loss(algo, run.hp, lp, part.old_logp, adv[ub], m,
                                             ref, n_tokens=n_tokens, n_seqs=n_seqs, **kw)
        loss.backward()
        total += loss.detach()
        if first:  # the trainer against the sampler, where pi = pi_old
            micro_stats.update(sampler_gap(lp.detach(), logits.detach(), part.mu, m))
        w = (m.sum() / batch.mask[mb].sum().clamp_min(1)).item()  # token-weighted means
        loop.add_stats(stats, micro_stats, w)
    return total, stats


def sampler_gap(lp, logits, mu, m):
    """The first update's entropy and |log pi - mu|, max and mean (its ratio is 1)."""
    d = (lp - mu).abs() * m  # (n, L)
    return dict(logp_mismatch=d.max(), logp_mismatch_mean=losses.masked_mean(d, m),
                entropy=losses.masked_mean(losses.token_entropy(logits), m))

# -------------------- setup, check, resume, save


def check(cfg):
    """-> (cfg with the row's defaults and dynamic sampling decided, the row of --loss,
    its hyperparameters) or one line."""
    try:  # an unknown loss or knob is an error; None: the row's default
        hp = losses.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in losses.KNOBS})
    except ValueError as e:
        raise UserError(str(e)) from None
    algo = losses.ALGOS[cfg.loss]
    window = algo.overlong if cfg.overlong_window is None else cfg.overlong_window
    cfg = replace(cfg, out_dir=cfg.out_dir or f"out/rl-{cfg.loss}", overlong_window=window)
    check_bounds(cfg, "temperature > 0", "group_size >= 2", "max_refills eval_samples >= 0",
                 "prompts_per_step pairs_per_step ppo_epochs minibatches sample_batch_size "
                 "micro_batch_size max_new_tokens >= 1")
    if cfg.overlong_window and (algo.binary or algo.family != "pg" or "teacher" in algo.needs):
        why = "needs binary rewards" if algo.binary else "does not learn from rewards"
        raise UserError(f"{cfg.loss} {why}: DAPO's overlong shaping must be off "
                        "(--overlong_window=0)")
    if not 1 <= hp.get("pass_k", 1) < cfg.group_size:  # pass@k of a group: k below G
        raise UserError(f"pass_k={hp['pass_k']} must be in [1, group_size - 1 = "
                        f"{cfg.group_size - 1}]")
    if algo.on_policy and cfg.ppo_epochs * cfg.minibatches > 1:  # no ratio for a 2nd step
        raise UserError(f"{cfg.loss} takes one optimizer step per batch: ppo_epochs and "
                        "minibatches must be 1")
    if cfg.staleness or cfg.sampler_bf16 or cfg.rollout_is != "none" or cfg.decoupled:
        offpolicy.check(cfg, algo)  # the off-policy lab
    if cfg.reward != "verifier":  # the reward model
        rm.check(cfg, algo)
    if algo.family != "pg" or cfg.pairs != "offline":  # preference and supervised rows
        pref.check(cfg, algo)
    if "teacher" in algo.needs:  # distillation
        distill.check(cfg, algo)
    pairs = algo.data in ("pairs", "labels")  # online: a right and a wrong answer a group
    dynamic = cfg.dynamic_sampling and algo.family == "pg" and not algo.flat_teaches
    return replace(cfg, dynamic_sampling=pairs or dynamic), algo, hp


def setup(cfg, algo, hp, dev, rank, world):
    """-> (cfg with the SFT checkpoint's max_new_tokens if unset, a Run: the policy, the
    reference, the optimizer, this rank's data, a reward model, a teacher)."""
    model, task = load_policy(cfg.sft_ckpt, "values" in algo.needs, dev, cfg.env_args)
    # unset: the SFT checkpoint's, which every answer (or episode) of its task fits
    cfg = replace(cfg, max_new_tokens=cfg.max_new_tokens or task.max_new_tokens)
    if "max_new_tokens" in hp:  # dr_grpo's constant normaliser
        hp["max_new_tokens"] = cfg.max_new_tokens
    task.check(cfg.max_new_tokens, model.config.block_size)
    if algo.advantage == "first_wrong":  # the gold answers' tokens
        cliff.check(task)
    if algo.advantage in turns.KINDS:  # the turns
        turns.check(cfg, algo, task)
    offline = algo.family != "pg" and pref.offline(cfg, algo)  # a step of data files
    task.train = (pref.data(cfg, algo, task) if algo.family != "pg" else task.train)[rank::world]
    select = cfg.prompt_selection and not algo.flat_teaches and not offline
    rm = RewardModel.load(cfg.rm_ckpt, task.tok, dev) if cfg.reward == "rm" else None
    teacher = distill.load(cfg.teacher_ckpt, task.tok, dev) if "teacher" in algo.needs else None
    return cfg, Run(model=model, compiled=torch.compile(model) if cfg.compile else model,
                    ref=copy.deepcopy(model).requires_grad_(False), task=task, hp=hp,
                    opt=loop.adamw(model, cfg.lr, cfg.weight_decay, hp.get("vf_lr_mult")),
                    prompts=rows.PromptSampler(len(task.train), ("prompts", cfg.seed, rank),
                                               select), rm=rm, teacher=teacher)


def resume(cfg, run, rank, run_config):
    """Continue exactly: weights, optimizer, loop state; each rank's prompt sampler,
    count-bonus counts, value table, queued rollouts and reward-model statistics."""
    run.state, ck = loop.resume(cfg, run.model, run.opt, run.task.tok, rank == 0, run_config)
    run.hp, rank_state = ck["hparams"], ck["ranks"][rank]
    run.prompts.load_state_dict(rank_state["sampler"])
    run.counts = Counter(dict(rank_state["counts"]))
    run.values = dict(rank_state["values"])
    dev = next(run.model.parameters()).device
    run.queue.extend((rows.from_dict(batch, dev), stats)
                     for batch, stats in rank_state["queue"])
    if run.rm:
        run.rm.load_state_dict(rank_state["rm"])


def save(cfg, run, run_config, name):
    """ckpt.pt or best.pt, with each rank's sampler, counts, values, queue and RM state."""
    rank_state = {"sampler": run.prompts.state_dict(), "counts": [*run.counts.items()],
                  "values": [*run.values.items()], "rm": run.rm and run.rm.state_dict(),
                  "queue": [(rows.to_dict(batch), stats) for batch, stats in run.queue]}
    loop.save(cfg, name, run.model, run.opt, run_config, run.state, run.task.tok, rank_state,
              hparams=run.hp)

# -------------------- the loop


def evaluate(cfg, run, clock):
    """Rank 0's held-out eval (test and val), logged -> its metrics."""
    gen = seeded(next(run.model.parameters()).device, "eval", cfg.seed, run.state.step)
    m, shown = evaluate_policy(run.model, run.ref, run.task, cfg, gen)
    return clock.log_eval({**m, "perf/train_s": run.state.train_s, "eval/examples": shown})


def line(cfg, stats):
    """The step's progress line: the numbers SHOWN, and a warning if no answer ended."""
    shown = [f"{k} {stats['rl/' + k]:.4g}" for k in SHOWN if "rl/" + k in stats]
    if stats.get("rl/sampled_truncated_frac") == 1:  # no reward to learn from
        shown.append(f"WARNING: every rollout ran out of max_new_tokens={cfg.max_new_tokens}")
    return " ".join(shown) or "no update"


def main(cfg):
    cfg, algo, hp = check(cfg)
    dev, rank, world = loop.start(cfg, positive=("log_every",))
    cfg = replace(cfg, bf16=dev.type == "cuda" and bf16_default(dev) if cfg.bf16 is None
                  else cfg.bf16)  # None: bf16 on CUDA where native; RL on CPU stays fp32
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError(f"prompts_per_step and pairs_per_step must divide by the {world} ranks")
    cfg, run = setup(cfg, algo, hp, dev, rank, world)
    run_config = {**asdict(cfg), **run.task.settings(), "ranks": world}
    if cfg.resume:
        resume(cfg, run, rank, run_config)
    if rank == 0:
        print(f"hparams: {run.hp}", flush=True)
    train_step = pg_step if algo.family == "pg" else pref_step
    if cfg.replay or cfg.async_rollouts or cfg.inflight:  # a sampler process's or a log's
        train_step = asyncrl.Pipeline(cfg, run, rank, world, setup, sample, train) \
            if not cfg.replay else rollout_log.replay(cfg, algo, run, world, rank, train)
    if any(getattr(cfg, k) for k in explore.FLAGS):  # nanorl/explore.py
        train_step = explore.Scheduled(cfg, algo, run.task, train_step)
    hparams = {f"hparams/{k}": v for k, v in run.hp.items() if v is not None}
    with loop.Clock(cfg, run.state, rank, resolved={**run_config, "hparams": run.hp}) as clock:
        if not cfg.resume:
            clock.logger.log({"step": 0, **hparams})
        while True:  # at the top of step s: evaluate, save, stop, as every rank agrees
            now = clock.tick()
            if now.evaluate and rank == 0 and clock.new_best(evaluate(cfg, run, clock)):
                save(cfg, run, run_config, "best.pt")
            if now.save:
                save(cfg, run, run_config, "ckpt.pt")
            if now.stop:
                break
            with clock.step(), torch.autocast(dev.type, torch.bfloat16, enabled=cfg.bf16):
                stats = train_step(cfg, algo, run, loop.lr_at(run.state.step, cfg),
                                   seeded(dev, "rollout", cfg.seed, rank, run.state.step + 1))
            clock.log(stats, line(cfg, stats))
        if rank == 0:
            clock.summary("eval/accuracy", "eval/" + pass_k_name(cfg.eval_samples))
    return {"metrics": run.state.last_eval, "model": run.model, "ref": run.ref}


if __name__ == "__main__":
    run_cli(main, Config)
