"""
Every RL post-training algorithm on one SFT checkpoint, side by side: a table and curves.

    python compare.py                                  # every loss + 2 baselines, 1 seed: 7-21 min on 2 CPU cores
    python compare.py --losses=grpo,dr_grpo,dapo,sft --seeds=1,2,3 --max_iters=100
    python compare.py --rl_args="--minibatches=4"      # any rl.py flag, given to every run
    python compare.py --wandb=true                     # every run logs to wandb, all in one group

Each (loss, seed) is one `python rl.py --loss=X --seed=S --threads=1 ...` subprocess from the same SFT
checkpoint, `jobs` at a time, its output in <out_dir>/runs/<loss>-s<seed>/log.txt next to its
metrics.jsonl and checkpoints. The policy-gradient and preference losses (losses.LOSSES,
losses.PREF_LOSSES) all get max_iters steps. Then the two baselines (losses.BASELINES) get the same
training time: continued SFT on the gold answers (sft) and rejection-sampling fine-tuning on the
policy's verified-correct samples (rft). The question every RL result must answer is whether it beats
them. By default (--baseline_budget=auto) that time is a step count, max_iters x BASELINE_STEPS_PER_RL_STEP
(measured at rl.py's defaults), so the whole table is reproducible; --baseline_budget=time
gives them exactly the median RL run's training seconds (rl.py --max_seconds; evals excluded), and
then their rows depend on machine load.

Writes <out_dir>/compare.md (held-out accuracy before/after, pass@1, pass@8, KL to the reference,
response length, truncation, clip fractions, time; mean ± std over seeds) and <out_dir>/compare.png
(accuracy, KL and response length vs step and vs training seconds; needs matplotlib, optional).
Everything is checked before the first run starts; nothing in out_dir is deleted (an earlier run
folder of the same name is renamed <name>.old<k>). A run that fails becomes a row pointing at its log.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace

import losses as L
import rl
from config import UserError, load_config, print_config, run_cli
from evaluate import pass_k_name
from logger import Logger, fmt_time
from data.tasks import ensure_data
from checkpoint import ckpt_settings, load_checkpoint

ROOT = os.path.dirname(os.path.abspath(__file__))
ALL = list(L.LOSSES) + list(L.PREF_LOSSES) + list(L.BASELINES)  # the table's row order
# --baseline_budget=auto: baseline steps per RL step that take the same training time, measured at rl.py's
# defaults with 1 thread per run: a median RL step trains as long as 4.6 sft steps (no sampling) and 1.25
# rft steps (samples, then trains on the verified-correct answers only); on a second CPU 4.8 and 1.1. Other
# rl.py batch shapes shift them; the table's train-s column shows how close they came (=time: exact).
BASELINE_STEPS_PER_RL_STEP = {"sft": 4.6, "rft": 1.25}
SET_BY_COMPARE = ("loss", "seed", "sft_ckpt", "out_dir", "threads", "max_iters", "max_seconds", "eval_interval",
                  "eval_seconds", "eval_samples", "wandb", "wandb_project", "wandb_group", "wandb_run_name")


@dataclass
class Config:
    losses: str = ""  # comma-separated names of losses.LOSSES, PREF_LOSSES, BASELINES; "" = all of them
    seeds: str = "1337"  # comma-separated; every loss runs once per seed
    max_iters: int = 24  # steps per RL / preference run: smaller than rl.py's default 300, so all fits 30 min
    eval_interval: int = 8  # held-out eval every this many steps (and at step 0 and the end)
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    out_dir: str = "out/compare"
    jobs: int = 0  # runs at a time, 1 thread each; 0 = min(2, CPU cores)
    baseline_budget: str = "auto"  # each baseline run's: "auto" (steps matched to the RL runs' training time,
    # reproducible), "time" (the median RL run's training seconds), "120s" (seconds) or "50" (steps)
    rl_args: str = ""  # more rl.py flags for every run, e.g. "--minibatches=4 --lr=1e-4"
    wandb: bool = False  # every run logs to wandb, all in one group, plus a summary run
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""  # the summary run; "" = compare
    wandb_group: str = ""  # "" = compare-<date>-<time>


def parse(cfg):
    """Validated (losses, seeds, extra rl.py args, the rl.py config they give) from the config."""
    names = [n.strip() for n in cfg.losses.split(",") if n.strip()] or ALL
    bad = [n for n in names if n not in ALL]
    if bad:
        raise UserError(f"unknown loss {bad[0]!r} in --losses; valid: {', '.join(ALL)}")
    try:
        seeds = [int(s) for s in cfg.seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {cfg.seeds!r}") from None
    if not seeds or cfg.max_iters < 1 or cfg.eval_interval < 1 or cfg.jobs < 0 or cfg.eval_samples < 0:
        raise UserError("need at least one seed, max_iters >= 1, eval_interval >= 1, jobs >= 0, eval_samples >= 0")
    b = cfg.baseline_budget
    if not (b in ("auto", "time") or (b.endswith("s") and _positive(b[:-1], float)) or _positive(b, int)):
        raise UserError(f"--baseline_budget must be auto, time, seconds like 120s or steps like 50, got {b!r}")
    extra = shlex.split(cfg.rl_args)
    rl_cfg = load_config(rl.Config, extra)  # unknown rl.py keys or bad values fail here, before any run
    taken = [a for a in extra if a.startswith("--") and a[2:].split("=")[0] in SET_BY_COMPARE]
    if taken:
        raise UserError(f"--rl_args: {taken[0]} is set by compare.py itself (use its own flag)")
    return [n for n in ALL if n in names], sorted(set(seeds), key=seeds.index), extra, rl_cfg


def _positive(text, kind):
    try:
        return kind(text) > 0
    except ValueError:
        return False


def check_out_dir(out_dir):
    """Create out_dir/runs and prove out_dir writable, or one clear error (nothing is written then)."""
    try:
        os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".writable-"):
            pass
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e.__class__.__name__})") from None


def write_atomic(path, write):
    """write(tmp_path), then rename over path: a reader never sees half a file, a failure keeps the old one."""
    tmp = f"{path}.tmp{os.getpid()}{os.path.splitext(path)[1]}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ----------------------------------------------------------------------------- running

def make_run(cfg, loss, seed, extra, budget, group):
    """One run: its name, folder and rl.py command. budget: rl.py flags for steps or seconds."""
    name = f"{loss}-s{seed}"
    run_dir = os.path.join(cfg.out_dir, "runs", name)
    cmd = [sys.executable, os.path.join(ROOT, "rl.py"), f"--loss={loss}", f"--seed={seed}", f"--sft_ckpt={cfg.sft_ckpt}",
           f"--out_dir={run_dir}", "--threads=1", f"--eval_samples={cfg.eval_samples}", *budget, *extra]
    if cfg.wandb:
        cmd += ["--wandb=true", f"--wandb_project={cfg.wandb_project}", f"--wandb_group={group}", f"--wandb_run_name={name}"]
    return dict(name=name, loss=loss, seed=seed, dir=run_dir, cmd=cmd, log=os.path.join(run_dir, "log.txt"))


def move_aside(run_dir):
    """An earlier run folder of the same name becomes <name>.old<k>: rl.py appends to metrics.jsonl."""
    if os.path.exists(run_dir):
        k = 1
        while os.path.exists(f"{run_dir}.old{k}"):
            k += 1
        os.rename(run_dir, f"{run_dir}.old{k}")
        print(f"kept the earlier {run_dir} as {run_dir}.old{k}", flush=True)


def run_all(runs, jobs, progress):
    """Run the rl.py commands, `jobs` at a time; fills each run's rc and wall_s. Ctrl-C stops them all."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    pending, running = list(runs), []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                r = pending.pop(0)
                move_aside(r["dir"])
                os.makedirs(r["dir"])
                with open(r["log"], "w") as log:
                    log.write(shlex.join(r["cmd"]) + "\n")
                    log.flush()
                    r["proc"], r["t0"] = subprocess.Popen(r["cmd"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), time.time()
                running.append(r)
                progress("start", r)
            time.sleep(0.2)
            for r in [r for r in running if r["proc"].poll() is not None]:
                running.remove(r)
                r["rc"], r["wall_s"] = r.pop("proc").returncode, time.time() - r["t0"]
                r.update(read_run(r))
                progress("done", r)
    except KeyboardInterrupt:
        for r in running:
            r["proc"].terminate()
        raise


def read_run(r):
    """Summary of a finished run from its metrics.jsonl: {"ok", evals, train rows} or a failure."""
    path = os.path.join(r["dir"], "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    evals = [x for x in rows if "eval/accuracy" in x]
    if r["rc"] != 0 or not evals:
        return {"ok": False}
    return {"ok": True, "evals": evals, "train": [x for x in rows if "rl/loss" in x]}


# ----------------------------------------------------------------------------- table and plot

def mean_std(xs, fmt):
    """'m' for one value, 'm ± s' (sample std) for several; '—' for none."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    return fmt.format(statistics.mean(xs)) + (" ± " + fmt.format(statistics.stdev(xs)) if len(xs) > 1 else "")


def final(r, key):
    return r["evals"][-1].get(key)


def avg(r, key):
    vals = [x[key] for x in r["train"] if key in x]
    return statistics.mean(vals) if vals else None


def table(runs, names, rel, pk):
    """Markdown table, one row per loss (its seeds aggregated), and notes on failed runs; pk: the pass@k key."""
    head = ["algorithm", "steps", "test accuracy before → after", "Δ points", "pass@1", pk, "KL to ref",
            "resp len", "truncated", "clipfrac low / high", "train s", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for n in names:
        mine = [r for r in runs if r["loss"] == n]
        ok = [r for r in mine if r["ok"]]
        notes += [f"- {r['name']} failed (exit status {r['rc']}): see {rel(r['log'])}" for r in mine if not r["ok"]]
        if not ok:
            lines.append(f"| {n} | failed (see {rel(mine[0]['log'])}) |" + " |" * (len(head) - 2))
            continue
        before = [r["evals"][0]["eval/accuracy"] for r in ok]
        after = [final(r, "eval/accuracy") for r in ok]
        clip = [(avg(r, "rl/clipfrac_low"), avg(r, "rl/clipfrac_high")) for r in ok]
        cells = [n + (f" ({len(ok)} of {len(mine)} seeds)" if len(ok) < len(mine) else ""),
                 mean_std([r["evals"][-1]["step"] for r in ok], "{:.0f}"),
                 f"{mean_std(before, '{:.3f}')} → {mean_std(after, '{:.3f}')}",
                 mean_std([100 * (a - b) for a, b in zip(after, before)], "{:+.1f}"),
                 mean_std([final(r, "eval/pass@1") for r in ok], "{:.3f}"),
                 mean_std([final(r, "eval/" + pk) for r in ok], "{:.3f}"),
                 mean_std([final(r, "eval/kl") for r in ok], "{:.4f}"),
                 mean_std([final(r, "eval/resp_len") for r in ok], "{:.2f}"),
                 mean_std([100 * final(r, "eval/truncated_frac") for r in ok], "{:.1f}%"),
                 f"{mean_std([100 * c[0] if c[0] is not None else None for c in clip], '{:.2f}%')} / "
                 f"{mean_std([100 * c[1] if c[1] is not None else None for c in clip], '{:.2f}%')}",
                 mean_std([final(r, "perf/train_s") for r in ok], "{:.0f}"),
                 mean_std([r["wall_s"] for r in ok], "{:.0f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, notes


def curves(runs, n):
    """Mean over the seeds of one loss, per eval: (step, training seconds, accuracy, KL, response length)."""
    ok = [r for r in runs if r["loss"] == n and r["ok"]]
    if not ok:
        return None
    k = min(len(r["evals"]) for r in ok)
    keys = ("step", "perf/train_s", "eval/accuracy", "eval/kl", "eval/resp_len")
    return [[statistics.mean(r["evals"][i].get(key, 0.0) for r in ok) for i in range(k)] for key in keys]


def plot(runs, names, path, title):
    """compare.png: accuracy, KL and response length vs step (the step-budgeted losses) and vs training
    seconds (everyone, baselines dashed). Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    colors = [plt.get_cmap("tab20").colors[i] for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]  # strong first
    for i, n in enumerate(names):
        c = curves(runs, n)
        if c is None:
            continue
        step, secs, acc, kl, length = c
        base = n in L.BASELINES
        style = dict(color="black" if n == "sft" else "dimgray" if base else colors[i % 20], lw=2.2 if base else 1.4,
                     ls="--" if base else "-", marker=".", label=n)
        for j, y in enumerate((acc, kl, length)):
            if not base:  # a baseline's steps are not RL steps: compare it by time
                axes[0, j].plot(step, y, **style)
            axes[1, j].plot(secs, y, **style)
    axes[0, 0].set_title("vs step: the RL and preference losses (same step budget)", loc="left", fontsize=10)
    axes[1, 0].set_title("vs training time: everyone, baselines dashed (same time budget)", loc="left", fontsize=10)
    for j, what in enumerate(("test greedy accuracy", "KL(policy || reference), k3 per token", "response length (tokens, incl. EOS)")):
        axes[0, j].set(xlabel="step", ylabel=what)
        axes[1, j].set(xlabel="training seconds (evals excluded)", ylabel=what)
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    handles, labels = axes[1, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.91, 0.96))
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=72))
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- main

