"""Async against sync on this machine's cores: steps per minute, rollout tokens per second and where
each process's time goes, medians of interleaved repeats, all in one script.

    python bench/async_rl.py                   # the guess game (configs/rl_guess_pp.py) and the default grpo step
    python bench/async_rl.py --steps=40 --repeats=3 --configs=guess

Each run is rl.py from its SFT checkpoint (make one with `python sft.py configs/guess.py` and
`python sft.py configs/mul.py`) in a process of its own, no evals, at the same total threads:
  sync      --threads=T                      sampling, then the update, in turn
  sim       --threads=T --staleness=1        the simulated staleness: the same, plus pi_old recomputed
  async     --threads=T --staleness=1 --async_rollouts=true: the trainer and its sampler take T/2 each
The repeats interleave the modes (sync, sim, async, sync, ...). A run's step time is the median of
perf/step_s over its steps after the first `skip` (the sampler's start); its rollout tokens per second are
each step's sampled tokens over that step's time (the whole pipeline's rate, not the sampler's alone).
Where the time goes: sync's rollout share of a step, and async's idle share on each side.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {  # name: rl.py's arguments
    "guess": ["configs/rl_guess_pp.py"],
    "grpo": ["--loss=grpo"],
}
MODES = {"sync": [], "sim": ["--staleness=1"], "async": ["--staleness=1", "--async_rollouts=true"]}


def run(config, mode, steps, threads, out, extra):
    """One rl.py run -> its metrics rows (the training steps)."""
    args = [sys.executable, "rl.py", *CONFIGS[config], *MODES[mode], f"--max_iters={steps}",
            "--eval_interval=100000", "--eval_samples=0", "--ckpt_interval=100000", f"--threads={threads}",
            f"--out_dir={out}", *extra]
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return [row for row in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "perf/step_s" in row]


def summary(rows, skip):
    """A run's rows -> {step_s, steps_per_min, tok_s, rollout_frac, trainer_idle, sampler_idle}."""
    rows = rows[skip:]
    step_s = statistics.median(r["perf/step_s"] for r in rows)
    out = {"step_s": step_s, "steps_per_min": 60 / step_s,
           "tok_s": statistics.median(r["perf/rollout_tokens"] / r["perf/step_s"] for r in rows),
           "rollout_frac": statistics.median(min(1.0, r["perf/rollout_s"] / r["perf/step_s"]) for r in rows)}
    if "perf/trainer_idle_frac" in rows[0]:
        out["trainer_idle"] = statistics.median(r["perf/trainer_idle_frac"] for r in rows)
        out["sampler_idle"] = statistics.median(r["perf/sampler_idle_frac"] for r in rows)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="guess,grpo")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="first steps left out of the medians")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="total threads of each run")
    p.add_argument("--rl_args", default="", help="more rl.py arguments for every run")
    a = p.parse_args(argv)
    for config in a.configs.split(","):
        if config not in CONFIGS:
            raise SystemExit(f"--configs: unknown {config!r}; valid: {', '.join(CONFIGS)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="nanorl-async-") as tmp:
        for config in a.configs.split(","):
            for i in range(a.repeats):
                for mode in MODES:
                    out = os.path.join(tmp, f"{config}-{mode}-{i}")
                    s = summary(run(config, mode, a.steps, a.threads, out, a.rl_args.split()), a.skip)
                    results.setdefault((config, mode), []).append(s)
                    print(f"{config} {mode} repeat {i}: {s['steps_per_min']:.1f} steps/min", file=sys.stderr)
    print(f"| config | mode | steps/min | × sync | rollout tok/s | sync: rollout share of a step | "
          f"async: trainer idle | async: sampler idle |\n|---|---|---|---|---|---|---|---|")
    for config in a.configs.split(","):
        base = statistics.median(s["steps_per_min"] for s in results[config, "sync"])
        for mode in MODES:
            runs = results[config, mode]
            med = {k: statistics.median(s[k] for s in runs) for k in runs[0]}
            spread = f"{min(s['steps_per_min'] for s in runs):.1f}–{max(s['steps_per_min'] for s in runs):.1f}"
            print(f"| {config} | {mode} | {med['steps_per_min']:.1f} ({spread}) | {med['steps_per_min'] / base:.2f} | "
                  f"{med['tok_s']:.0f} | {med['rollout_frac']:.2f} | {med.get('trainer_idle', float('nan')):.2f} | "
                  f"{med.get('sampler_idle', float('nan')):.2f} |")
    return results


if __name__ == "__main__":
    main()
