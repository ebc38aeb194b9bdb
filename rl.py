"""
RL from the SFT checkpoint. `pg_step` is one step, top to bottom: G answers to each
prompt, sampled and scored (DAPO's dynamic sampling keeps the groups with signal), their
advantages, each micro-batch's loss and backward, an optimizer step. An algorithm, an
entry of losses.ALGOS, declares what differs (its objective, advantage, KL, normaliser);
this loop obeys its columns.

    python rl.py --loss=grpo               # dapo, dr_grpo, ppo, gspo, ...: losses.ALGOS
    python rl.py --loss=ppo --reward=rm    # PPO against a reward_model.py checkpoint
    python rl.py --loss=dpo --pairs=online # preference algorithms; baselines sft, rft
    python rl.py --help                    # every flag, by the file that declares it

What an algorithm or a feature adds is composed in once, at setup: the advantage stage
(advantage_stage: a reference's log-probs, PPO's values, a teacher, the off-policy
weights) and the step (main: the off-policy lab's queue, the async sampler, a replayed
log, the exploration schedule), so a step of the default reads as if they did not exist;
the loop records what a step trained on (after_step: its metrics, PPO's adaptive KL, the
rollout log). The words (row, algorithm, score, reward, episode return, old_logp, value
targets) mean one thing each: docs/guides.md#words.
"""
import copy
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import losses
from model import adamw, generate, logprobs, optimizer_step, responses, seeded
from nanorl import (asyncrl, cliff, cov, distill, explore, loop, offpolicy, pref, remax,
                    rm, rollout_log, rows, turns)
from nanorl.config import UserError, check_bounds, run_cli
from nanorl.ddp import Ranks, bf16_default
from nanorl.evaluate import Task, evaluate_policy, load_policy, pass_k_name
from nanorl.rm import RewardModel
from tokenizer import final_text
from verify import episode_return, overlong_penalty

SHOWN = ("loss reward_mean rm_reward accuracy margin pair_accuracy z n_groups "
         "zero_std_frac entropy resp_len logp_mismatch explained_variance "
         "old_mu_seq_mean").split()  # the step's line


@dataclass  # and the loop's flags, the knobs (None: the algorithm's), the features'
class Config(rm.Flags, pref.Flags, distill.Flags, offpolicy.Flags, rollout_log.Flags,
             explore.Flags, losses.Knobs, loop.LoopConfig):
    loss: str = "grpo"  # an algorithm: an entry of losses.ALGOS
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
    overlong_window: Optional[int] = None  # DAPO's shaping, None: the algorithm's; over
    # every response token, the environment's too: they fill max_new_tokens as well
    prompt_selection: bool = True  # skip once a prompt last seen all-equal
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 256  # rows per forward/backward: memory
    sample_batch_size: int = 0  # rows per sampler call (memory); 0: a round's, in one
    eval_samples: int = 8  # samples per test problem: pass@1, pass@8, KL to the reference
    bf16: Optional[bool] = None  # autocast rollouts and updates; None = on CUDA
    compile: bool = False  # torch.compile the training forward
    full_head: bool = False  # heads at every position, not only where read: older rounding


class PromptSampler:
    """Epochs over n prompts, each in the order seeded by (key, epoch). With selection on,
    a prompt whose group was all right or all wrong at its last visit is skipped once."""

    def __init__(self, n, key, selection):
        self.n, self.key, self.selection = n, key, selection
        self.load_state_dict({"epoch": 0, "pos": 0, "saturated": []})

    def draw(self, k):
        """The next k prompts' indices."""
        out = []
        while len(out) < k:
            if self.pos >= self.n:  # the next epoch, in its own order
                self.load_state_dict({"epoch": self.epoch + 1, "pos": 0,
                                      "saturated": self.saturated})
            i = self.order[self.pos]
            self.pos += 1
            if self.selection and i in self.saturated:
                self.saturated.discard(i)
            else:
                out.append(i)
        return out

    def record(self, idx, flat):
        """flat (len(idx),): the groups without signal, as dynamic sampling tests it."""
        self.saturated |= {i for i, f in zip(idx, flat.tolist()) if f}

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "saturated": sorted(self.saturated)}

    def load_state_dict(self, s):
        self.epoch, self.pos, self.saturated = s["epoch"], s["pos"], set(s["saturated"])
        self.order = torch.randperm(self.n, generator=seeded("cpu", self.key, self.epoch)).tolist()


