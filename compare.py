"""
Every RL post-training algorithm on one SFT checkpoint, side by side: a table and curves.

    python compare.py                                  # every loss + 2 baselines, 1 seed
    python compare.py --losses=grpo,dr_grpo,sft --seeds=1,2,3 --rl_args="--minibatches=4"

Each (loss, seed) is one `python rl.py --loss=X --seed=S --threads=1 ...`, `jobs` at a time, logging
to out_dir/runs/<loss>-s<seed>/log.txt. Policy-gradient and preference losses train max_iters steps,
the baselines (continued SFT, rejection-sampling fine-tuning) as many steps as train as long. Writes
out_dir/compare.md (mean ± std over seeds) and compare.png (needs matplotlib). Input is checked
before the first run; an earlier run folder is kept as <name>.old<k>; a failed run is a row.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, fields, replace

import losses as L
import rl
from checkpoint import ckpt_settings, load_checkpoint
from config import UserError, load_config, print_config, run_cli
from data.tasks import ensure_data
from evaluate import pass_k_name
from logger import Logger, fmt_time

RL_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rl.py")
# baseline steps that train as long as one RL step (sft only trains, rft also samples), measured
# at rl.py's defaults on 1 thread; the train s column shows how close they come elsewhere
BASELINE_STEPS_PER_RL_STEP = {"sft": 4.6, "rft": 1.25}
SET_BY_COMPARE = ("loss", "seed", "sft_ckpt", "out_dir", "threads", "max_iters", "eval_interval",
                  "eval_samples", "wandb", "wandb_project", "wandb_group", "wandb_run_name")
HEAD = ("algorithm | steps | test accuracy before → after | Δ points | pass@1 | {pk} | KL to ref | "
        "resp len | truncated | clipfrac low / high | train s | wall s")
ROW = "{} | {} → {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {}"  # a number per {}
FORMATS = ("{:.0f}", "{:.3f}", "{:.3f}", "{:+.1f}", "{:.3f}", "{:.3f}", "{:.4f}", "{:.2f}",
           "{:.1f}%", "{:.2f}%", "{:.2f}%", "{:.0f}", "{:.0f}")


@dataclass
class Config:
    losses: str = ""  # comma-separated names in losses.ALGOS; "" = all of them
    seeds: str = "1337"  # comma-separated; every loss runs once per seed
    max_iters: int = 24  # steps per RL / preference run (rl.py's 300 would take hours here)
    eval_interval: int = 8  # held-out eval every this many steps (and at step 0 and the end)
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/compare"
    jobs: int = 0  # runs at a time, 1 thread each; 0 = min(2, CPU cores)
    baseline_budget: str = "auto"  # steps per baseline run: "auto" (as long as an RL run) or "50"
    rl_args: str = ""  # more rl.py flags for every run, e.g. "--minibatches=4 --lr=1e-4"
    wandb: bool = False  # every run logs to wandb in one group, plus a summary run
    wandb_project: str = "nanorl"
    wandb_group: str = ""  # "" = compare-<date>-<time>
    wandb_run_name: str = "compare"  # the summary run


def parse(cfg):
    """Validated ({loss: steps} in table order, seeds, extra rl.py args, their rl.py config)."""
    names = [n.strip() for n in cfg.losses.split(",") if n.strip()] or list(L.ALGOS)
    bad = [n for n in names if n not in L.ALGOS]
    if bad:
        raise UserError(f"unknown loss {bad[0]!r} in --losses; valid: {', '.join(L.ALGOS)}")
    try:
        seeds = list(dict.fromkeys(int(s) for s in cfg.seeds.split(",") if s.strip()))
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {cfg.seeds!r}") from None
    if min(len(seeds), cfg.max_iters, cfg.eval_interval) < 1 or min(cfg.jobs, cfg.eval_samples) < 0:
        raise UserError("need seeds, max_iters and eval_interval >= 1, jobs and eval_samples >= 0")
    b = cfg.baseline_budget
    if b != "auto" and not (b.isdigit() and int(b) > 0):
        raise UserError(f"--baseline_budget must be auto or steps like 50, got {b!r}")
    extra = shlex.split(cfg.rl_args)
    rl_cfg = load_config(rl.Config, extra)  # unknown rl.py keys or bad values fail here
    taken = [a for a in extra if a.startswith("--") and a[2:].split("=")[0] in SET_BY_COMPARE]
    if taken:
        raise UserError(f"--rl_args: {taken[0]} is set by compare.py itself (use its own flag)")
    base = {n: max(1, round(cfg.max_iters * k)) if b == "auto" else int(b)
            for n, k in BASELINE_STEPS_PER_RL_STEP.items()}
    return {n: base.get(n, cfg.max_iters) for n in L.ALGOS if n in names}, seeds, extra, rl_cfg


def make_run(cfg, loss, seed, steps, extra, group):
    """One run: name, folder and rl.py command; every run evaluates at the same fractions of it."""
    name, every = f"{loss}-s{seed}", max(1, steps * cfg.eval_interval // cfg.max_iters)
    run_dir = os.path.join(cfg.out_dir, "runs", name)
    cmd = [sys.executable, RL_PY, f"--loss={loss}", f"--seed={seed}", f"--sft_ckpt={cfg.sft_ckpt}",
           f"--out_dir={run_dir}", "--threads=1", f"--max_iters={steps}",
           f"--eval_interval={every}", f"--eval_samples={cfg.eval_samples}", *extra]
    if cfg.wandb:
        cmd += ["--wandb=true", f"--wandb_project={cfg.wandb_project}", f"--wandb_group={group}",
                f"--wandb_run_name={name}"]
    return dict(name=name, loss=loss, dir=run_dir, cmd=cmd)


def run_one(r):
    """Run one rl.py command in a fresh folder; add its exit status, wall time and metrics rows."""
    if os.path.exists(r["dir"]):  # kept aside: rl.py would append to its metrics.jsonl
        k = next(k for k in range(1, 10**6) if not os.path.exists(f"{r['dir']}.old{k}"))
        os.rename(r["dir"], f"{r['dir']}.old{k}")
    os.makedirs(r["dir"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(os.path.join(r["dir"], "log.txt"), "w") as log:
        print(shlex.join(r["cmd"]), file=log, flush=True)
        print(f"start {r['name']}: log in {log.name}", flush=True)
        t0 = time.time()
        rc = subprocess.run(r["cmd"], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    path = os.path.join(r["dir"], "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    evals = [x for x in rows if "eval/accuracy" in x]
    r.update(rc=rc, wall_s=time.time() - t0, ok=rc == 0 and bool(evals), evals=evals,
             train=[x for x in rows if "rl/loss" in x])
    return r


def run_all(runs, jobs):
    """Run them `jobs` at a time. A terminal's Ctrl-C reaches each rl.py (it saves and stops) and
    no further run starts."""
    pool, t0 = ThreadPoolExecutor(jobs), time.time()
    try:
        for i, done in enumerate(as_completed([pool.submit(run_one, r) for r in runs]), 1):
            r, eta = done.result(), fmt_time((time.time() - t0) / i * (len(runs) - i))
            acc = " -> ".join(f"{x['eval/accuracy']:.3f}" for x in r["evals"][:1] + r["evals"][-1:])
            res = f"test accuracy {acc}" if r["ok"] else "FAILED, see its log"
            print(f"[{i}/{len(runs)}] {r['name']}: {res} | ETA ~{eta}", flush=True)
    finally:
        pool.shutdown(cancel_futures=True)


def mean_std(xs, fmt):
    """'m' for one value, 'm ± s' (sample std) for several; '—' for none."""
    xs = [x for x in xs if x is not None]
    std = f" ± {fmt.format(statistics.stdev(xs))}" if len(xs) > 1 else ""
    return fmt.format(statistics.mean(xs)) + std if xs else "—"


def numbers(r, pk):
    """A finished run's numbers for ROW, as FORMATS orders them; None where not logged."""
    e = r["evals"][-1]
    before, after = r["evals"][0]["eval/accuracy"], e["eval/accuracy"]
    clip = [[x[k] for x in r["train"] if k in x] for k in ("rl/clipfrac_low", "rl/clipfrac_high")]
    clip = [100 * statistics.mean(c) if c else None for c in clip]  # (low, high), % of tokens
    return [e["step"], before, after, 100 * (after - before), e.get("eval/pass@1"),
            e.get("eval/" + pk), e["eval/kl"], e["eval/resp_len"], 100 * e["eval/truncated_frac"],
            *clip, e["perf/train_s"], r["wall_s"]]


