"""The rollout log, opened by --log_rollouts: a sample of each logged step's rollout as a person
reads it and as the trainer took it, and --replay, which trains on a log instead of sampling.

    python rl.py --loss=grpo                              # 2 groups at step 1 and every 25 steps
    python rl.py --loss=grpo --log_rollouts=-1 --log_every=1 --out_dir=out/rl-log   # every group
    python rl.py --loss=dapo --replay=out/rl-log/rollouts --out_dir=out/rl-replay   # the same data
    python -m nanorl.view out/rl-log                                   # read it (nanorl/view.py)

The first step (a debug run of a few steps shows its rollouts) and every --log_every-th step write
out_dir/rollouts/step_<s>.jsonl: a record per row of the first --log_rollouts groups (negative:
all) that the step trained on, after the advantages are computed,
over every rank's rows in rank order (written by rank 0). A record holds step, version (the
weights that sampled it), rank, group and row (counted over the ranks), prompt and response as the
model reads them, reversed (its numbers are least-significant digit first), prompt_normal and
response_normal (as a person reads them), score, reward, turns, truncated, and per response token
its text, role (policy or env: the environment's tokens), mu, old (pi_old), ref (the reference's
log-prob, when the algorithm has a KL term, else null), adv, turn_reward and (async) version.
step_<s>.pt holds those rows as each rank's Rollout, with the sampling stats of that rollout (its
own, also when --staleness or async trains on an older one), the algorithm (--loss) and the facts a
replay must share (facts()). In a log of every group of every step (--log_rollouts=-1
--log_every=1, the one a replay takes) a step that made no update (every group flat, the stale
queue still filling) has its files too, without rows. Both are written to a temporary name and
renamed, so a killed run leaves whole files only. With --wandb=true the rows are also a wandb
Table, "rollouts". Cost on the default task (2 groups of 16 rows every 25 steps): 42 KB and 2 ms
a logged step, 0.5 MB over a 300-step run (bench/README.md).

--replay=DIR: step s trains on DIR's step_<s>.pt instead of sampling, each rank on its own rows:
the log of every group of every step (--log_rollouts=-1 --log_every=1) of a run with this one's
facts, and, for an algorithm whose advantage reads what its own sampling computes (SAMPLED), of
a run of that advantage; one line names the first thing that does not fit. From the same SFT
checkpoint this gives the logged run's weights bit for bit (the update's own random numbers
aside: --minibatches > 1, Clip-/KL-Cov); with another --loss or knob, the same data under
another update, its ratio anchored at the logged policy's pi_old.
"""
import json
import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

import losses
from data.tasks import atomic_write, flip_numbers
from nanorl import rows
from nanorl.config import UserError
from nanorl.ddp import gather_objects

# what an algorithm's advantage reads that its own sampling computed (a Rollout field): replayed,
# it needs a log of an algorithm of the same advantage
SAMPLED = {"first_wrong": "first_wrong, CLIFF's first wrong token",
           "greedy": "baseline, ReMax's greedy answer's reward",
           "vine": "values, VinePPO's branch values", "step_group": "states, GiGPO's turn states"}


@dataclass
class Flags:  # rl.py's flags of the rollout log
    log_rollouts: int = 2  # groups of a logged step's rollout to write (negative: all, 0: none)
    log_every: int = 25  # log the first step's rollout and every this many steps
    replay: str = ""  # a rollout log (an out_dir/rollouts) to train on instead of sampling


def facts(cfg, run, world):
    """What a replay must share with the logged run: under another group size or prompts per step
    its rows would be regrouped, under another rank count split otherwise, another task, tokenizer
    or model shape reads them as something else, and at another temperature its log-probs (mu,
    pi_old) are of another policy."""
    shape = {k: v for k, v in asdict(run.model.config).items()
             if k not in ("dropout", "scalar_head")}  # PPO's value head reads the same rows
    return {"group_size": cfg.group_size, "prompts_per_step": cfg.prompts_per_step, "ranks": world,
            "temperature": cfg.temperature, "task": run.task.settings(),
            "tokenizer": run.task.tok.to_dict(), "model": shape}