class OneProcess:
    """The ranks of a plain run: the collectives pg_step asks for, each its own numbers
    (torchrun: nanorl.ddp.Ranks sums, maxes and averages over every rank)."""
    world = 1

    def reduce(self, x, op="sum"):  # -> x as a float64 tensor: ddp.all_reduce's
        return torch.as_tensor(x, dtype=torch.float64).clone()

    def mean(self, stats):
        return stats

    def sync(self, model):  # the gradients are this process's, whole
        pass


@dataclass
class Run:  # what setup builds once and every step reads
    model: torch.nn.Module  # the policy
    compiled: torch.nn.Module  # the policy as updates run it: torch.compile'd, or itself
    ref: torch.nn.Module  # the frozen reference
    opt: torch.optim.Optimizer
    task: Task  # tokenizer, verifier, environment, this rank's train problems, val, test
    prompts: PromptSampler  # seeded epochs over task.train
    hp: dict  # the algorithm's hyperparameters (adaptive KL moves beta)
    rm: Optional[RewardModel] = None
    teacher: Optional[torch.nn.Module] = None
    advantages: Optional[Callable] = None  # advantage_stage: f(cfg, algo, run, batch)
    ranks: object = field(default_factory=OneProcess)  # torchrun: ddp.Ranks
    prompt_ids: list = field(default_factory=list)  # task.train's prompts as token ids
    queue: deque = field(default_factory=deque)  # (rollout, sampling stats) to train on
    state: loop.State = field(default_factory=loop.State)  # a resume restores it
    counts: Counter = field(default_factory=Counter)  # (state, action) -> N: explore.py
    values: dict = field(default_factory=dict)  # state -> (N, V): VinePPO's value table
    trained: Optional[tuple] = None  # (cfg, rollout, stats, adv, inputs): after_step's

# -------------------- rollouts: G scored samples of each prompt


def collect(cfg, algo, run, gen):
    """This rank's prompts x G samples -> (Rollout or None, stats, with tokens per
    second). Dynamic sampling drops the groups without signal and refills, up to
    max_refills more rounds."""
    parts, n_groups, n_sampled, n_flat, G, extra = [], 0, 0, 0, cfg.group_size, {}
    # every row sampled, dropped or not: tokens, rows cut short, groups all 0 or all 1
    t0, n_tok, n_cut, n_lost, n_won = time.time(), 0.0, 0, 0, 0
    want = cfg.prompts_per_step // run.ranks.world
    for _ in range(1 + (cfg.max_refills if cfg.dynamic_sampling else 0)):
        idx = run.prompts.draw(want - n_groups)
        batch = rollout(cfg, algo, run, idx, gen, G, cfg.temperature)
        n_tok, n_cut = n_tok + batch.length.sum().item(), n_cut + int((~batch.finished).sum())
        if run.rm:  # the reward model's score instead of the verifier's
            run.rm.score(batch, cfg.rm_normalize, update=True)
        # (groups, G) each row's reward without DAPO's shaping, the signal tested below
        R = batch.reward if run.rm else episode_return(batch.score, batch.turn_rewards)
        R = R.view(-1, G)
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
        batch = take(batch, (~flat).repeat_interleave(G)) if cfg.dynamic_sampling else batch
        if len(batch.ids):  # VinePPO's values, GiGPO's states: nanorl/turns.py
            parts.append(batch if algo.advantage not in turns.KINDS else
                         turns.credit(cfg, algo, run, batch, idx, flat, gen))
            n_groups += len(batch.ids) // G
        if not cfg.dynamic_sampling or n_groups >= want:
            break
    cut, sampled = run.ranks.reduce([n_cut, n_sampled * G]).tolist()  # all cut: a warning
    stats = {"rl/zero_std_frac": n_flat / n_sampled, "rl/n_groups": n_groups,
             "rl/all_lost_frac": n_lost / n_sampled, "rl/all_won_frac": n_won / n_sampled,
             "rl/sampled_truncated_frac": cut / sampled, "perf/rollout_tokens": n_tok,
             "perf/rollout_s": (dt := time.time() - t0), "perf/rollout_tok_s": n_tok / dt,
             **{k: v / n_sampled for k, v in extra.items()}}  # tok/s: every token sampled
    return (cat(parts) if parts else None), stats


