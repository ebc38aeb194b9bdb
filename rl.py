"""
RL from the SFT checkpoint. A row of losses.ALGOS declares the algorithm; this loop obeys.

    python rl.py --loss=grpo               # dapo, dr_grpo, ppo, gspo, ...: losses.ALGOS
    python rl.py --loss=ppo --reward=rm    # PPO against a reward_model.py checkpoint
    python rl.py --loss=dpo --pairs=online # preference rows; baselines sft, rft

A step: prompts -> G samples each (log-probs mu) -> rewards -> advantages -> updates.
Features off by default live in nanorl/, a file each, opened by their flag or row.
"""
import copy
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Optional

import torch

import losses as L
from model import generate, logprobs, seeded
from nanorl import cliff, cov, distill, loop, offpolicy, pref, remax, rm, rows
from nanorl.checkpoint import load_checkpoint, unwrap
from nanorl.config import UserError, check_bounds, run_cli
from nanorl.ddp import all_reduce, bf16_default, mean_over_ranks, world_size
from nanorl.evaluate import Task, evaluate_policy, load_policy, rollout_metrics
from nanorl.logger import Logger
from nanorl.rm import RMFlags, RewardModel
from verify import overlong_penalty

SHOWN = ("loss reward_mean rm_reward accuracy margin pair_accuracy z n_groups zero_std_frac "
         "entropy resp_len logp_mismatch explained_variance old_mu_seq_mean").split()


@dataclass  # the loop's, the losses' (None: the row's), the features' flags
class Config(RMFlags, pref.Flags, distill.Flags, offpolicy.Flags, L.Knobs, loop.LoopConfig):
    loss: str = "grpo"  # a row of losses.ALGOS
    out_dir: str = ""  # "" = out/rl-<loss>
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
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
    eval_samples: int = 8  # samples per test problem: pass@1, pass@8
    bf16: Optional[bool] = None  # autocast rollouts and updates; None = on CUDA
    compile: bool = False  # torch.compile the training forward


def check(cfg):
    """-> (cfg with the row's and the checkpoint's defaults, the row of --loss, its
    hyperparameters) or one line."""
    try:  # an unknown loss or knob is an error; None: the row's default
        hp = L.resolve_hparams(cfg.loss, **{k: getattr(cfg, k) for k in L.KNOBS})
    except ValueError as e:
        raise UserError(str(e)) from None
    row = L.ALGOS[cfg.loss]
    cfg = replace(cfg, out_dir=cfg.out_dir or f"out/rl-{cfg.loss}", overlong_window=row.overlong
                  if cfg.overlong_window is None else cfg.overlong_window)  # DAPO's shaping
    check_bounds(cfg, ("temperature", "> 0", lambda v: v > 0),
                 ("group_size", ">= 2", lambda v: v >= 2),
                 ("prompts_per_step pairs_per_step ppo_epochs minibatches sample_batch_size "
                  "micro_batch_size", ">= 1", lambda v: v >= 1),
                 ("max_refills eval_samples", ">= 0", lambda v: v >= 0))
    if cfg.overlong_window and (row.binary or row.family != "pg" or "teacher" in row.needs):
        why = "needs binary rewards" if row.binary else "does not learn from rewards"
        raise UserError(f"{cfg.loss} {why}: overlong shaping must be off (--overlong_window=0)")
    if row.on_policy and cfg.ppo_epochs * cfg.minibatches > 1:  # later steps: no IS weight
        raise UserError(f"{cfg.loss} takes one optimizer step per batch: ppo_epochs and "
                        "minibatches must be 1")
    for feature in (offpolicy, rm, pref) + ((distill,) if "teacher" in row.needs else ()):
        feature.check(cfg, row)
    if cfg.max_new_tokens is None:  # the SFT's: its answers (a tool's traces) fit it
        ck = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
        cfg = replace(cfg, max_new_tokens=ck["config"].get("max_new_tokens", 8))
    check_bounds(cfg, ("max_new_tokens", ">= 1", lambda v: v >= 1))
    if "max_new_tokens" in hp:  # dr_grpo's constant normaliser
        hp["max_new_tokens"] = cfg.max_new_tokens
    return cfg, row, hp


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
    model: torch.nn.Module  # the policy (fwd: it, compiled with --compile)
    fwd: torch.nn.Module
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


