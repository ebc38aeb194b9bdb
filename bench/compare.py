"""Every RL post-training algorithm from one SFT checkpoint, side by side: compare.md and .png.

    python bench/compare.py --losses=grpo,dr_grpo,sft --seeds=1,2,3 --rl_args="--minibatches=4"

Each (loss, seed) is one rl.py run on 1 thread in out_dir/runs/<loss>-s<seed>; the baselines
(continued SFT, rejection-sampling fine-tuning) train as long as max_iters RL steps."""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import mean, stdev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # python bench/compare.py runs from anywhere
import losses as L  # noqa: E402
import rl  # noqa: E402
from data.tasks import TASKS, ensure_data  # noqa: E402
from nanorl.checkpoint import ckpt_settings, load_checkpoint  # noqa: E402
from nanorl.config import UserError, load_config, print_config, run_cli  # noqa: E402
from nanorl.evaluate import pass_k_name  # noqa: E402

RL_PY = os.path.join(ROOT, "rl.py")
# baseline steps that train as long as one RL step (sft only trains, rft also samples), measured
# at rl.py's defaults on 1 thread; the train s column shows how close they come elsewhere
BASELINE_STEPS_PER_RL_STEP = {"sft": 4.6, "rft": 1.25}
HEAD = ("algorithm | steps | test accuracy before → after | Δ points | pass@1 | {pk} | "
        "KL to ref | resp len | truncated | clipfrac low / high | train s | wall s")
ROW = "{} | {} → {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {}"  # a number per {}
FORMATS = ("{:.0f}", "{:.3f}", "{:.3f}", "{:+.1f}", "{:.3f}", "{:.3f}", "{:.4f}", "{:.2f}",
           "{:.1f}%", "{:.2f}%", "{:.2f}%", "{:.0f}", "{:.0f}")


@dataclass
class Config:
    losses: str = ""  # comma-separated names in losses.ALGOS; "" = all but opd, gkd (need a teacher)
    seeds: str = "1337"  # comma-separated; every loss runs once per seed
    max_iters: int = 24  # steps per RL / preference run (rl.py's 300 would take hours here)
    eval_interval: int = 8  # held-out eval every this many steps (and at step 0 and the end)
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/compare"
    jobs: int = 0  # runs at a time, 1 thread each; 0 = min(2, CPU cores)
    baseline_budget: str = "auto"  # steps per baseline run: "auto" (as long as an RL run) or "50"
    pairs: str = "offline"  # the preference rows' pairs: offline (data files) or online
    rl_args: str = ""  # more rl.py flags for every run, e.g. "--minibatches=4 --lr=1e-4"
    wandb: bool = False  # every run logs to wandb in one group (name it in rl_args: --wandb_group)


def parse(cfg):
    """Validated ({loss: steps} in table order, seeds, extra rl.py args)."""
    names = [n.strip() for n in cfg.losses.split(",") if n.strip()] or [
        n for n, a in L.ALGOS.items() if "teacher" not in a.needs]  # opd, gkd: need --teacher_ckpt
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
    load_config(rl.Config, extra)  # unknown rl.py keys or bad values fail here
    own = {"loss", "seed", "threads", "wandb_run_name", *vars(cfg)}
    taken = [a for a in extra if a.startswith("--") and a[2:].split("=")[0] in own]
    if taken:
        raise UserError(f"--rl_args: {taken[0]} is set by compare.py itself (use its own flag)")
    base = {n: max(1, round(cfg.max_iters * k)) if b == "auto" else int(b)
            for n, k in BASELINE_STEPS_PER_RL_STEP.items()}
    return {n: base.get(n, cfg.max_iters) for n in L.ALGOS if n in names}, seeds, extra