def rollout(cfg, algo, run, idx, gen, G, temperature):
    """G scored samples of each train problem of idx, in sampler calls of
    sample_batch_size rows -> a Rollout."""
    task, tok, parts = run.task, run.task.tok, []
    problems, prompts = [task.train[i] for i in idx], [run.prompt_ids[i] for i in idx]
    # prompts per sampler call
    n = max(1, cfg.sample_batch_size // G) if cfg.sample_batch_size else len(idx)
    for i in range(0, len(problems), n):
        episodes = task.env_module and task.episodes(problems[i:i + n], G)
        out = generate(run.model, prompts[i:i + n], cfg.max_new_tokens, tok.eos_id, tok.pad_id,
                       G=G, temperature=temperature, generator=gen, episodes=episodes)
        parts.append(scored(cfg, algo, run, out, problems[i:i + n], G, episodes))
    batch = cat(parts)
    if algo.advantage == "first_wrong":  # CLIFF: against the gold answer's tokens
        batch.first_wrong = cliff.first_wrong(batch, task.gold_rows(problems), G)
    return batch


def scored(cfg, algo, run, out, problems, G, episodes):
    """A sampler call's result -> its Rollout: each row's score (a group's identical
    samples scored once: the text the policy wrote, graded by the task, or its episode's)
    and reward, with DAPO's overlong shaping and an environment's turn rewards (and the
    count bonus's)."""
    P, window, seen, tok = out["prompt_len"], cfg.overlong_window, {}, run.task.tok
    batch = rows.Rollout(ids=out["ids"], offsets=out["offsets"], mask=out["action_mask"][:, P:],
                         mu=out["logps"], old_logp=out["logps"],
                         turn_rewards=out.get("turn_rewards"), version=out.get("version"),
                         length=out["response_mask"][:, P:].sum(1).float())
    answers, score, shaped = responses(out), [], []
    for r, (ids, act) in enumerate(zip(answers, batch.mask.tolist())):
        key = (r // G, *ids)  # one problem, so one answer (and one secret) per group
        if key not in seen:
            text = final_text(tok, ids, act)
            seen[key] = episodes.score(r, text) if episodes else \
                run.task.grade(text, problems[r // G])
        penalty = overlong_penalty(len(ids), cfg.max_new_tokens, window) if window else 0
        score.append(seen[key])
        shaped.append(seen[key] + penalty)
    dev = batch.ids.device
    batch.score, batch.reward = torch.tensor(score, device=dev), torch.tensor(shaped, device=dev)
    batch.finished = torch.tensor([ids[-1:] == [tok.eos_id] for ids in answers], device=dev)
    if episodes:  # an environment: its turns' rewards join the reward
        batch.turns, batch.invalid = (t.to(dev) for t in episodes.stats())
        batch.reward = batch.reward + batch.turn_rewards.sum(1)
        if cfg.count_bonus or cfg.repeat_penalty:  # exploration: nanorl/explore.py
            batch = explore.bonus(cfg, run.counts, batch, episodes, G)
    if algo.binary and ((batch.reward != 0) & (batch.reward != 1)).any():
        raise UserError(f"{cfg.loss} needs 0/1 rewards; this task gave partial credit or "
                        "rewards every turn")
    return batch


def cat(parts):
    """One Rollout from several: the ids' prompts left-padded to the longest (offsets
    follow), every (N, L) field right-padded."""
    P = max(p.ids.size(1) - p.mask.size(1) for p in parts)
    T = max(p.mask.size(1) for p in parts)

    def fit(p, k, v):  # a part's field, laid out as the joined record's
        left, right = P - (p.ids.size(1) - p.mask.size(1)), T - p.mask.size(1)
        if k == "ids":
            return F.pad(v, (left, right))
        return v + left if k == "offsets" else F.pad(v, (0, right)) if v.dim() == 2 else v
    return type(parts[0])(**{k: None if v is None else torch.cat([fit(p, k, getattr(p, k))
                                                                  for p in parts])
                             for k, v in vars(parts[0]).items()})


def take(batch, index):
    """The Rollout of these rows (a bool mask (N,) or indices) of a Rollout."""
    return type(batch)(**{k: None if v is None else v[index] for k, v in vars(batch).items()})

# -------------------- a step


def pg_step(cfg, algo, run, lr, gen, given=None):
    """One step of a policy-gradient algorithm, top to bottom -> its stats: 1) G answers
    to each prompt, sampled and scored (given: (Rollout, stats) another source made: the
    off-policy lab's queue, the async sampler, a replayed log); 2) their advantages; 3)
    each minibatch's loss and its backward, micro-batch by micro-batch (whole groups),
    every loss divided by the minibatch's counts over all ranks so that they add up; 4)
    its optimizer step. ppo_epochs x minibatches of 3) and 4); stats: each one's mean over
    the updates that measured it."""
    batch, sampled = given or collect(cfg, algo, run, gen)  # 1) the groups with signal
    if run.ranks.reduce(float(batch is None), "max").item():  # on any rank: no update
        run.trained = cfg, None, sampled, None, {}
        return run.ranks.mean(sampled)
    adv, inputs = run.advantages(cfg, algo, run, batch)  # 2) advantage_stage's
    run.trained = cfg, batch, sampled, adv, inputs  # what the loop logs of it: after_step
    updates, G = [], cfg.group_size
    micro = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    for first, mb in minibatches(cfg, run, len(batch.ids), gen):  # 3), 4) each update
        run.opt.zero_grad()
        n_tokens, n_seqs = run.ranks.reduce([batch.mask[mb].sum(), len(mb)]).clamp_min(1).tolist()
        if algo.select:  # Clip-/KL-Cov: the tokens chosen over the minibatch
            chosen = cov.select(cfg, algo, run, batch, mb, adv, micro, gen, first)
            inputs = {**inputs, "cov_mask": chosen}
        total, stats = 0.0, {}
        for ub in mb.split(micro):
            part = take(batch, ub)  # (n, L) each field
            lp, head, logits = logprobs(run.compiled, part.ids, part.offsets, part.mask,
                                        cfg.temperature, "values" in algo.needs, logits=True)
            kw = {k: v[ub] if torch.is_tensor(v) else v for k, v in inputs.items()}
            if algo.needs:  # PPO's values and entropy, GKD's student logits
                kw.update(forward_inputs(algo, run.hp, lp, head, logits))
            loss, micro_stats = losses.algo_loss(algo, run.hp, lp, part.old_logp, adv[ub],
                                                 part.mask, n_tokens=n_tokens, n_seqs=n_seqs, **kw)
            loss.backward()
            total += loss.detach()
            if first:  # pi = pi_old: the trainer against the sampler
                micro_stats.update(sampler_gap(lp.detach(), logits.detach(), part.mu, part.mask))
            share = part.mask.sum() / batch.mask[mb].sum().clamp_min(1)  # of the tokens
            losses.add_stats(stats, micro_stats, share.item())
        run.ranks.sync(run.model)  # the ranks' sum: each divided by the global counts
        gnorm = optimizer_step(run.model, run.opt, total, lr, cfg.grad_clip)
        updates.append(stats)
    stats = update_stats(updates, total, gnorm, lr, batch, run.ranks.world)
    return run.ranks.mean({**sampled, **stats})


def minibatches(cfg, run, N, gen):
    """A step's updates over its N rows: ppo_epochs epochs of `minibatches` parts (in
    order, or permuted by gen) -> (whether it is the first, its rows) each."""
    fewest = int(run.ranks.reduce(N, "min").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:  # dynamic sampling kept few groups
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} "
                        "rows")
    for epoch in range(cfg.ppo_epochs):
        order = torch.arange(N) if cfg.minibatches == 1 else \
            torch.randperm(N, generator=gen, device=gen.device)
        for i, mb in enumerate(order.tensor_split(cfg.minibatches)):  # exactly that many
            yield epoch == i == 0, mb


def forward_inputs(algo, hp, lp, head, logits):
    """What an algorithm's objective reads of the update's own forward: PPO's values V_t
    (its head) and entropy (its bonus), GKD's student logits."""
    kw = {}
    if "values" in algo.needs:  # the value head, as prepare's V_old: advantage_stage
        kw["values"] = losses.prefix_value(head, lp)
        kw.update({"entropy": losses.token_entropy(logits)} if hp.get("ent_coef") else {})
    if "teacher_logits" in algo.needs:  # the student's next-token distribution
        kw["logits"] = logits
    return kw


def sampler_gap(lp, logits, mu, m):
    """The first update's entropy and |log pi - mu|, max and mean (its ratio is 1)."""
    d = (lp - mu).abs() * m  # (n, L)
    return dict(logp_mismatch=d.max(), logp_mismatch_mean=losses.masked_mean(d, m),
                entropy=losses.masked_mean(losses.token_entropy(logits), m))


def update_stats(updates, loss, gnorm, lr, batch, world):
    """The updates' stats, each averaged over those that measured it (the sampler gap and
    the entropy: the first's), and the last update's loss and gradient norm."""
    keys = dict.fromkeys(k for stats in updates for k in stats)  # every stat, in order
    measured = {k: [stats[k] for stats in updates if k in stats] for k in keys}
    # each rank's loss is its share of the batch's (it divides by all counts): x ranks
    last = {"rl/loss": loss.item() * world, "rl/grad_norm": gnorm.item()}
    means = {f"rl/{k}": sum(v) / len(v) for k, v in measured.items()}  # over the updates
    return {**means, **last, "rl/lr": lr, "rl/n_tokens": batch.mask.sum().item()}


def explained_variance(values, targets, mask):
    """1 - Var(targets - values) / Var(targets) over the masked tokens: 1 = exact."""
    unexplained = losses.masked_var(targets - values, mask)
    return 1 - unexplained / losses.masked_var(targets, mask).clamp_min(1e-8)


def rollout_metrics(batch, value_targets=None, beta=None):
    """A rollout's rl/ diagnostics: reward, accuracy, lengths (the policy's tokens),
    episodes; the KL to the reference if it ran; PPO's value fit (given targets); RM's."""
    m, old, ref = batch.mask, batch.old_logp, batch.ref_logp  # (N, L) each
    out = {"rl/reward_mean": batch.reward.mean().item(),
           "rl/accuracy": (batch.score == 1).float().mean().item(),
           "rl/resp_len": m.sum(1).float().mean().item(),
           "rl/empty_frac": (batch.length <= 1).float().mean().item(),
           "rl/truncated_frac": 1 - batch.finished.float().mean().item()}
    if ref is not None:
        out["rl/kl"] = losses.masked_mean(losses.kl_estimate(old, ref, "k3"), m).item()
    if value_targets is not None:  # PPO's value fit
        k1 = 0.0 if ref is None else losses.masked_sum(old - ref, m, 1).mean().item()
        ev = explained_variance(batch.values, value_targets, m).item()
        out.update({"rl/explained_variance": ev, "rl/beta": beta, "rl/kl_k1_seq": k1,
                    "rl/values_mean": losses.masked_mean(batch.values, m).item(),
                    "rl/value_target_mean": losses.masked_mean(value_targets, m).item()})
    if batch.turns is not None:  # an environment's episodes; their return: unshaped
        invalid = batch.invalid.sum() / batch.turns.sum().clamp_min(1)
        out.update({"rl/turns": batch.turns.mean().item(),
                    "rl/invalid_frac": invalid.item(),
                    "rl/env_token_frac": 1 - (m.sum() / batch.length.sum()).item(),
                    "rl/episode_return":
                        episode_return(batch.score, batch.turn_rewards).mean().item()})
    if batch.rm_reward is not None:
        out["rl/rm_reward"] = batch.rm_reward.mean().item()
    return out


def pref_step(cfg, algo, run, lr, gen):
    """One step of a preference or supervised algorithm (nanorl/pref.py) -> its stats:
    online pairs from this step's samples, else from the data files."""
    batch, stats = (None, {}) if pref.offline(cfg, algo) else collect(cfg, algo, run, gen)
    out = pref.step(cfg, algo, run, batch, lr)  # {}: some rank had no rows, none updated
    metrics = rollout_metrics(batch) if out and batch else {}
    return run.ranks.mean({**stats, **out, **metrics})


def after_step(run):
    """What the loop records of a policy-gradient step, from what it trained on
    (run.trained): its rollout's metrics over every rank, PPO's adaptive KL (--kl_target)
    moved by them, the rollout log (nanorl/rollout_log.py) -> the metrics."""
    cfg, batch, sampled, adv, inputs = run.trained
    metrics = {} if batch is None else run.ranks.mean(
        rollout_metrics(batch, inputs.get("value_targets"), run.hp.get("beta")))
    if batch is not None and run.hp.get("kl_target"):  # by every rank's rows trained on
        n = run.ranks.reduce(len(batch.ids)).item()
        run.hp["beta"] = losses.adaptive_beta(run.hp["beta"], metrics["rl/kl_k1_seq"],
                                              run.hp["kl_target"], n)
    if rollout_log.due(run.state.step, cfg, batch):
        rollout_log.write(run, cfg, batch, sampled, adv)
    return metrics

# -------------------- advantages: each kind, and the stage setup composes


def group_kind(cfg, algo, run, batch):
    """(N,) each reward against its group's (losses.group_advantages); GAPO's inputs."""
    G, inputs = cfg.group_size, {}
    if "group_correct" in algo.needs:  # each group's right answers
        inputs = dict(group_correct=batch.score.view(-1, G).sum(1).repeat_interleave(G),
                      group_size=G)
    return losses.group_advantages(batch.reward.view(-1, G), algo.advantage).flatten(), inputs


def pass_k_kind(cfg, algo, run, batch):
    """(N,) pass@k training's: each sample's share of its group's best-of-k."""
    G = cfg.group_size
    return losses.pass_k_advantages(batch.reward.view(-1, G), run.hp["pass_k"]).flatten(), {}


def cliff_kind(cfg, algo, run, batch):
    """(N, L) CLIFF's: the group's, split at a wrong answer's first wrong token."""
    G, L = cfg.group_size, batch.mask.size(1)
    adv = losses.cliff_advantages(batch.reward.view(-1, G), batch.first_wrong.view(-1, G),
                                  batch.mask.view(-1, G, L))
    return adv.flatten(0, 1), {}


def greedy_kind(cfg, algo, run, batch):
    """(N,) ReMax's: each reward against its prompt's greedy answer's (remax.py)."""
    return batch.reward - batch.baseline, {}


def token_kind(cfg, algo, run, batch):
    """GAE (PPO), return-to-go (REINFORCE++) or VinePPO's turn advantages of the rewards
    -beta k1 + R at the end, whitened over all ranks, or GiGPO's -> ((N, L), inputs)."""
    kind, G, R = algo.advantage, cfg.group_size, batch.reward
    if kind == "rpp_baseline":  # R minus its group's mean first
        R = losses.group_advantages(R.view(-1, G), "mean").flatten()
    m, turn_rewards = batch.mask, batch.turn_rewards  # (N, L) each; no environment: None
    if turn_rewards is not None:  # each turn's reward at its token, the rest at the last
        R = R - turn_rewards.sum(1)
    beta = 0.0 if kind == "step_group" else run.hp["beta"]  # GiGPO's KL term: in the loss
    ref = batch.ref_logp if beta else batch.old_logp  # beta 0: no KL term
    rewards = losses.kl_in_reward(R, batch.old_logp, ref, m, beta)
    if turn_rewards is not None:
        rewards = rewards + turn_rewards
    if kind == "step_group":  # the episode's advantage in its group + the turn's in its
        groups = torch.arange(len(m), device=m.device) // G  # (N,)
        turn = losses.step_advantages(rewards, batch.states, groups, m, run.hp["gamma"])
        episode = losses.group_advantages(rewards.sum(1).view(-1, G), "std").flatten()
        return torch.where(m.bool(), episode[:, None] + run.hp["step_weight"] * turn, 0.0), {}
    gae = kind == "gae"
    v = batch.values if gae else torch.zeros_like(rewards)  # V = 0, gamma = lam = 1
    gamma, lam = (run.hp["gamma"], run.hp["lam"]) if gae else (1.0, 1.0)
    if kind == "vine":  # a turn's r + V(next state) - V(its state), V from branches
        adv = losses.vine_advantages(rewards, batch.values, m)
    else:
        adv, targets = losses.gae(rewards, v, m, gamma, lam)
    # count, sum and squares over every rank's tokens: ranks whiten as one process does
    n, s, s2 = run.ranks.reduce([m.sum(), losses.masked_sum(adv, m),
                                 losses.masked_sum(adv * adv, m)]).tolist()
    adv = losses.whiten(adv, m, s / n, s2 / n - (s / n) ** 2)
    return adv, (dict(old_values=v, value_targets=targets) if gae else {})


def signed_kind(cfg, algo, run, batch):
    """(N, L) NSR's and W-REINFORCE's: no baseline, each turn's reward and the outcome;
    beta's in-reward KL per token, -beta k1 summed from the token on (REINFORCE++'s
    return-to-go)."""
    turn_rewards, m, R = batch.turn_rewards, batch.mask, batch.reward
    outcome = R if turn_rewards is None else R - turn_rewards.sum(1)  # R less the turns'
    adv = losses.signed_advantages(outcome, turn_rewards, m, run.hp["pos_weight"])
    if run.hp["beta"]:
        kl = losses.kl_in_reward(torch.zeros_like(R), batch.old_logp, batch.ref_logp, m,
                                 run.hp["beta"])
        adv = adv + losses.gae(kl, torch.zeros_like(kl), m, 1.0, 1.0)[0]  # (N, L)
    return adv, {}


TOKEN_KINDS = ("gae", "rpp", "rpp_baseline", *turns.KINDS)  # (N, L), their KL per token
ADVANTAGES = {  # Algo.advantage -> f(cfg, algo, run, batch) -> (adv, its loss's inputs)
    **dict.fromkeys(losses.GROUP_KINDS, group_kind),
    **dict.fromkeys(TOKEN_KINDS, token_kind),  # GAE, REINFORCE++, VinePPO, GiGPO
    "greedy": greedy_kind,  # ReMax
    "signed": signed_kind,  # NSR, W-REINFORCE
    "pass_k": pass_k_kind,
    "first_wrong": cliff_kind}  # distillation's (teacher, None): distill.advantages


def kl_in_the_reward(kind):
    """A sequence-level kind of an algorithm with its KL in the reward: its reward less
    beta sum_t k1 (token kinds spread it over the tokens themselves)."""
    def with_kl(cfg, algo, run, batch):
        reward = losses.kl_in_reward(batch.reward, batch.old_logp, batch.ref_logp,
                                     batch.mask, run.hp["beta"]).sum(1)  # (N,)
        return kind(cfg, algo, run, replace(batch, reward=reward))
    return with_kl


def values_first(stage):
    """PPO's V_old on the rollout first, as the update's forward computes V."""
    @torch.no_grad()
    def with_values(cfg, algo, run, batch):
        lp, head, _ = logprobs(run.model, batch.ids, batch.offsets, batch.mask,
                               cfg.temperature, scalar=True, max_rows=cfg.micro_batch_size)
        batch.values = torch.where(batch.mask.bool(), losses.prefix_value(head, lp), 0.0)
        return stage(cfg, algo, run, batch)
    return with_values


def reference_first(stage):
    """The frozen reference's log-probs of the rollout first: its KL term's (in the loss
    or in the reward) and the rl/kl metric's."""
    @torch.no_grad()
    def with_reference(cfg, algo, run, batch):
        batch.ref_logp = logprobs(run.ref, batch.ids, batch.offsets, batch.mask,
                                  cfg.temperature, max_rows=cfg.micro_batch_size)[0]
        adv, inputs = stage(cfg, algo, run, batch)
        return adv, {**inputs, "ref_logp": batch.ref_logp}
    return with_reference


def advantages_of(algo, hp, teacher=None):
    """The algorithm's advantages of a rollout that holds what they read (the reference's
    log-probs, PPO's V_old) -> f(cfg, algo, run, batch) -> (adv, inputs): its kind
    (ADVANTAGES) or the teacher's (nanorl/distill.py), none for a preference algorithm; a
    sequence-level kind with its KL in the reward reads the reward less beta sum_t k1."""
    stage = distill.advantages if teacher is not None else ADVANTAGES.get(algo.advantage)
    if algo.kl == "reward" and hp["beta"] and algo.advantage not in (*TOKEN_KINDS, "signed"):
        stage = kl_in_the_reward(stage)
    return stage


def advantage_stage(cfg, algo, hp, teacher):
    """The step's advantages, composed once -> f(cfg, algo, run, batch) -> (adv, inputs):
    advantages_of, with a KL term the reference's log-probs first, PPO's V_old first, the
    off-policy lab's weights after."""
    stage = advantages_of(algo, hp, teacher)
    if "values" in algo.needs:
        stage = values_first(stage)
    if algo.kl and hp["beta"]:
        stage = reference_first(stage)
    if offpolicy.kind(cfg) != "none":  # the off-policy lab's corrections
        stage = offpolicy.weighed(stage)
    return stage

# -------------------- setup, check, resume, save


def check(cfg):
    """-> (cfg with the algorithm's defaults and dynamic sampling decided, the algorithm
    of --loss, its hyperparameters) or one line."""
    try:  # an unknown loss or knob is an error; None: the algorithm's default
        hp = losses.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in losses.KNOBS})
    except ValueError as e:
        raise UserError(str(e)) from None
    algo = losses.ALGOS[cfg.loss]
    window = algo.overlong if cfg.overlong_window is None else cfg.overlong_window
    cfg = replace(cfg, out_dir=cfg.out_dir or f"out/rl-{cfg.loss}", overlong_window=window)
    check_bounds(cfg, "temperature > 0", "group_size >= 2", "max_refills eval_samples "
                 "sample_batch_size >= 0", "prompts_per_step pairs_per_step ppo_epochs "
                 "minibatches micro_batch_size max_new_tokens >= 1")
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
    if offpolicy.on(cfg):  # the off-policy lab
        offpolicy.check(cfg, algo)
    if cfg.reward != "verifier":  # the reward model
        rm.check(cfg, algo)
    if algo.family != "pg" or cfg.pairs != "offline":  # preference, supervised algorithms
        pref.check(cfg, algo)
    if "teacher" in algo.needs:  # distillation
        distill.check(cfg, algo)
    pairs = algo.data in ("pairs", "labels")  # online: a right and a wrong answer a group
    dynamic = cfg.dynamic_sampling and algo.family == "pg" and not algo.flat_teaches
    return replace(cfg, dynamic_sampling=pairs or dynamic), algo, hp


def setup(cfg, algo, hp, dev, rank, world):
    """-> (cfg with the SFT checkpoint's max_new_tokens if unset, a Run: the policy, the
    reference, the optimizer, this rank's data and its prompts' ids, a reward model, a
    teacher, the advantage stage)."""
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
    teacher = distill.load(cfg, task.tok, dev) if "teacher" in algo.needs else None
    model.full_head = cfg.full_head  # the reference's too: a copy
    prompts = [] if offline else rows.encode_prompts(task.tok, [p for p, _ in task.train],
                                                    task.reverse)
    return cfg, Run(model=model, compiled=torch.compile(model) if cfg.compile else model,
                    ref=copy.deepcopy(model).requires_grad_(False), task=task, hp=hp,
                    opt=adamw(model, cfg.lr, cfg.weight_decay, hp.get("vf_lr_mult")),
                    prompts=PromptSampler(len(task.train), ("prompts", cfg.seed, rank), select),
                    rm=rm, teacher=teacher, advantages=advantage_stage(cfg, algo, hp, teacher),
                    ranks=Ranks() if world > 1 else OneProcess(), prompt_ids=prompts)


def resume(cfg, run, rank, run_config):
    """Continue exactly: weights, optimizer, loop state; each rank's prompt sampler,
    count-bonus counts, value table, queued rollouts and reward-model statistics."""
    run.state, ck = loop.resume(cfg, run.model, run.opt, run.task.tok, rank == 0,
                                run_config)
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
    """ckpt.pt or best.pt, with each rank's sampler, counts, values, queue, RM state."""
    rank_state = {"sampler": run.prompts.state_dict(), "counts": [*run.counts.items()],
                  "values": [*run.values.items()], "rm": run.rm and run.rm.state_dict(),
                  "queue": [(rows.to_dict(batch), stats) for batch, stats in run.queue]}
    loop.save(cfg, name, run.model, run.opt, run_config, run.state, run.task.tok,
              rank_state, hparams=run.hp)

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
        shown.append("WARNING: every rollout ran out of "
                     f"max_new_tokens={cfg.max_new_tokens}")
    return " ".join(shown) or "no update"


def train_step(cfg):
    """The step of a policy-gradient algorithm: pg_step, in the off-policy lab where a flag
    opens it (nanorl/offpolicy.py)."""
    return offpolicy.Lab(pg_step, collect) if offpolicy.on(cfg) else pg_step


def main(cfg):
    cfg, algo, hp = check(cfg)
    dev, rank, world = loop.start(cfg, positive=("log_every",))
    cfg = replace(cfg, bf16=dev.type == "cuda" and bf16_default(dev) if cfg.bf16 is None
                  else cfg.bf16)  # None: bf16 on CUDA where native; RL on CPU stays fp32
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError("prompts_per_step and pairs_per_step must divide by the "
                        f"{world} ranks")
    cfg, run = setup(cfg, algo, hp, dev, rank, world)
    run_config = {**asdict(cfg), **run.task.settings(), "ranks": world}
    if cfg.resume:
        resume(cfg, run, rank, run_config)
    if rank == 0:
        print(f"hparams: {run.hp}", flush=True)
    step = train_step(cfg) if algo.family == "pg" else pref_step  # and what wraps it, once:
    if cfg.replay:  # a log's rollouts
        step = rollout_log.replay(cfg, algo, run, world, rank, step)
    elif cfg.async_rollouts or cfg.inflight:  # a sampler process's
        step = asyncrl.Pipeline(cfg, run, rank, world, setup, collect, step)
    if any(getattr(cfg, k) for k in explore.FLAGS):  # nanorl/explore.py
        step = explore.Scheduled(cfg, algo, run.task, step)
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
                stats = step(cfg, algo, run, loop.lr_at(run.state.step, cfg),
                             seeded(dev, "rollout", cfg.seed, rank, run.state.step + 1))
            if run.trained:  # its rollout's metrics and log
                stats = {**stats, **after_step(run)}
            clock.log(stats, line(cfg, stats))
        if rank == 0:
            clock.summary("eval/accuracy", "eval/" + pass_k_name(cfg.eval_samples))
    return {"metrics": run.state.last_eval, "model": run.model, "ref": run.ref}


if __name__ == "__main__":
    run_cli(main, Config)