def main(cfg):
    names, seeds, extra, rl_cfg = parse(cfg)
    shown_ckpt = cfg.sft_ckpt
    command = shlex.join(["python", "compare.py"] + [f"--{f.name}={getattr(cfg, f.name)}" for f in fields(cfg)
                                                     if getattr(cfg, f.name) != f.default])
    cfg = replace(cfg, sft_ckpt=os.path.abspath(cfg.sft_ckpt), out_dir=os.path.abspath(cfg.out_dir))
    ckpt = load_checkpoint(cfg.sft_ckpt, hint="make one with: python sft.py configs/mul.py")
    check_out_dir(cfg.out_dir)
    print_config(cfg)
    task, = ckpt_settings(ckpt, cfg.sft_ckpt, "task")
    ensure_data(task)  # generated once here, not by parallel runs
    jobs = cfg.jobs or min(2, os.cpu_count() or 1)
    group = cfg.wandb_group or time.strftime("compare-%Y%m%d-%H%M%S")
    rel = lambda p: os.path.relpath(p, cfg.out_dir)  # noqa: E731
    t_start, started, done = time.time(), [], []
    rl_names, base_names = [n for n in names if n not in L.BASELINES], [n for n in names if n in L.BASELINES]
    total = len(names) * len(seeds)

    def progress(event, r):
        if event == "start":
            started.append(r)
            print(f"[{len(started):2d}/{total}] start {r['name']}: log in {r['log']}", flush=True)
            return
        done.append(r)
        el = time.time() - t_start
        res = (f"test accuracy {r['evals'][0]['eval/accuracy']:.3f} -> {r['evals'][-1]['eval/accuracy']:.3f}, "
               f"{r['evals'][-1]['step']} steps" if r["ok"] else f"FAILED (exit status {r['rc']}), see {r['log']}")
        print(f"[{len(done):2d}/{total}] {r['name']}: {res} in {fmt_time(r['wall_s'])} | elapsed {fmt_time(el)}, "
              f"ETA ~{fmt_time(el / len(done) * (total - len(done)))}", flush=True)

    n_evals = -(-cfg.max_iters // cfg.eval_interval)
    runs = [make_run(cfg, n, s, extra, [f"--max_iters={cfg.max_iters}", f"--eval_interval={cfg.eval_interval}"], group)
            for n in rl_names for s in seeds]
    run_all(runs, jobs, progress)
    rl_secs = [final(r, "perf/train_s") for r in runs if r["ok"]]
    if base_names:
        b = cfg.baseline_budget
        if b == "time" and not rl_secs:
            b = "auto"  # no RL run to take the time from
        if b == "time" or b.endswith("s"):  # wall-clock: rl.py --max_seconds, evals every secs / n_evals
            secs = max(statistics.median(rl_secs) if b == "time" else float(b[:-1]), 0.1)  # rl.py: 0 s = no limit
            budget = {n: ["--max_iters=1000000", f"--max_seconds={secs:.1f}", "--eval_interval=1000000",
                          f"--eval_seconds={secs / n_evals:.1f}"] for n in base_names}
            base_note = (f"{secs:.0f} s of training each ({'the median RL run' if b == 'time' else '--baseline_budget'}"
                         f"'s training time), so their step counts depend on machine load")
        else:  # steps: reproducible
            steps = {n: int(b) if b != "auto" else max(1, round(cfg.max_iters * BASELINE_STEPS_PER_RL_STEP[n]))
                     for n in base_names}
            budget = {n: [f"--max_iters={k}", f"--eval_interval={max(1, k // n_evals)}"] for n, k in steps.items()}
            base_note = ", ".join(f"{n} {k} steps" for n, k in steps.items()) + (
                f" (--baseline_budget=auto: {cfg.max_iters} RL steps x {BASELINE_STEPS_PER_RL_STEP}, the RL runs' "
                "training time on the CPU where those ratios were measured; compare the train s column)" if b == "auto" else "")
        base_runs = [make_run(cfg, n, s, extra, budget[n], group) for n in base_names for s in seeds]
        run_all(base_runs, jobs, progress)
        runs += base_runs

    pk = pass_k_name(cfg.eval_samples)
    lines, notes = table(runs, names, rel, pk)
    first = next((r["evals"][0] for r in runs if r["ok"]), {})
    start = ", ".join(f"{k.split('/')[1]} {first[k]:.3f}" for k in ("eval/accuracy", "eval/pass@1", "eval/" + pk) if k in first)
    step_desc = (f"{cfg.max_iters} steps of {rl_cfg.prompts_per_step} prompts × {rl_cfg.group_size} samples "
                 f"(smaller than rl.py's default {rl.Config.max_iters} steps)")
    md = ["# Algorithm comparison", "",
          "    " + command, "",
          f"- SFT checkpoint: {shown_ckpt} (step 0 of every run, seed {seeds[0]}: test {start}); "
          f"seeds {', '.join(map(str, seeds))}; {jobs} runs at a time, 1 thread each",
          f"- per-run budget: {step_desc}" + (f"; eval every {cfg.eval_interval}" if rl_names else ""),
          *([f"- baselines (sft: continued SFT on gold answers, rft: rejection-sampling fine-tuning): {base_note}"]
            if base_names else []),
          f"- extra rl.py flags: `{cfg.rl_args}`" if cfg.rl_args else "- every loss at its defaults (rl.py, losses.ALGOS)",
          f"- held-out: the {task} test split, greedy accuracy; pass@1 / {pk} from "
          f"{cfg.eval_samples} samples per problem; KL, response length and truncation on 4 samples of 256 test prompts; "
          "clip fractions are means over the training steps (0 when every update is on-policy, rl.py's default)",
          f"- timing columns: train s (training time, evals excluded), wall s (the whole run); "
          f"comparison wall time {fmt_time(time.time() - t_start)}", "",
          *lines, "", *notes, ""]
    png = os.path.join(cfg.out_dir, "compare.png")
    title = f"{len(seeds)} seed(s), {cfg.max_iters} steps per RL run" + (f"; baselines: {base_note.split(' (')[0]}" if base_names else "")
    drew = plot(runs, names, png, title)
    md.append("![curves](compare.png)" if drew else "compare.png not written: matplotlib is not installed (pip install matplotlib)")
    write_atomic(os.path.join(cfg.out_dir, "compare.md"), lambda tmp: open(tmp, "w").write("\n".join(md) + "\n"))
    print("\n".join(lines + notes), flush=True)
    print(f"done in {fmt_time(time.time() - t_start)}: wrote {os.path.join(cfg.out_dir, 'compare.md')}" + (f" and {png}" if drew else
          "; no plot: matplotlib is not installed, `pip install matplotlib` and rerun for compare.png"), flush=True)
    failed = [r["name"] for r in runs if not r["ok"]]
    if cfg.wandb:
        logger = Logger(cfg.out_dir, replace(cfg, wandb_group=group, wandb_run_name=cfg.wandb_run_name or "compare"),
                        resolved={"losses": names, "seeds": seeds})
        logger.log({"step": 0, **{f"{r['name']}/{k.split('/')[-1]}": v for r in runs if r["ok"]
                                   for k, v in r["evals"][-1].items() if isinstance(v, (int, float))}})
        logger.finish()
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (rows say where their logs are)", file=sys.stderr)
    return {"runs": runs, "failed": failed, "table": lines}


if __name__ == "__main__":
    res = run_cli(main, Config)
    sys.exit(1 if res["failed"] else 0)
