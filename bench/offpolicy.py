"""
The off-policy lab's staleness table: grpo trained on rollouts sampled k updates earlier (or by a bf16
sampler), with each rollout correction, from one SFT checkpoint.

    python bench/offpolicy.py --seeds=1337,1338      # 13 settings x 2 seeds, ~30 min on 2 CPU cores
    python bench/offpolicy.py --stalenesses=1 --corrections=none,tis --bf16_row=false --seeds=1 \
        --max_iters=2 --eval_interval=2 --eval_samples=0 --rl_args="--prompts_per_step=8"   # a dry run

Rows: --staleness k in {0, 2, 8} x correction in {none, tis, icepop, decoupled}, then one row with
--sampler_bf16=true at k = 0. Each (row, seed) is one rl.py run of compare.py's (compare.run: 1 thread,
compare.py's step budget and eval steps) in out_dir/<row>/runs/<loss>-s<seed>, --jobs at a time.
Columns, mean ± std over the seeds: final test accuracy and its change, KL to the reference (eval),
clip fractions, the share of tokens the correction capped or masked and the mean over sequences of
|sum_t (log pi_old - log mu)|, the trainer's pi_old against the sampler's mu (— where pi_old = mu by
construction). Writes out_dir/offpolicy.md.
"""
import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import mean
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import compare  # noqa: E402
from nanorl.checkpoint import ckpt_settings, load_checkpoint  # noqa: E402
from nanorl.config import UserError, print_config, run_cli  # noqa: E402
from data.tasks import ensure_data  # noqa: E402
from nanorl.evaluate import pass_k_name  # noqa: E402

CORRECTIONS = {"none": [], "tis": ["--rollout_is=tis"], "seq_tis": ["--rollout_is=seq_tis"],
               "icepop": ["--rollout_is=icepop"], "decoupled": ["--decoupled=true"]}  # -> rl.py flags
HEAD = ("setting | test accuracy | Δ points | KL to ref | clipfrac low / high | capped or masked | "
        "mean abs(log π_old − log μ) per sequence | train s")
FORMATS = ("{:.3f}", "{:+.1f}", "{:.4f}", "{:.2f}%", "{:.2f}%", "{:.2f}%", "{:.4f}", "{:.0f}")


@dataclass
class Config:
    seeds: str = "1337,1338"  # comma-separated; every setting runs once per seed
    stalenesses: str = "0,2,8"  # --staleness values
    corrections: str = "none,tis,icepop,decoupled"  # of none, tis, seq_tis, icepop, decoupled
    bf16_row: bool = True  # one more row: --sampler_bf16=true at staleness 0, no correction
    loss: str = "grpo"  # at its defaults
    max_iters: int = compare.Config.max_iters  # compare.py's step budget
    eval_interval: int = compare.Config.eval_interval
    eval_samples: int = compare.Config.eval_samples
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/offpolicy"
    jobs: int = 2  # rl.py runs at a time, 1 thread each
    rl_args: str = ""  # more rl.py flags for every run


def settings(cfg):
    """[(row label, folder, rl.py flags)] in table order."""
    try:
        ks = [int(k) for k in cfg.stalenesses.split(",") if k.strip()]
    except ValueError:
        raise UserError(f"--stalenesses must be comma-separated integers, got {cfg.stalenesses!r}") from None
    fixes = [c.strip() for c in cfg.corrections.split(",") if c.strip()]
    bad = [c for c in fixes if c not in CORRECTIONS] + [k for k in ks if k < 0]
    if bad or not ks or not fixes:
        raise UserError(f"need stalenesses >= 0 and corrections of {', '.join(CORRECTIONS)}; "
                        f"got {bad or 'none'}")
    rows = [(f"k={k} {c}", f"k{k}-{c}", [f"--staleness={k}", *CORRECTIONS[c]]) for k in ks for c in fixes]
    return rows + ([("k=0 none, sampler_bf16", "bf16", ["--sampler_bf16=true"])] if cfg.bf16_row else [])


def logged_mean(r, key, scale=1.0):
    """A run's mean of a per-step key over the steps that logged it; None if none did."""
    xs = [x[key] for x in r["rows"] if key in x]
    return scale * mean(xs) if xs else None


def table(runs, labels, pk):
    """Markdown table: one row per setting, mean ± std over its seeds; failed runs name their logs."""
    lines = [f"| {HEAD} |", "|---" * (HEAD.count("|") + 1) + "|"]
    for label in labels:
        mine = [r for r in runs if r["setting"] == label]
        bad = [f"{r['folder']}/runs/{r['name']}/log.txt" for r in mine if not r["ok"]]
        note = f" ({len(bad)} of {len(mine)} seeds failed: see {', '.join(bad)})" if bad else ""
        cols = [[n[2], n[3], n[6], n[9], n[10], logged_mean(r, "rl/is_capped_frac", 100),
                 logged_mean(r, "rl/old_mu_seq_mean"), n[11]]
                for r in mine if r["ok"] for n in [compare.numbers(r, pk)]]
        cells = list(map(compare.mean_std, zip(*cols) if cols else [[None]] * len(FORMATS), FORMATS))
        lines.append(f"| {label}{note} | {' | '.join(cells[:3])} | {cells[3]} / {cells[4]} | "
                     f"{' | '.join(cells[5:])} |")
    return lines


def main(cfg):
    steps, seeds, extra = compare.parse(compare.Config(
        losses=cfg.loss, seeds=cfg.seeds, max_iters=cfg.max_iters, eval_interval=cfg.eval_interval,
        eval_samples=cfg.eval_samples, jobs=cfg.jobs, rl_args=cfg.rl_args))
    rows = settings(cfg)
    own = ("staleness", "rollout_is", "decoupled", "sampler_bf16")
    taken = [a for a in extra if a[2:].split("=")[0] in own]
    if taken:
        raise UserError(f"--rl_args: {taken[0]} is set by each row of the table")
    print_config(cfg)
    ensure_data(ckpt_settings(load_checkpoint(cfg.sft_ckpt), cfg.sft_ckpt, "task")[0])  # once, not per run

    def one(job):
        (label, folder, flags), seed = job
        where = SimpleNamespace(**{**vars(cfg), "out_dir": os.path.join(cfg.out_dir, folder)})
        r = compare.run(where, cfg.loss, seed, steps[cfg.loss], [*extra, *flags])
        return {**r, "setting": label, "folder": folder}
    with ThreadPoolExecutor(cfg.jobs or 2) as pool:  # Ctrl-C reaches each rl.py: it saves and stops
        runs = list(pool.map(one, [(row, seed) for row in rows for seed in seeds]))
    lines = table(runs, [label for label, _, _ in rows], pass_k_name(cfg.eval_samples))
    argv = [f"--{k}={v}" for k, v in vars(cfg).items() if v != getattr(Config, k)]
    md = ["# Off-policy lab: staleness x correction", "",
          "    " + shlex.join(["python", "bench/offpolicy.py", *argv]),
          "", f"- {cfg.loss} at its defaults, {cfg.max_iters} steps, seeds {cfg.seeds}", "", *lines]
    path = os.path.join(cfg.out_dir, "offpolicy.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(lines + [f"wrote {path}"]))
    failed = [f"{r['folder']}/{r['name']}" for r in runs if not r["ok"]]
    return {"runs": runs, "failed": failed, "table": lines}


if __name__ == "__main__":
    sys.exit(1 if run_cli(main, Config)["failed"] else 0)