def table(runs, names, pk):
    """Markdown table: one row per loss, mean ± std over its seeds; failed runs name their logs."""
    head = HEAD.format(pk=pk)
    lines = [f"| {head} |", "|" + "---|" * (head.count("|") + 1)]
    for n in names:
        mine = [r for r in runs if r["loss"] == n]
        ok = [r for r in mine if r["ok"]]
        logs = ", ".join(f"runs/{r['name']}/log.txt" for r in mine if not r["ok"])
        if not ok:
            lines.append(f"| {n} | failed (see {logs}) |" + " |" * head.count(" | "))
            continue
        seeds = f" ({len(ok)} of {len(mine)} seeds; failed: see {logs})" if logs else ""
        values = zip(*[numbers(r, pk) for r in ok])  # per number, its value in each seed
        lines.append(f"| {n}{seeds} | {ROW.format(*map(mean_std, values, FORMATS))} |")
    return lines


def plot(runs, names, path):
    """compare.png: accuracy and KL vs step (not the baselines: their steps are not RL steps) and
    vs training seconds (baselines dashed), means over seeds. False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    xs, ys = ("step", "perf/train_s"), ("eval/accuracy", "eval/kl")  # rows, columns
    colors = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]  # strong first
    for i, n in enumerate(names):
        ok = [r for r in runs if r["loss"] == n and r["ok"]]
        if not ok:
            continue
        k = min(len(r["evals"]) for r in ok)  # the evals every seed reached
        mean = {key: [statistics.mean(r["evals"][j][key] for r in ok) for j in range(k)]
                for key in xs + ys}
        base = L.ALGOS[n].family == "sft"  # its steps are not RL steps: plotted vs time only
        color = "black" if n == "sft" else "gray" if base else colors[i % 20]
        for row, x in enumerate(xs[base:], start=base):
            for col, y in enumerate(ys):
                axes[row, col].plot(mean[x], mean[y], "--" if base else ".-", color=color, label=n)
    for row, x in enumerate(xs):
        for col, y in enumerate(ys):
            axes[row, col].set(xlabel=x, ylabel=y)
            axes[row, col].grid(alpha=0.3)
    axes[1, 1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=72))
    plt.close(fig)
    return True


def write_atomic(path, write):
    """write(tmp), then rename it over path: no reader sees half a file."""
    tmp = f"{path}.tmp{os.path.splitext(path)[1]}"  # savefig reads the format from the extension
    write(tmp)
    os.replace(tmp, path)


def main(cfg):
    steps, seeds, extra, rl_cfg = parse(cfg)
    task, = ckpt_settings(load_checkpoint(cfg.sft_ckpt), cfg.sft_ckpt, "task")
    try:  # out_dir/runs exists and out_dir is writable, or one clear error before any run
        os.makedirs(os.path.join(cfg.out_dir, "runs"), exist_ok=True)
        tempfile.TemporaryFile(dir=cfg.out_dir).close()
    except OSError as e:
        raise UserError(f"out_dir {cfg.out_dir} is not writable ({e.strerror or e!r})") from None
    print_config(cfg)
    ensure_data(task)  # generated once here, not by parallel runs
    jobs, t0 = cfg.jobs or min(2, os.cpu_count() or 1), time.time()
    group = cfg.wandb_group or time.strftime("compare-%Y%m%d-%H%M%S")
    runs = [make_run(cfg, n, s, k, extra, group) for n, k in steps.items() for s in seeds]
    run_all(runs, jobs)

    lines = table(runs, list(steps), pass_k_name(cfg.eval_samples))
    base = ", ".join(f"{n} {k} steps" for n, k in steps.items() if L.ALGOS[n].family == "sft")
    if base and cfg.baseline_budget == "auto":
        base += (f" (--baseline_budget=auto: {cfg.max_iters} RL steps x the step-time ratios "
                 f"{BASELINE_STEPS_PER_RL_STEP}; see the train s column)")
    argv = [f"--{f.name}={getattr(cfg, f.name)}" for f in fields(cfg)
            if getattr(cfg, f.name) != f.default]
    md = ["# Algorithm comparison", "", "    " + shlex.join(["python", "compare.py", *argv]), "",
          f"- from {cfg.sft_ckpt}, seeds {', '.join(map(str, seeds))}, {jobs} runs at a time: "
          f"{cfg.max_iters} steps of {rl_cfg.prompts_per_step} prompts × {rl_cfg.group_size} "
          f"samples per RL run (rl.py's default: {rl.Config.max_iters} steps), eval every "
          f"{cfg.eval_interval}; wall time {fmt_time(time.time() - t0)}",
          f"- baselines (sft: continued SFT, rft: rejection-sampling fine-tuning): {base or '-'}",
          f"- held out: the {task} test split; KL, resp len, truncated: 4 samples of 256 prompts; "
          "clipfrac: mean over the steps; train s: evals excluded", "", *lines, ""]
    drew = plot(runs, list(steps), os.path.join(cfg.out_dir, "compare.png"))
    md.append("![curves](compare.png)" if drew else
              "no compare.png: matplotlib is not installed (pip install matplotlib)")
    path = os.path.join(cfg.out_dir, "compare.md")
    write_atomic(path, lambda tmp: open(tmp, "w").write("\n".join(md) + "\n"))
    print("\n".join(lines + [f"wrote {path}" + (" and compare.png" if drew else f"; {md[-1]}")]))
    if cfg.wandb:
        logger = Logger(cfg.out_dir, replace(cfg, wandb_group=group))
        final = {f"{r['name']}/{k.split('/')[-1]}": v for r in runs if r["ok"]
                 for k, v in r["evals"][-1].items() if isinstance(v, (int, float))}
        logger.log({"step": 0, **final})
        logger.finish()
    failed = [r["name"] for r in runs if not r["ok"]]
    if failed:
        why = ", ".join(f"{r['name']} (exit status {r['rc']})" for r in runs if not r["ok"])
        print(f"error: {len(failed)} run(s) failed: {why}; see their logs", file=sys.stderr)
    return {"runs": runs, "failed": failed, "table": lines}


if __name__ == "__main__":
    sys.exit(1 if run_cli(main, Config)["failed"] else 0)
