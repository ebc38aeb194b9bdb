"""
RL from the SFT checkpoint. A row of losses.ALGOS declares the algorithm; this loop obeys.

    python rl.py --loss=grpo               # dapo, dr_grpo, ppo, gspo, ...: losses.ALGOS
    python rl.py --loss=ppo --reward=rm    # PPO against a reward_model.py checkpoint
    python rl.py --loss=dpo --pairs=online # preference rows; baselines sft, rft
    python rl.py --help                    # every flag, by the file that declares it

A step: prompts -> G samples each (log-probs mu) -> rewards -> advantages -> updates.
Features off by default live in nanorl/, a file each, called only when their flag or column is on.
"""
import copy
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch

import losses
from model import generate, logprobs, seeded
from nanorl import cliff, cov, distill, loop, offpolicy, pref, remax, rm, rows
from nanorl.checkpoint import unwrap
from nanorl.config import UserError, check_bounds, run_cli
from nanorl.ddp import all_reduce, bf16_default, mean_over_ranks, world_size
from nanorl.evaluate import Task, evaluate_policy, load_policy, rollout_metrics
from nanorl.rm import RewardModel
from verify import overlong_penalty

SHOWN = ("loss reward_mean rm_reward accuracy margin pair_accuracy z n_groups zero_std_frac "
         "entropy resp_len logp_mismatch explained_variance old_mu_seq_mean").split()


@dataclass  # and the flags of the loop, the losses (None: the row's) and the features
class Config(rm.Flags, pref.Flags, distill.Flags, offpolicy.Flags, losses.Knobs, loop.LoopConfig):
    loss: str = "grpo"  # a row of losses.ALGOS
    out_dir: str = ""  # "" = out/rl-<loss>
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    max_iters: int = 300
    lr: float = 2e-4  # a fresh optimizer at SFT's lr collapses the policy
    min_lr: Optional[float] = None  # end of the cosine decay; None = lr (constant after warmup)
    warmup_iters: int = 10
    weight_decay: float = 0.0
    eval_interval: int = 25  # held-out eval this often, at step 0 and at the end
    prompts_per_step: int = 64
    group_size: int = 16  # G samples per prompt
    temperature: float = 1.0  # the sampler's and the loss's
    env_args: dict = field(default_factory=dict)  # the task's environment's arguments
    max_new_tokens: Optional[int] = None  # None: the SFT checkpoint's
    dynamic_sampling: bool = True  # drop groups without signal, refill them
    max_refills: int = 4  # extra rollout rounds per step
    overlong_window: Optional[int] = None  # DAPO's shaping, None = the row's; counts every
    # response token, the environment's too: they fill max_new_tokens as the policy's do
    prompt_selection: bool = True  # skip once a prompt last seen all-equal
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 256  # rows per forward/backward: memory
    sample_batch_size: int = 256  # rows per sampler call: memory
    eval_samples: int = 8  # samples per test problem: pass@1, pass@8, KL to the reference
    bf16: Optional[bool] = None  # autocast rollouts and updates; None = on CUDA
    compile: bool = False  # torch.compile the training forward


def check(cfg):
    """-> (cfg with the row's and the checkpoint's defaults, the row of --loss, its
    hyperparameters) or one line."""
    try:  # an unknown loss or knob is an error; None: the row's default
        hp = losses.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in losses.KNOBS})
    except ValueError as e:
        raise UserError(str(e)) from None
    algo = losses.ALGOS[cfg.loss]
    cfg = replace(cfg, out_dir=cfg.out_dir or f"out/rl-{cfg.loss}", overlong_window=algo.overlong
                  if cfg.overlong_window is None else cfg.overlong_window)  # DAPO's shaping
    check_bounds(cfg, "temperature > 0", "group_size >= 2", "max_refills eval_samples >= 0",
                 "prompts_per_step pairs_per_step ppo_epochs minibatches sample_batch_size "
                 "micro_batch_size max_new_tokens >= 1")
    if cfg.overlong_window and (algo.binary or algo.family != "pg" or "teacher" in algo.needs):
        why = "needs binary rewards" if algo.binary else "does not learn from rewards"
        raise UserError(f"{cfg.loss} {why}: overlong shaping must be off (--overlong_window=0)")
    if algo.on_policy and cfg.ppo_epochs * cfg.minibatches > 1:  # later steps: no IS weight
        raise UserError(f"{cfg.loss} takes one optimizer step per batch: ppo_epochs and "
                        "minibatches must be 1")
    if cfg.staleness or cfg.sampler_bf16 or cfg.rollout_is != "none" or cfg.decoupled:
        offpolicy.check(cfg, algo)  # the off-policy lab's flags
    if cfg.reward != "verifier":
        rm.check(cfg, algo)
    if algo.family != "pg" or cfg.pairs != "offline":
        pref.check(cfg, algo)
    if "teacher" in algo.needs:
        distill.check(cfg, algo)
    return cfg, algo, hp