def rollout(cfg, row, run, idx, gen, G, temperature):
    """G graded samples of each train problem of idx -> a Rollout."""
    task, tok = run.task, run.task.tok
    problems, parts = [task.train[i] for i in idx], []
    prompts = rows.encode_prompts(tok, [p for p, _ in problems], task.reverse)
    n = max(1, cfg.sample_batch_size // G)  # prompts per sampler call
    for i in range(0, len(problems), n):
        env = task.episodes(problems[i:i + n], G)  # an environment's episodes, or None
        o = generate(run.model, prompts[i:i + n], cfg.max_new_tokens, tok.eos_id, tok.pad_id,
                     G=G, temperature=temperature, generator=gen, env=env)
        parts.append(graded(cfg, row, task, o, problems[i:i + n], G, env))
    b = rows.cat(parts)
    if row.advantage == "first_wrong":  # CLIFF: against the gold answer's tokens
        b.first_wrong = cliff.first_wrong(b, [g for _, g in task.gold_rows(problems)], G)
    return b


def graded(cfg, row, task, o, problems, G, env):
    """A sampler call's result -> its Rollout, scored (a group's identical samples once)."""
    P, window, seen, scores = o["prompt_len"], cfg.overlong_window, {}, []
    b = Rollout(o["ids"], o["offsets"], o["action_mask"][:, P:], o["logps"], o["logps"],
                length=o["response_mask"][:, P:].sum(1).float(), turn_rewards=o.get("turn_rewards"))
    for r, (ids, act) in enumerate(zip(rows.responses(b), b.mask.tolist())):
        key = (r // G, *ids)  # one problem, so one answer (and one secret) per group
        if key not in seen:
            c = task.score(ids, act, problems[r // G], env, r)
            pen = overlong_penalty(len(ids), cfg.max_new_tokens, window) if window else 0
            seen[key] = c, c + pen, ids[-1:] == [task.tok.eos_id]
        scores.append(seen[key])
    b.correct, b.reward, b.finished = (torch.tensor(v, device=b.ids.device) for v in zip(*scores))
    if env:  # the turns' rewards join the return
        b.turns, b.invalid = (t.to(b.ids.device) for t in env.stats())
        b.reward = b.reward + b.turn_rewards.sum(1)
        if row.binary and b.turn_rewards.any():
            raise UserError(f"{cfg.loss} needs 0/1 rewards; this environment pays every turn")
    return b


def collect(cfg, row, run, gen):
    """This rank's prompts x G samples -> (Rollout or None, stats). Dynamic sampling
    drops groups without signal and refills, up to max_refills more rounds."""
    parts, n_groups, n_sampled, n_flat, G, extra = [], 0, 0, 0, cfg.group_size, {}
    n_tok, n_rows, n_cut = 0.0, 0, 0  # every row sampled, dropped or not: tok/s, truncation
    want = cfg.prompts_per_step // world_size()
    dyn = row.data in ("pairs", "labels") or cfg.dynamic_sampling and row.family == "pg" \
        and "teacher" not in row.needs  # online pairs need a right and a wrong answer
    for _ in range(1 + (cfg.max_refills if dyn else 0)):
        idx = run.prompts.take(want - n_groups)
        b = rollout(cfg, row, run, idx, gen, G, cfg.temperature)
        n_tok, n_rows = n_tok + b.length.sum().item(), n_rows + len(b.ids)
        n_cut += int((~b.finished).sum())
        if run.rm:  # the RM's score for the verifier's
            run.rm.score(b, cfg.rm_normalize, update=True)
        run.prompts.record(idx, b.correct.view(-1, G))
        R = (b.reward if run.rm else b.returns()).view(-1, G)  # (groups, G) no shaping
        if "greedy" in row.needs:  # ReMax: each prompt's greedy answer
            greedy = rollout(cfg, row, run, idx, gen, 1, 0.0)
            n_tok += greedy.length.sum().item()
            R, extra = remax.baseline(b, greedy, R, run.rm, cfg.rm_normalize, extra)
        flat = R.max(1).values == R.min(1).values  # (groups,) no signal
        n_sampled, n_flat = n_sampled + len(idx), n_flat + int(flat.sum())
        b = rows.take(b, (~flat).repeat_interleave(G)) if dyn else b
        if len(b.ids):
            parts.append(b)
            n_groups += len(b.ids) // G
        if not dyn or n_groups >= want:
            break
    cut, sampled = all_reduce([n_cut, n_rows]).tolist()  # 1: nothing to learn (step warns)
    stats = {"rl/zero_std_frac": n_flat / n_sampled, "rl/n_groups": n_groups,
             "rl/sampled_truncated_frac": cut / sampled, "perf/rollout_tokens": n_tok,
             **{k: v / n_sampled for k, v in extra.items()}}
    return (rows.cat(parts) if parts else None), stats


# -------------------- advantages


def advantages(cfg, row, hp, b, ref_lp, teacher_lp):
    """(N,) or (N, L) advantages of the row's kind, and its objective's inputs."""
    kind, R, G = row.advantage, b.reward, cfg.group_size
    if kind in ("gae", "rpp", "rpp_baseline"):
        return token_advantages(kind, hp, b, R, ref_lp, G)
    if kind in (None, "teacher"):  # distillation (gkd: no advantage)
        return distill.advantages(b, teacher_lp) if kind else torch.zeros_like(b.mu), {}
    if row.kl == "reward" and hp["beta"]:  # R - beta sum_t k1(pi_old, ref)
        R = L.kl_in_reward(R, b.old, ref_lp, b.mask, hp["beta"]).sum(1)
    if kind == "greedy":
        return R - b.baseline, {}
    if kind == "first_wrong":  # CLIFF
        adv = cliff.cliff_advantages(R.view(-1, G), b.first_wrong.view(-1, G),
                                 b.mask.view(-1, G, b.mask.size(1)))
        return adv.flatten(0, 1), {}  # (N, L)
    inputs = {}
    if "group_correct" in row.needs:
        inputs = dict(group_correct=b.correct.view(-1, G).sum(1).repeat_interleave(G),
                      group_size=G)
    if "tokens" in row.needs:  # chosen minibatch by minibatch in update
        inputs["cov_mask"] = torch.zeros_like(b.mask, dtype=torch.bool)
    return L.group_advantages(R.view(-1, G), kind).flatten(), inputs  # (N,)


def token_advantages(kind, hp, b, R, ref_lp, G):
    """GAE (PPO) or return-to-go (REINFORCE++) of the rewards -beta k1 + R at the end,
    whitened over all ranks -> ((N, L), inputs)."""
    if kind == "rpp_baseline":  # R minus its group's mean first
        R = L.group_advantages(R.view(-1, G), "mean").flatten()
    turns = b.turn_rewards  # (N, L) an environment's, on their turns' last tokens, or None
    R = R if turns is None else R - turns.sum(1)  # the rest on the last token
    rewards = L.kl_in_reward(R, b.old, ref_lp if hp["beta"] else b.old, b.mask, hp["beta"])
    rewards = rewards if turns is None else rewards + turns
    gae = kind == "gae"
    v = b.values if gae else torch.zeros_like(rewards)  # V = 0, gamma = lam = 1
    adv, ret = L.gae(rewards, v, b.mask, *((hp["gamma"], hp["lam"]) if gae else (1.0, 1.0)))
    n, s, s2 = all_reduce([b.mask.sum(), L.masked_sum(adv, b.mask),
                           L.masked_sum(adv * adv, b.mask)]).tolist()
    adv = L.whiten(adv, b.mask, s / n, s2 / n - (s / n) ** 2)  # DDP = one process
    return adv, (dict(old_values=v, returns=ret) if gae else {})

# -------------------- update


def forward(model, b, cfg, row, chunk=None):
    """-> the trainer's log-probs (n, L), PPO's values and tempered logits (n, L, V).
    V_t = head(h_t) pi(y_<t | x): a wrong token zeroes an exact match's return."""
    values = "values" in row.needs
    lp, head, logits = logprobs(model, b.ids, b.offsets, b.mask, cfg.temperature, values,
                                logits=chunk is None, rows=chunk)
    return lp, (head * L.prefix_prob(lp.detach()) if values else None), logits


def update(cfg, row, run, b, adv, inputs, ref_lp, lr, gen):
    """ppo_epochs x minibatches optimizer steps; losses divide by the minibatch's counts
    over all ranks, so micro-batches and ranks add up."""
    N, G = len(b.ids), cfg.group_size
    micro = max(G, cfg.micro_batch_size // G * G)  # micro-batches of whole groups
    fewest = -int(all_reduce(-N, "max").item())  # rows on the emptiest rank
    if fewest < cfg.minibatches:  # dynamic sampling kept few groups
        raise UserError(f"minibatches={cfg.minibatches} but a rank holds only {fewest} rows")
    logged = []  # the optimizer steps' stats
    for _ in range(cfg.ppo_epochs):
        order = torch.arange(N) if cfg.minibatches == 1 else \
            torch.randperm(N, generator=gen, device=gen.device)
        for mb in order.tensor_split(cfg.minibatches):  # exactly minibatches parts
            if "tokens" in row.needs:  # Clip-/KL-Cov: chosen over the minibatch
                inputs["cov_mask"][mb] = cov.select(run.model, b, mb, adv, run.hp, cfg,
                                                    micro, gen, moved=bool(logged))
            run.opt.zero_grad()
            loss, st = accumulate(cfg, row, run, b, adv, inputs, ref_lp, mb, micro,
                                  first=not logged)
            gnorm = loop.optimizer_step(unwrap(run.model), run.opt, loss, lr, cfg.grad_clip,
                                        backward=False)
            logged.append(st)
    out = {f"rl/{k}": sum(s[k] for s in logged) / len(logged) for k in logged[-1]}
    return {**{f"rl/{k}": v for k, v in logged[0].items()}, **out,
            "rl/loss": loss.item() * world_size(), "rl/grad_norm": gnorm.item(),
            "rl/lr": lr, "rl/n_tokens": b.mask.sum().item()}


def accumulate(cfg, row, run, b, adv, inputs, ref_lp, mb, micro, first):
    """Backward of minibatch mb in micro-batches -> (its loss, its stats)."""
    counts = all_reduce([b.mask[mb].sum().item(), float(len(mb))]).clamp_min(1).tolist()
    bonus, total, st = bool(run.hp.get("ent_coef")), 0.0, {}  # bonus: PPO's entropy
    for ub in mb.split(micro):
        lp, values, logits = forward(run.fwd, rows.take(b, ub), cfg, row)
        m = b.mask[ub]  # (n, L)
        kw = {k: v[ub] if torch.is_tensor(v) else v for k, v in inputs.items()}
        if "values" in row.needs:
            kw.update(values=values, **({"entropy": L.token_entropy(logits)} if bonus else {}))
        if "teacher_logits" in row.needs:  # the student's next-token distribution
            kw["logits"] = logits
        ref = None if ref_lp is None else ref_lp[ub]
        loss, s = L.LOSSES[cfg.loss](lp, b.old[ub], adv[ub], m, ref, *counts, **run.hp, **kw)
        loss.backward()
        total += loss.detach()
        if first:  # the entropy, the trainer against mu (ratio 1 at k = 0)
            d = (lp.detach() - b.mu[ub]).abs() * m  # (n, L)
            s.update(logp_mismatch=d.max(), logp_mismatch_mean=L.masked_mean(d, m),
                     entropy=L.masked_mean(L.token_entropy(logits.detach()), m))
        w = (m.sum() / b.mask[mb].sum().clamp_min(1)).item()  # token-weighted means
        for k, v in s.items():
            st[k] = max(st.get(k, -1e30), float(v)) if k in ("ratio_max", "logp_mismatch") \
                else st.get(k, 0.0) + float(v) * w
    return total, st

# -------------------- one step


def train_step(cfg, row, run, lr, gen):
    """One step of any row -> its stats."""
    b, stats, dev = None, {}, next(run.model.parameters()).device
    if row.family == "pg" or not pref.offline(cfg, row):
        t0 = time.time()
        with torch.autocast(dev.type, torch.bfloat16) if cfg.sampler_bf16 else nullcontext():
            b, stats = collect(cfg, row, run, gen)
        stats["perf/rollout_s"] = dt = time.time() - t0  # this step's rollouts
        stats["perf/rollout_tok_s"] = stats["perf/rollout_tokens"] / dt  # every token sampled
        b = offpolicy.delay(run.queue, b, cfg.staleness) if cfg.staleness else b
        if b is False:  # the queue is filling
            return stats
    if row.family != "pg":  # {} when some rank had no rows: then no rank logs its rollout
        out = pref.step(cfg, row, run, b, lr)
        return {**stats, **out, **(rollout_metrics(b) if out and b else {})}
    if all_reduce(float(b is None), "max").item():  # on any rank: no update
        return stats
    ref_lp, adv, inputs, pre = prepare(cfg, row, run, b)
    stats.update(pre, **update(cfg, row, run, b, adv, inputs, ref_lp, lr, gen))
    return {**stats, **rollout_metrics(b, ref_lp, inputs.get("returns"), run.hp.get("beta"))}


@torch.no_grad()
def prepare(cfg, row, run, b):
    """-> (ref log-probs for a KL term, advantages, the objective's inputs, stats)."""
    chunk, ref_lp, stats = cfg.micro_batch_size, None, {}
    if row.kl and run.hp["beta"]:
        ref_lp = logprobs(run.ref, b.ids, b.offsets, b.mask, cfg.temperature, rows=chunk)[0]
    if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:  # mu is not the trainer's
        stats = offpolicy.recompute(run.model, b, cfg)
    if "values" in row.needs:  # from the same forward as the update's
        values = forward(unwrap(run.model), b, cfg, row, chunk)[1]
        b.values = torch.where(b.mask.bool(), values, 0.0)
    teacher_lp, teacher_logits = distill.teacher(run.teacher, b, cfg, row)
    adv, inputs = advantages(cfg, row, run.hp, b, ref_lp, teacher_lp)
    if teacher_logits is not None:
        inputs["teacher_logits"] = teacher_logits
    if cfg.rollout_is != "none" or cfg.decoupled:
        adv, st = offpolicy.weigh(adv, b, cfg, row)
        stats.update(st)
    return ref_lp, adv, inputs, stats

# -------------------- setup, loop


def setup(cfg, row, hp, dev, rank, world):
    """The policy, reference, optimizer, this rank's data, an RM, a teacher -> Run."""
    model, task = load_policy(cfg.sft_ckpt, "values" in row.needs, dev, cfg.env_args)
    task.check(row, cfg.max_new_tokens, model.config.block_size)
    task.train = (task.train if row.family == "pg" else pref.data(cfg, row, task))[rank::world]
    select = cfg.prompt_selection and "teacher" not in row.needs and not pref.offline(cfg, row)
    opt = loop.adamw(model, cfg.lr, cfg.weight_decay, hp.get("vf_lr_mult"))
    return Run(model, torch.compile(model) if cfg.compile else model,
               copy.deepcopy(model).requires_grad_(False), opt, task,
               rows.PromptSampler(len(task.train), ("prompts", cfg.seed, rank), select), hp,
               RewardModel.load(cfg.rm_ckpt, task.tok, dev) if cfg.reward == "rm" else None,
               distill.load(cfg.teacher_ckpt, task.tok, dev) if "teacher" in row.needs else None)


def save(cfg, run, conf, name):
    """ckpt.pt or best.pt, with each rank's prompt sampler, queue and RM state."""
    mine = {"sampler": run.prompts.state_dict(), "rm": run.rm and run.rm.state_dict(),
            "queue": [offpolicy.to_dict(b) for b in run.queue]}
    loop.save(cfg, name, run.model, run.opt, conf, run.state, run.task.tok, mine, hparams=run.hp)


def evaluate(cfg, run, full=True):
    """Rank 0's held-out eval -> (metrics, no target reached)."""
    gen = seeded(next(run.model.parameters()).device, "eval", cfg.seed, run.state.step)
    m, examples = evaluate_policy(run.model, run.ref, run.task, cfg, gen)
    return {**m, "perf/train_s": run.state.train_s, "eval/examples": examples}, False


def step(cfg, row, run, dev, rank):
    """Step state.step + 1 -> (its stats, its progress line)."""
    with torch.autocast(dev.type, torch.bfloat16, enabled=cfg.bf16):
        stats = train_step(cfg, row, run, loop.lr_at(run.state.step, cfg),
                           seeded(dev, "rollout", cfg.seed, rank, run.state.step + 1))
    stats, hp = mean_over_ranks(stats), run.hp
    if hp.get("kl_target") and "rl/kl_k1_seq" in stats:  # PPO's adaptive KL controller
        n = stats["rl/n_groups"] * cfg.group_size * world_size()
        hp["beta"] = L.adaptive_beta(hp["beta"], stats["rl/kl_k1_seq"], hp["kl_target"], n)
    shown = [f"{k} {stats['rl/' + k]:.4g}" for k in SHOWN if "rl/" + k in stats]
    if stats.get("rl/sampled_truncated_frac") == 1:  # no answer ended: no reward to learn from
        shown.append(f"WARNING: every rollout ran out of max_new_tokens={cfg.max_new_tokens}")
    return stats, " ".join(shown) or "no update"


def main(cfg):
    cfg, row, hp = check(cfg)
    dev, rank, world = loop.start(cfg)
    bf16 = dev.type == "cuda" and bf16_default(dev)  # RL on CPU stays fp32
    cfg = replace(cfg, bf16=bf16 if cfg.bf16 is None else cfg.bf16)
    if cfg.prompts_per_step % world or cfg.pairs_per_step % world:
        raise UserError(f"prompts_per_step and pairs_per_step must divide by the {world} ranks")
    run = setup(cfg, row, hp, dev, rank, world)
    conf = {**asdict(cfg), **run.task.settings(), "ranks": world}
    if cfg.resume:  # weights, optimizer, state, samplers: exactly
        run.state, ck = loop.resume(cfg, run.model, run.opt, run.task.tok, rank == 0,
                                    loss=cfg.loss, staleness=cfg.staleness, ranks=world)
        run.hp, mine = ck["hparams"], ck["ranks"][rank]
        run.prompts.load_state_dict(mine["sampler"])
        run.queue.extend(offpolicy.from_dict(d, dev, Rollout) for d in mine["queue"])
        run.rm and run.rm.load_state_dict(mine["rm"])
    logger = Logger(cfg.out_dir, cfg, enabled=rank == 0, resolved={**conf, "hparams": run.hp})
    if rank == 0:
        print(f"hparams: {run.hp}", flush=True)
    if not cfg.resume:
        logger.log({"step": 0, **{f"hparams/{k}": v for k, v in run.hp.items() if v is not None}})
    t0 = time.time()
    loop.run(cfg, run.state, partial(step, cfg, row, run, dev, rank), partial(evaluate, cfg, run),
             partial(save, cfg, run, conf), rank, logger, "val/accuracy")
    if rank == 0:
        loop.summary(run.state, "eval/accuracy", f"eval/pass@{min(8, cfg.eval_samples)}",
                     time.time() - t0, cfg.out_dir)
    loop.finish(logger)
    return {"metrics": run.state.last_eval, "model": run.model, "ref": run.ref}


if __name__ == "__main__":
    run_cli(main, Config)
