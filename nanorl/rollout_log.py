"""The rollout log, opened by --log_rollouts: a sample of each logged step's rollout as a person
reads it and as the trainer took it, and --replay, which trains on a log instead of sampling.

    python rl.py --loss=grpo                                           # 2 groups every 25 steps
    python rl.py --loss=grpo --log_rollouts=-1 --log_every=1 --out_dir=out/rl-log   # every group
    python rl.py --loss=dapo --replay=out/rl-log/rollouts --out_dir=out/rl-replay   # the same data
    python -m nanorl.view out/rl-log                                   # read it (nanorl/view.py)

Step s writes out_dir/rollouts/step_<s>.jsonl, a record per row of its first --log_rollouts
groups (negative: all) after the advantages are computed: step, version (the weights that
sampled it), group, prompt and response as the model reads them, score, reward, turns,
truncated, and per response token its text, role (policy or env: the environment's tokens), mu,
old (pi_old), ref (the reference's log-prob, when the row has a KL term, else null), adv,
turn_reward and (async) version; and step_<s>.pt, those
rows as the Rollout the trainer took (and the step's sampling stats). Both are written to a
temporary name and renamed, so a killed run leaves whole files only. With --wandb=true the rows
are also a wandb Table, "rollouts". Cost on the default task (2 groups of 16 rows every 25 steps):
42 KB and 2 ms a logged step, 0.5 MB over a 300-step run (bench/README.md).

--replay=DIR: step s trains on DIR's step_<s>.pt instead of sampling (the log of a run with
--log_rollouts=-1 --log_every=1; a step without a file had no update). From the same SFT
checkpoint this gives the logged run's weights bit for bit (the update's own random numbers aside:
--minibatches > 1, Clip-/KL-Cov); with another --loss or knob, the same data under another update,
its ratio anchored at the logged policy's pi_old.
"""
import json
import os
from dataclasses import dataclass

import torch

from nanorl import offpolicy
from nanorl.config import UserError
from nanorl.rows import take


@dataclass
class Flags:  # rl.py's flags of the rollout log
    log_rollouts: int = 2  # groups of a logged step's rollout to write (negative: all, 0: none)
    log_every: int = 25  # log the rollout of every this many steps
    replay: str = ""  # a rollout log (an out_dir/rollouts) to train on instead of sampling


def replay(cfg, algo, rollout_cls):
    """--replay (set) -> the Replay that stands in for rl.py's sampler, or one line where it
    does not fit the run."""
    if algo.family != "pg" or cfg.staleness or cfg.async_rollouts:
        raise UserError("--replay trains a policy-gradient row on what each logged step trained "
                        "on: it needs --staleness=0 and no --async_rollouts")
    if not os.path.isdir(cfg.replay):
        raise UserError(f"--replay: no folder {cfg.replay} (a run's out_dir/rollouts)")
    return Replay(cfg.replay, rollout_cls)


def path(folder, step, ext):
    return os.path.join(folder, f"step_{step:06d}.{ext}")


def atomic(target, write):
    """write(tmp path) then rename: a reader finds the whole file or none."""
    tmp = target + ".tmp"
    write(tmp)
    os.replace(tmp, target)


def records(tok, batch, adv, ref_lp, step, version, G):
    """The logged rows of a Rollout -> one JSON-ready dict each (see the module's docstring)."""
    N, L = batch.mask.shape
    P = batch.ids.size(1) - L
    adv = adv[:, None].expand(N, L) if adv.dim() == 1 else adv  # (N, L)
    turn_rewards = torch.zeros(N, L) if batch.turn_rewards is None else batch.turn_rewards
    fields = {"mu": batch.mu, "old": batch.old_logp, "ref": ref_lp, "adv": adv,
              "turn_reward": turn_rewards, "version": batch.version}  # version: async's only
    # each (N, L) field as lists once, not an .item() a token; ref None without a KL term
    lists = {k: v.tolist() for k, v in fields.items() if v is not None}
    masks, out = batch.mask.tolist(), []
    for r, ids in enumerate(batch.ids.tolist()):
        resp = ids[P:P + int(batch.length[r])]
        tokens = [{"text": tok.decode([i]), "role": "policy" if masks[r][t] else "env",
                   "ref": None, **{k: v[r][t] for k, v in lists.items()}}
                  for t, i in enumerate(resp)]
        out.append({"step": step, "version": version, "group": r // G, "row": r,
                    "prompt": tok.decode(ids[int(batch.offsets[r]):P]),
                    "response": tok.decode(resp), "score": batch.score[r].item(),
                    "reward": batch.reward[r].item(),
                    "turns": None if batch.turns is None else int(batch.turns[r]),
                    "truncated": not bool(batch.finished[r]), "tokens": tokens})
    return out


def write(cfg, run, batch, stats, adv, ref_lp):
    """Step s's first --log_rollouts groups (negative: all) -> out_dir/rollouts/step_<s>.jsonl
    and .pt."""
    step, G = run.state.step + 1, cfg.group_size
    n = len(batch.ids) if cfg.log_rollouts < 0 else min(len(batch.ids), cfg.log_rollouts * G)
    rows = torch.arange(n)
    part = take(batch, rows)
    folder = os.path.join(cfg.out_dir, "rollouts")
    os.makedirs(folder, exist_ok=True)
    version = max(0, step - 1 - cfg.staleness)  # the weights that sampled it
    recs = records(run.task.tok, part, adv[rows], None if ref_lp is None else ref_lp[rows], step,
                   version, G)

    def jsonl(tmp):
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    atomic(path(folder, step, "jsonl"), jsonl)
    whole = n == len(batch.ids)
    atomic(path(folder, step, "pt"), lambda tmp: torch.save(
        {"step": step, "whole": whole, "batch": offpolicy.to_dict(part), "stats": stats}, tmp))
    if cfg.wandb:  # the same rows as a wandb Table (TRL's log_completions), where wandb runs
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
        assert isinstance(d, dict) and {"step", "whole", "batch", "stats"} <= set(d)
    except Exception as e:
        raise UserError(f"{file}: not a whole rollout log file ({type(e).__name__}); was its "
                        "run killed while writing it? (a .tmp file is a partial one)") from None
    return d


class Replay:
    """rl.py's sampler under --replay: step s's logged rollout and stats, from DIR."""

    def __init__(self, folder, rollout_cls):
        self.folder, self.rollout_cls = folder, rollout_cls
        steps = [int(f[5:11]) for f in os.listdir(folder) if f.startswith("step_") and
                 f.endswith(".pt")]
        if not steps:
            raise UserError(f"--replay: {folder} holds no step_<s>.pt (log a run with "
                            "--log_rollouts=-1 --log_every=1)")
        self.last = max(steps)

    def __call__(self, cfg, algo, run, gen):
        step = run.state.step + 1
        file = path(self.folder, step, "pt")
        if not os.path.exists(file):
            if step > self.last:
                raise UserError(f"--replay: {self.folder} ends at step {self.last}; set "
                                f"--max_iters={self.last}")
            return None, {}  # the logged run made no update at this step
        d = load(file)
        if d["step"] != step:
            raise UserError(f"{file}: holds step {d['step']}, not {step}")
        if not d["whole"]:
            raise UserError(f"{file}: holds some groups of the step, not all: replay needs "
                            "--log_rollouts=-1 --log_every=1")
        dev = next(run.model.parameters()).device
        return offpolicy.from_dict(d["batch"], dev, self.rollout_cls), d["stats"]