@dataclass
class Rollout:  # N = prompts x G samples, responses aligned at 0
    ids: torch.Tensor  # (N, P+L) left-padded prompt, response, right padding
    offsets: torch.Tensor  # (N,) left-pad count of each row
    mask: torch.Tensor  # (N, L) 1 on the policy's tokens (not an environment's), EOS included
    mu: torch.Tensor  # (N, L) the sampler's log-probs
    old: torch.Tensor = None  # (N, L) pi_old: mu unless offpolicy.py recomputes it
    reward: torch.Tensor = None  # (N,) the return: score (or the RM's) + turn rewards + shaping
    correct: torch.Tensor = None  # (N,) the final score: the verifier's or the episode's
    first_wrong: torch.Tensor = None  # (N,) CLIFF's first wrong token, or -1
    length: torch.Tensor = None  # (N,) response tokens with EOS, the environment's too
    finished: torch.Tensor = None  # (N,) ended with EOS
    values: torch.Tensor = None  # (N, L) PPO: V_old
    baseline: torch.Tensor = None  # (N,) ReMax: the greedy answer's reward
    rm_reward: torch.Tensor = None  # (N,) the RM's raw score
    turn_rewards: torch.Tensor = None  # (N, L) an environment's, on each turn's last token
    turns: torch.Tensor = None  # (N,) an environment's turns
    invalid: torch.Tensor = None  # (N,) the turns it could not take

    def returns(self):
        """(N,) the final score plus the turns' rewards: the return without shaping."""
        return self.correct if self.turn_rewards is None else \
            self.correct + self.turn_rewards.sum(1)


@dataclass
class Run:  # what setup builds once and every step reads
    model: torch.nn.Module  # the policy
    compiled: torch.nn.Module  # the policy as the update runs it: torch.compile'd or itself
    ref: torch.nn.Module  # the frozen reference
    opt: torch.optim.Optimizer
    task: Task  # tokenizer, verifier, environment, this rank's train rows, val, test
    prompts: rows.PromptSampler  # seeded epochs over task.train
    hp: dict  # the row's hyperparameters (adaptive KL moves beta)
    rm: Optional[RewardModel] = None
    teacher: Optional[torch.nn.Module] = None
    queue: deque = field(default_factory=deque)  # rollouts not trained on yet
    state: loop.State = field(default_factory=loop.State)  # a resume restores it

# -------------------- rollouts, rewards