def replay(cfg, algo, run, world, rank, step):
    """--replay (set) -> the step function that trains (rl.py's step) on the logged rollouts
    instead of sampling, or one line where the log does not fit the run."""
    if algo.family != "pg" or cfg.staleness or cfg.async_rollouts:
        raise UserError("--replay trains a policy-gradient algorithm on what each logged step "
                        "trained on: it needs --staleness=0 and no --async_rollouts")
    if not os.path.isdir(cfg.replay):
        raise UserError(f"--replay: no folder {cfg.replay} (a run's out_dir/rollouts)")
    return Replay(cfg.replay, facts(cfg, run, world), rank, step)


def path(folder, step, ext):
    return os.path.join(folder, f"step_{step:06d}.{ext}")


def records(task, batch, adv, step, version, G):
    """The logged rows of a Rollout -> one JSON-ready dict each (see the module's docstring)."""
    N, L = batch.mask.shape
    P = batch.ids.size(1) - L
    adv = adv[:, None].expand(N, L) if adv.dim() == 1 else adv  # (N, L)
    turn_rewards = torch.zeros(N, L) if batch.turn_rewards is None else batch.turn_rewards
    fields = {"mu": batch.mu, "old": batch.old_logp, "ref": batch.ref_logp, "adv": adv,
              "turn_reward": turn_rewards, "version": batch.version}  # version: async's only
    # each (N, L) field as lists once, not an .item() a token; ref None without a KL term
    lists = {k: v.tolist() for k, v in fields.items() if v is not None}
    masks, out, tok = batch.mask.tolist(), [], task.tok
    for r, ids in enumerate(batch.ids.tolist()):
        resp = ids[P:P + int(batch.length[r])]
        tokens = [{"text": tok.decode([i]), "role": "policy" if masks[r][t] else "env",
                   "ref": None, **{k: v[r][t] for k, v in lists.items()}}
                  for t, i in enumerate(resp)]
        prompt, response = tok.decode(ids[int(batch.offsets[r]):P]), tok.decode(resp)
        out.append({"step": step, "version": version, "group": r // G, "row": r,
                    "prompt": prompt, "response": response, "reversed": task.reverse,
                    "prompt_normal": flip_numbers(prompt, task.reverse),
                    "response_normal": task.normal_order(response), "score": batch.score[r].item(),
                    "reward": batch.reward[r].item(),
                    "turns": None if batch.turns is None else int(batch.turns[r]),
                    "truncated": not bool(batch.finished[r]), "tokens": tokens})
    return out


def due(step, cfg, batch):
    """Whether step s (just taken, with its config and the rollout it trained on, or None) is
    logged: step 1 and every --log_every-th; one without an update only in a replayable log
    (every group, every step)."""
    if not cfg.log_rollouts or step != 1 and step % cfg.log_every:  # not a logged step
        return False
    return batch is not None or cfg.log_rollouts < 0 and cfg.log_every == 1  # a replayable log


def write(run, cfg, batch, stats, adv):
    """The rollout step s (run.state.step, just taken, with cfg: its config) trained on (None: it
    made no update) and the sampling stats of that rollout, on every rank ->
    out_dir/rollouts/step_<s>.jsonl and .pt (rank 0 writes): the first --log_rollouts groups
    (negative: all) over the ranks' rows in rank order. The reference's log-probs go in the
    records, not in the rows a replay trains on (its own algorithm computes its own)."""
    step, G = run.state.step, cfg.group_size
    N = 0 if batch is None else len(batch.ids)
    n = N if cfg.log_rollouts < 0 else min(N, cfg.log_rollouts * G)  # this rank's rows to send
    mine = {"rows": N, "stats": stats, "records": [], "batch": None}
    if n:
        part = rows.Rollout(**{k: v[:n] for k, v in rows.to_dict(batch).items()})
        version = max(0, step - 1 - cfg.staleness)
        mine["records"] = records(run.task, part, adv[:n], step, version, G)
        mine["batch"] = {k: v.cpu() for k, v in rows.to_dict(part).items() if k != "ref_logp"}
    ranks = gather_objects(mine)  # every rank's, in rank order
    if dist.is_initialized() and dist.get_rank():
        return
    left = sum(r["rows"] for r in ranks) if cfg.log_rollouts < 0 else cfg.log_rollouts * G
    recs, offset = [], 0  # offset: the rows of the ranks before
    for rank, share in enumerate(ranks):
        kept = share["records"][:left]
        recs += [{**rec, "rank": rank, "row": rec["row"] + offset,
                  "group": (rec["row"] + offset) // G} for rec in kept]
        share["batch"] = share["batch"] and {k: v[:len(kept)] for k, v in share["batch"].items()}
        left, offset = left - len(kept), offset + share["rows"]
    folder = os.path.join(cfg.out_dir, "rollouts")
    atomic_write(path(folder, step, "jsonl"),
                 lambda f: f.writelines(json.dumps(r) + "\n" for r in recs))
    logged = {"step": step, "whole": len(recs) == offset, "loss": cfg.loss,
              "facts": facts(cfg, run, len(ranks)),
              "ranks": [{"batch": share["batch"], "stats": share["stats"]} for share in ranks]}
    atomic_write(path(folder, step, "pt"), lambda f: torch.save(logged, f), "wb")
    if cfg.wandb and recs:  # the same rows as a wandb Table (TRL's log_completions)
        wandb_table(recs, step)


def wandb_table(recs, step):
    import wandb
    if wandb.run is None:  # not rank 0, or wandb failed to start (the Logger said so)
        return
    cols = ["step", "version", "group", "prompt", "response", "score", "reward", "turns"]
    try:
        table = wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in recs])
        wandb.log({"rollouts": table}, step=step)
    except Exception as e:  # as the Logger: wandb never stops a run
        print(f"warning: the rollouts' wandb Table not logged ({type(e).__name__}: {e})",
              flush=True)