def run(cfg, loss, seed, steps, extra):
    """One rl.py run in a fresh folder: its name, loss, wall time, ok, evals and metrics rows."""
    name = f"{loss}-s{seed}"
    out = os.path.join(cfg.out_dir, "runs", name)
    if os.path.exists(out):  # kept aside: rl.py would append to its metrics.jsonl
        os.rename(out, next(f"{out}.old{k}" for k in range(1, 10**6)
                            if not os.path.exists(f"{out}.old{k}")))
    os.makedirs(out)
    cmd = [sys.executable, RL_PY, f"--loss={loss}", f"--seed={seed}", f"--sft_ckpt={cfg.sft_ckpt}",
           f"--out_dir={out}", "--threads=1", f"--max_iters={steps}", f"--wandb_run_name={name}",
           f"--eval_samples={cfg.eval_samples}",  # evals at the same fractions of every run:
           f"--eval_interval={max(1, steps * cfg.eval_interval // cfg.max_iters)}", *extra,
           *([f"--pairs={cfg.pairs}"] if L.ALGOS[loss].family == "pref" else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(os.path.join(out, "log.txt"), "w") as log:
        print(shlex.join(cmd), file=log, flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall_s, path = time.time() - t0, os.path.join(out, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    evals = [x for x in rows if "eval/accuracy" in x]
    ok = rc == 0 and bool(evals)
    acc = " -> ".join(f"{x['eval/accuracy']:.3f}" for x in evals[:1] + evals[-1:])
    print(f"{name}: " + (f"test accuracy {acc}" if ok else f"FAILED, see {log.name}"), flush=True)
    return dict(name=name, loss=loss, wall_s=wall_s, ok=ok, evals=evals, rows=rows)


def numbers(r, pk):
    """A finished run's numbers for ROW, as FORMATS orders them; None where not logged (the KL,
    lengths and pass@k come from eval_samples samples)."""
    e = r["evals"][-1]
    before, after = r["evals"][0]["eval/accuracy"], e["eval/accuracy"]
    clip = [[x[k] for x in r["rows"] if k in x] for k in ("rl/clipfrac_low", "rl/clipfrac_high")]
    clip = [100 * mean(c) if c else None for c in clip]  # (low, high), % of tokens
    cut = 100 * e["eval/truncated_frac"] if "eval/truncated_frac" in e else None  # eval_samples 0
    return [e["step"], before, after, 100 * (after - before), e.get("eval/pass@1"),
            e.get("eval/" + pk), e.get("eval/kl"), e.get("eval/resp_len"), cut, *clip,
            e["perf/train_s"], r["wall_s"]]


def mean_std(xs, fmt):
    """'m' for one value, 'm ± s' (sample std) for several; '—' for none."""
    xs = [x for x in xs if x is not None]
    std = f" ± {fmt.replace('+', '').format(stdev(xs))}" if len(xs) > 1 else ""  # a spread has no sign
    return fmt.format(mean(xs)) + std if xs else "—"


def table(runs, names, pk):
    """Markdown table: one row per loss, mean ± std over its seeds; failed runs name their logs."""
    lines = [f"| {HEAD.format(pk=pk)} |", "|---" * (HEAD.count("|") + 1) + "|"]
    for n in names:
        mine = [r for r in runs if r["loss"] == n]
        bad = [f"runs/{r['name']}/log.txt" for r in mine if not r["ok"]]
        note = f" ({len(bad)} of {len(mine)} seeds failed: see {', '.join(bad)})" if bad else ""
        values = zip(*[numbers(r, pk) for r in mine if r["ok"]] or [[None] * len(FORMATS)])
        lines.append(f"| {n}{note} | {ROW.format(*map(mean_std, values, FORMATS))} |")
    return lines


def plot(runs, names, path):
    """compare.png: test accuracy vs step and vs training seconds; False without matplotlib."""
    try:
        import matplotlib.figure  # not pyplot: no GUI backend, nothing to close
    except ImportError:
        return False
    fig = matplotlib.figure.Figure(figsize=(13, 4.5), layout="tight")
    axes, xs = fig.subplots(1, 2), ("step", "perf/train_s")  # the x of each panel
    for i, n in enumerate(names):
        ok = [r for r in runs if r["loss"] == n and r["ok"]]
        if not ok:
            continue
        evals = list(zip(*(r["evals"] for r in ok)))  # the evals every seed reached, (eval, seed)
        curve = {x: [mean(e[x] for e in es) for es in evals] for x in (*xs, "eval/accuracy")}
        base = L.ALGOS[n].family == "sft"  # dashed, vs seconds only: their steps are no RL steps
        style = "--" if base else ".-" if i < 10 else ".:"  # 10 colours, then dotted
        color = "black" if n == "sft" else "gray" if base else f"C{i % 10}"
        for ax, x in list(zip(axes, xs))[base:]:
            ax.plot(curve[x], curve["eval/accuracy"], style, color=color, label=n)
            ax.set(xlabel=x, ylabel="eval/accuracy (test split, mean over seeds)")
    axes[1].legend(fontsize=8, ncol=2)
    fig.savefig(path, dpi=72)
    return True


def main(cfg):
    steps, seeds, extra = parse(cfg)
    ckpt = load_checkpoint(cfg.sft_ckpt)
    task, labels = ckpt_settings(ckpt, cfg.sft_ckpt, "task")[0], ckpt["config"].get("n_train") or "all"
    try:  # out_dir/runs exists and out_dir is writable, or one clear error before any run
        os.makedirs(os.path.join(cfg.out_dir, "runs"), exist_ok=True)
        tempfile.TemporaryFile(dir=cfg.out_dir).close()
    except OSError as e:
        raise UserError(f"out_dir {cfg.out_dir} is not writable ({e.strerror or e!r})") from None
    print_config(cfg)
    if task in TASKS:  # generated once here, not by parallel runs (rg:, env:, folders: no files)
        ensure_data(task)
    if cfg.wandb:  # first, so that a --wandb_group in rl_args wins
        extra = ["--wandb=true", time.strftime("--wandb_group=compare-%Y%m%d-%H%M%S"), *extra]
    todo = [(n, s, k, extra) for n, k in steps.items() for s in seeds]
    # Ctrl-C reaches each rl.py (it saves and stops) and map cancels the runs not yet started
    with ThreadPoolExecutor(cfg.jobs or min(2, os.cpu_count() or 1)) as pool:
        runs = list(pool.map(lambda args: run(cfg, *args), todo))

    lines = table(runs, list(steps), pass_k_name(cfg.eval_samples))
    drew = plot(runs, list(steps), os.path.join(cfg.out_dir, "compare.png"))
    base = ", ".join(f"{n} {k}" for n, k in steps.items() if L.ALGOS[n].family == "sft") or "-"
    argv = [f"--{k}={v}" for k, v in vars(cfg).items() if v != getattr(Config, k)]
    md = ["# Algorithm comparison", "", "    " + shlex.join(["python", "bench/compare.py", *argv]), "",
          f"- steps: {cfg.max_iters} per run; baselines (budget {cfg.baseline_budget}): {base}",
          f"- held out: the {task} test split; KL, resp len, truncated: 4 samples of 256 prompts",
          f"- labels: the SFT checkpoint's ({labels} train problems), the only ones continued SFT sees",
          "", *lines, "", "![curves](compare.png)" if drew else
          "no compare.png: matplotlib is not installed (pip install matplotlib)"]
    path = os.path.join(cfg.out_dir, "compare.md")
    with open(path + ".tmp", "w") as f:  # written whole, then renamed: no reader sees half a file
        f.write("\n".join(md) + "\n")
    os.replace(path + ".tmp", path)
    print("\n".join(lines + [f"wrote {path}" + (" and compare.png" if drew else f"; {md[-1]}")]))
    return {"runs": runs, "failed": [r["name"] for r in runs if not r["ok"]], "table": lines}


if __name__ == "__main__":
    sys.exit(1 if run_cli(main, Config)["failed"] else 0)