def rollout(cfg, algo, run, idx, gen, G, temperature):
    """G scored samples of each train problem of idx -> a Rollout."""
    task, tok = run.task, run.task.tok
    problems, parts = [task.train[i] for i in idx], []
    prompts = rows.encode_prompts(tok, [p for p, _ in problems], task.reverse)
    n = max(1, cfg.sample_batch_size // G)  # prompts per sampler call
    for i in range(0, len(problems), n):
        env = task.episodes(problems[i:i + n], G)  # an environment's episodes, or None
        out = generate(run.model, prompts[i:i + n], cfg.max_new_tokens, tok.eos_id, tok.pad_id,
                       G=G, temperature=temperature, generator=gen, env=env)
        parts.append(scored(cfg, algo, task, out, problems[i:i + n], G, env))
    batch = rows.cat(parts)
    if algo.advantage == "first_wrong":  # CLIFF: against the gold answer's tokens
        batch.first_wrong = cliff.first_wrong(batch, [g for _, g in task.gold_rows(problems)], G)
    return batch


def scored(cfg, algo, task, out, problems, G, env):
    """A sampler call's result -> its Rollout: each row's score (a group's identical samples
    scored once), its return with DAPO's overlong shaping and an environment's turn rewards."""
    P, window, seen, score, shaped = out["prompt_len"], cfg.overlong_window, {}, [], []
    batch = Rollout(out["ids"], out["offsets"], out["action_mask"][:, P:], out["logps"],
                    out["logps"], length=out["response_mask"][:, P:].sum(1).float(),
                    turn_rewards=out.get("turn_rewards"))
    responses = rows.responses(batch)
    for r, (ids, act) in enumerate(zip(responses, batch.mask.tolist())):
        key = (r // G, *ids)  # one problem, so one answer (and one secret) per group
        if key not in seen:
            seen[key] = task.score(ids, act, problems[r // G], env, r)
        penalty = overlong_penalty(len(ids), cfg.max_new_tokens, window) if window else 0
        score, shaped = score + [seen[key]], shaped + [seen[key] + penalty]
    dev = batch.ids.device
    batch.correct, batch.reward = torch.tensor(score, device=dev), torch.tensor(shaped, device=dev)
    batch.finished = torch.tensor([ids[-1:] == [task.tok.eos_id] for ids in responses], device=dev)
    if env:  # the turns' rewards join the return
        batch.turns, batch.invalid = (t.to(dev) for t in env.stats())
        batch.reward = batch.reward + batch.turn_rewards.sum(1)
    if algo.binary and ((batch.reward != 0) & (batch.reward != 1)).any():
        raise UserError(f"{cfg.loss} needs 0/1 rewards; this task gave partial credit or "
                        "rewards every turn")
    return batch


def collect(cfg, algo, run, gen):
    """This rank's prompts x G samples -> (Rollout or None, stats). Dynamic sampling
    drops groups without signal and refills, up to max_refills more rounds."""
    parts, n_groups, n_sampled, n_flat, G, extra = [], 0, 0, 0, cfg.group_size, {}
    n_tok, n_rows, n_cut = 0.0, 0, 0  # every row sampled, dropped or not: tok/s, truncation
    want = cfg.prompts_per_step // world_size()
    dyn = algo.data in ("pairs", "labels") or cfg.dynamic_sampling and algo.family == "pg" \
        and "teacher" not in algo.needs  # online pairs need a right and a wrong answer
    for _ in range(1 + (cfg.max_refills if dyn else 0)):
        idx = run.prompts.take(want - n_groups)
        batch = rollout(cfg, algo, run, idx, gen, G, cfg.temperature)
        n_tok, n_rows = n_tok + batch.length.sum().item(), n_rows + len(batch.ids)
        n_cut += int((~batch.finished).sum())
        if run.rm:  # the RM's score for the verifier's
            run.rm.score(batch, cfg.rm_normalize, update=True)
        R = (batch.reward if run.rm else batch.returns()).view(-1, G)  # (groups, G) no shaping
        if "greedy" in algo.needs:  # ReMax: each prompt's greedy answer
            greedy = rollout(cfg, algo, run, idx, gen, 1, 0.0)
            n_tok += greedy.length.sum().item()
            R, extra = remax.baseline(batch, greedy, R, run.rm, cfg.rm_normalize, extra)
        flat = R.max(1).values == R.min(1).values  # (groups,) no signal
        run.prompts.record(idx, flat)
        n_sampled, n_flat = n_sampled + len(idx), n_flat + int(flat.sum())
        batch = rows.take(batch, (~flat).repeat_interleave(G)) if dyn else batch
        if len(batch.ids):
            parts.append(batch)
            n_groups += len(batch.ids) // G
        if not dyn or n_groups >= want:
            break
    cut, sampled = all_reduce([n_cut, n_rows]).tolist()  # 1: nothing to learn (the line warns)
    stats = {"rl/zero_std_frac": n_flat / n_sampled, "rl/n_groups": n_groups,
             "rl/sampled_truncated_frac": cut / sampled, "perf/rollout_tokens": n_tok,
             **{k: v / n_sampled for k, v in extra.items()}}
    return (rows.cat(parts) if parts else None), stats

# -------------------- advantages


def advantages(cfg, algo, hp, batch, ref_lp, teacher_lp):
    """(N,) or (N, L) advantages of the row's kind, and its objective's inputs."""
    kind, R, G = algo.advantage, batch.reward, cfg.group_size
    if kind in ("gae", "rpp", "rpp_baseline"):
        return token_advantages(kind, hp, batch, R, ref_lp, G)
    if kind in (None, "teacher"):  # distillation (gkd: no advantage)
        return distill.advantages(batch, teacher_lp) if kind else torch.zeros_like(batch.mu), {}
    if algo.kl == "reward" and hp["beta"]:  # R - beta sum_t k1(pi_old, ref)
        R = losses.kl_in_reward(R, batch.old, ref_lp, batch.mask, hp["beta"]).sum(1)
    if kind == "greedy":
        return R - batch.baseline, {}
    if kind == "first_wrong":  # CLIFF
        adv = cliff.cliff_advantages(R.view(-1, G), batch.first_wrong.view(-1, G),
                                     batch.mask.view(-1, G, batch.mask.size(1)))
        return adv.flatten(0, 1), {}  # (N, L)
    inputs = {}
    if "group_correct" in algo.needs:
        inputs = dict(group_correct=batch.correct.view(-1, G).sum(1).repeat_interleave(G),
                      group_size=G)
    return losses.group_advantages(R.view(-1, G), kind).flatten(), inputs  # (N,)


def token_advantages(kind, hp, batch, R, ref_lp, G):
    """GAE (PPO) or return-to-go (REINFORCE++) of the rewards -beta k1 + R at the end,
    whitened over all ranks -> ((N, L), inputs)."""
    if kind == "rpp_baseline":  # R minus its group's mean first
        R = losses.group_advantages(R.view(-1, G), "mean").flatten()
    m, turns = batch.mask, batch.turn_rewards  # turns: an environment's rewards (N, L), or None
    R = R if turns is None else R - turns.sum(1)  # the rest on the last token
    rewards = losses.kl_in_reward(R, batch.old, ref_lp if hp["beta"] else batch.old, m,
                                  hp["beta"])
    rewards = rewards if turns is None else rewards + turns
    gae = kind == "gae"
    v = batch.values if gae else torch.zeros_like(rewards)  # V = 0, gamma = lam = 1
    adv, ret = losses.gae(rewards, v, m, *((hp["gamma"], hp["lam"]) if gae else (1.0, 1.0)))
    n, s, s2 = all_reduce([m.sum(), losses.masked_sum(adv, m),
                           losses.masked_sum(adv * adv, m)]).tolist()  # count, sum, squares
    adv = losses.whiten(adv, m, s / n, s2 / n - (s / n) ** 2)  # over every rank: DDP = one process
    return adv, (dict(old_values=v, returns=ret) if gae else {})

# -------------------- update


def forward(model, batch, cfg, algo, max_rows=None):
    """-> the trainer's log-probs (n, L), PPO's values and tempered logits (n, L, V).
    V_t = head(h_t) pi(y_<t | x): a wrong token zeroes an exact match's return."""
    values = "values" in algo.needs
    lp, head, logits = logprobs(model, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                                values, logits=max_rows is None, max_rows=max_rows)
    return lp, (head * losses.prefix_prob(lp.detach()) if values else None), logits


def update(cfg, algo, run, batch, adv, inputs, ref_lp, lr, gen):
    """ppo_epochs x minibatches optimizer steps; losses divide by the minibatch's counts
    over all ranks, so micro-batches and ranks add up. Stats: each one's mean over the steps
    that measured it (the trainer-vs-sampler gap and the entropy: the first, pi = pi_old)."""
    N, G = len(batch.ids), cfg.group_size
    micro = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    fewest = -int(all_reduce(-N, "max").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:  # dynamic sampling kept few groups
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} rows")
    steps = []  # each optimizer step's stats
    for epoch in range(cfg.ppo_epochs):
        order = torch.arange(N) if cfg.minibatches == 1 else \
            torch.randperm(N, generator=gen, device=gen.device)
        for i, mb in enumerate(order.tensor_split(cfg.minibatches)):  # exactly minibatches parts
            first = epoch == 0 and i == 0  # pi = pi_old: the sampler gap, the entropy measured
            run.opt.zero_grad()
            loss, stats = accumulate(cfg, algo, run, batch, adv, inputs, ref_lp, mb, micro, first,
                                     gen)
            gnorm = loop.optimizer_step(unwrap(run.model), run.opt, loss, lr, cfg.grad_clip,
                                        backward=False)
            steps.append(stats)
    keys = dict.fromkeys(k for step in steps for k in step)  # every stat, in order
    measured = {k: [step[k] for step in steps if k in step] for k in keys}
    return {**{f"rl/{k}": sum(v) / len(v) for k, v in measured.items()},  # over the steps
            "rl/loss": loss.item() * world_size(), "rl/grad_norm": gnorm.item(),
            "rl/lr": lr, "rl/n_tokens": batch.mask.sum().item()}


def accumulate(cfg, algo, run, batch, adv, inputs, ref_lp, mb, micro, first, gen):
    """Backward of minibatch mb in micro-batches -> (its loss, its stats)."""
    counts = all_reduce([batch.mask[mb].sum().item(), float(len(mb))]).clamp_min(1).tolist()
    if algo.select:  # Clip-/KL-Cov: the tokens chosen over the minibatch
        chosen = torch.zeros_like(batch.mask, dtype=torch.bool)  # (N, L)
        chosen[mb] = cov.select(run.model, batch, mb, adv, run.hp, cfg, algo.select, micro, gen,
                                moved=not first)
        inputs = {**inputs, "cov_mask": chosen}
    bonus, total, stats = bool(run.hp.get("ent_coef")), 0.0, {}  # bonus: PPO's entropy
    for ub in mb.split(micro):
        lp, values, logits = forward(run.compiled, rows.take(batch, ub), cfg, algo)
        m = batch.mask[ub]  # (n, L)
        kw = {k: v[ub] if torch.is_tensor(v) else v for k, v in inputs.items()}
        if "values" in algo.needs:
            kw.update(values=values, **({"entropy": losses.token_entropy(logits)} if bonus else {}))
        if "teacher_logits" in algo.needs:  # the student's next-token distribution
            kw["logits"] = logits
        ref = None if ref_lp is None else ref_lp[ub]
        loss, micro_stats = losses.algo_loss(algo, run.hp, lp, batch.old[ub], adv[ub], m, ref,
                                             *counts, **kw)
        loss.backward()
        total += loss.detach()
        if first:  # the entropy, the trainer against mu (ratio 1 at k = 0)
            d = (lp.detach() - batch.mu[ub]).abs() * m  # (n, L)
            micro_stats.update(logp_mismatch=d.max(), logp_mismatch_mean=losses.masked_mean(d, m),
                               entropy=losses.masked_mean(losses.token_entropy(logits.detach()),
                                                          m))
        w = (m.sum() / batch.mask[mb].sum().clamp_min(1)).item()  # token-weighted means
        for k, v in micro_stats.items():
            stats[k] = max(stats.get(k, -1e30), float(v)) if k in ("ratio_max", "logp_mismatch") \
                else stats.get(k, 0.0) + float(v) * w
    return total, stats

# -------------------- one step


def train_step(cfg, algo, run, lr, gen):
    """One step of any row -> its stats, averaged over ranks."""
    batch, stats, dev = None, {}, next(run.model.parameters()).device
    if algo.family == "pg" or not pref.offline(cfg, algo):
        t0 = time.time()
        with torch.autocast(dev.type, torch.bfloat16) if cfg.sampler_bf16 else nullcontext():
            batch, stats = collect(cfg, algo, run, gen)
        stats["perf/rollout_s"] = dt = time.time() - t0  # this step's rollouts
        stats["perf/rollout_tok_s"] = stats["perf/rollout_tokens"] / dt  # every token sampled
    if cfg.staleness:  # async RL: train on the rollout of staleness steps ago
        run.queue.append(batch)
        if len(run.queue) <= cfg.staleness:  # the queue is filling
            return mean_over_ranks(stats)
        batch = run.queue.popleft()
    if algo.family != "pg":  # {} when some rank had no rows: then no rank logs its rollout
        out = pref.step(cfg, algo, run, batch, lr)
        metrics = rollout_metrics(batch) if out and batch else {}
        return mean_over_ranks({**stats, **out, **metrics})
    if all_reduce(float(batch is None), "max").item():  # on any rank: no update
        return mean_over_ranks(stats)
    ref_lp, adv, inputs, prepared = prepare(cfg, algo, run, batch)
    stats.update(prepared, **update(cfg, algo, run, batch, adv, inputs, ref_lp, lr, gen))
    stats = mean_over_ranks({**stats, **rollout_metrics(batch, ref_lp, inputs.get("returns"),
                                                        run.hp.get("beta"))})
    if run.hp.get("kl_target"):  # PPO's adaptive KL controller, on every rank's rows
        n = stats["rl/n_groups"] * cfg.group_size * world_size()
        run.hp["beta"] = losses.adaptive_beta(run.hp["beta"], stats["rl/kl_k1_seq"],
                                              run.hp["kl_target"], n)
    return stats


@torch.no_grad()
def prepare(cfg, algo, run, batch):
    """-> (ref log-probs for a KL term, advantages, the objective's inputs, stats)."""
    max_rows, ref_lp, stats, teacher_lp = cfg.micro_batch_size, None, {}, None
    if algo.kl and run.hp["beta"]:
        ref_lp = logprobs(run.ref, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                          max_rows=max_rows)[0]
    if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:  # mu is not the trainer's
        stats = offpolicy.recompute(run.model, batch, cfg)
    if "values" in algo.needs:  # from the same forward as the update's
        values = forward(unwrap(run.model), batch, cfg, algo, max_rows)[1]
        batch.values = torch.where(batch.mask.bool(), values, 0.0)
    if run.teacher is not None:  # distillation: the teacher's log-probs [and logits]
        teacher_lp, teacher_logits = distill.teacher(run.teacher, batch, cfg, algo)
    adv, inputs = advantages(cfg, algo, run.hp, batch, ref_lp, teacher_lp)
    if "teacher_logits" in algo.needs:
        inputs["teacher_logits"] = teacher_logits
    if cfg.rollout_is != "none" or cfg.decoupled:
        adv, weights = offpolicy.weigh(adv, batch, cfg, algo)
        stats.update(weights)
    return ref_lp, adv, inputs, stats

# -------------------- setup, the loop


def setup(cfg, algo, hp, dev, rank, world):
    """-> (cfg with the SFT checkpoint's max_new_tokens if unset, a Run: the policy, reference,
    optimizer, this rank's data, an RM, a teacher)."""
    model, task = load_policy(cfg.sft_ckpt, "values" in algo.needs, dev, cfg.env_args)
    cfg = replace(cfg, max_new_tokens=cfg.max_new_tokens or task.max_new_tokens)  # SFT's: fits
    if "max_new_tokens" in hp:  # dr_grpo's constant normaliser
        hp["max_new_tokens"] = cfg.max_new_tokens
    task.check(algo, cfg.max_new_tokens, model.config.block_size)
    offline = algo.family != "pg" and pref.offline(cfg, algo)  # a step of data files
    task.train = (pref.data(cfg, algo, task) if algo.family != "pg" else task.train)[rank::world]
    select = cfg.prompt_selection and "teacher" not in algo.needs and not offline
    opt = loop.adamw(model, cfg.lr, cfg.weight_decay, hp.get("vf_lr_mult"))
    rm = RewardModel.load(cfg.rm_ckpt, task.tok, dev) if cfg.reward == "rm" else None
    teacher = distill.load(cfg.teacher_ckpt, task.tok, dev) if "teacher" in algo.needs else None
    return cfg, Run(model, torch.compile(model) if cfg.compile else model,
                    copy.deepcopy(model).requires_grad_(False), opt, task,
                    rows.PromptSampler(len(task.train), ("prompts", cfg.seed, rank), select), hp,
                    rm, teacher)


def resume(cfg, run, rank, run_config):
    """Continue exactly: weights, optimizer, loop state; each rank's prompt sampler, queued
    rollouts and RM statistics."""
    run.state, ck = loop.resume(cfg, run.model, run.opt, run.task.tok, rank == 0, run_config)
    run.hp, rank_state = ck["hparams"], ck["ranks"][rank]
    run.prompts.load_state_dict(rank_state["sampler"])
    dev = next(run.model.parameters()).device
    run.queue.extend(offpolicy.from_dict(d, dev, Rollout) for d in rank_state["queue"])
    if run.rm:
        run.rm.load_state_dict(rank_state["rm"])


def save(cfg, run, run_config, name):
    """ckpt.pt or best.pt, with each rank's prompt sampler, queue and RM statistics."""
    rank_state = {"sampler": run.prompts.state_dict(), "rm": run.rm and run.rm.state_dict(),
                  "queue": [offpolicy.to_dict(batch) for batch in run.queue]}
    loop.save(cfg, name, run.model, run.opt, run_config, run.state, run.task.tok, rank_state,
              hparams=run.hp)


def evaluate(cfg, run):
    """Rank 0's held-out eval (test and val) -> its metrics."""
    gen = seeded(next(run.model.parameters()).device, "eval", cfg.seed, run.state.step)
    m, examples = evaluate_policy(run.model, run.ref, run.task, cfg, gen)
    return {**m, "perf/train_s": run.state.train_s, "eval/examples": examples}


def line(cfg, stats):
    """The step's progress line: the numbers SHOWN, and a warning if no answer ended."""
    shown = [f"{k} {stats['rl/' + k]:.4g}" for k in SHOWN if "rl/" + k in stats]
    if stats.get("rl/sampled_truncated_frac") == 1:  # no reward to learn from
        shown.append(f"WARNING: every rollout ran out of max_new_tokens={cfg.max_new_tokens}")
    return " ".join(shown) or "no update"


def main(cfg):
    cfg, algo, hp = check(cfg)
    dev, rank, world = loop.start(cfg)
    bf16 = dev.type == "cuda" and bf16_default(dev)  # RL on CPU stays fp32
    cfg = replace(cfg, bf16=bf16 if cfg.bf16 is None else cfg.bf16)
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError(f"prompts_per_step and pairs_per_step must divide by the {world} ranks")
    cfg, run = setup(cfg, algo, hp, dev, rank, world)
    run_config = {**asdict(cfg), **run.task.settings(), "ranks": world}
    if cfg.resume:
        resume(cfg, run, rank, run_config)
    if rank == 0:
        print(f"hparams: {run.hp}", flush=True)
    hparams = {f"hparams/{k}": v for k, v in run.hp.items() if v is not None}
    with loop.Clock(cfg, run.state, rank, resolved={**run_config, "hparams": run.hp}) as clock:
        if not cfg.resume:
            clock.logger.log({"step": 0, **hparams})
        while True:  # at the top of step s: evaluate, save, stop, as every rank agrees
            now = clock.tick()
            if now.evaluate and rank == 0 and clock.record(evaluate(cfg, run), "val/accuracy"):
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
            clock.summary("eval/accuracy", f"eval/pass@{min(8, cfg.eval_samples)}")
    return {"metrics": run.state.last_eval, "model": run.model, "ref": run.ref}


if __name__ == "__main__":
    run_cli(main, Config)