def load(file):
    """A step's .pt -> its dict, or one line naming the file."""
    try:
        d = torch.load(file, weights_only=True)
        assert isinstance(d, dict) and {"step", "whole", "loss", "facts", "ranks"} <= set(d)
    except Exception as e:
        raise UserError(f"{file}: not a whole rollout log file ({type(e).__name__}); was its "
                        "run killed while writing it, or written before this version? (a "
                        ".tmp.<pid> file is a partial one)") from None
    return d


class Replay:
    """rl.py's step under --replay: train on step s's logged rollout of this rank."""

    def __init__(self, folder, facts, rank, step):
        self.folder, self.facts, self.rank, self.step = folder, facts, rank, step  # rl.py's
        steps = [int(f[5:11]) for f in os.listdir(folder) if f.startswith("step_") and
                 f.endswith(".pt")]
        if not steps:
            raise UserError(f"--replay: {folder} holds no step_<s>.pt (log a run with "
                            "--log_rollouts=-1 --log_every=1)")
        self.last = max(steps)

    def __call__(self, cfg, algo, run, lr, gen):
        step = run.state.step + 1
        file = path(self.folder, step, "pt")
        if step > self.last:
            raise UserError(f"--replay: {self.folder} ends at step {self.last}; set "
                            f"--max_iters={self.last}")
        if not os.path.exists(file):
            raise UserError(f"--replay: {self.folder} has no step {step}: replay needs the log "
                            "of every step (--log_rollouts=-1 --log_every=1)")
        d = load(file)
        if d["step"] != step:
            raise UserError(f"{file}: holds step {d['step']}, not {step}")
        if not d["whole"]:
            raise UserError(f"{file}: holds some groups of the step, not all: replay needs "
                            "--log_rollouts=-1 --log_every=1")
        self.check(file, d, cfg, algo)
        mine, dev = d["ranks"][self.rank], next(run.model.parameters()).device
        batch = rows.from_dict(mine["batch"], dev)
        return self.step(cfg, algo, run, lr, gen, (batch, mine["stats"]))

    def check(self, file, d, cfg, algo):
        """One line for the first fact the logged run does not share with this one, or a column
        this algorithm reads that the logged algorithm's sampling did not compute."""
        for key, want in self.facts.items():  # a fact an older log lacks: None
            if d["facts"].get(key) != want:
                raise UserError(f"--replay: {file} was logged with {key} "
                                f"{d['facts'].get(key)!r}; this run has {want!r}")
        logged = losses.ALGOS[d["loss"]].advantage if d["loss"] in losses.ALGOS else None
        if algo.advantage in SAMPLED and logged != algo.advantage:
            raise UserError(f"--replay: {cfg.loss} reads {SAMPLED[algo.advantage]}, which its "
                            f"own sampling computes; {file} is a {d['loss']} run's")
