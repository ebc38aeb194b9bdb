"""Two losses on the same rollouts, side by side: log every group of a run's first steps, then train
on that log again under each loss (--replay), from the same SFT checkpoint.

    python bench/replay.py                                   # 20 GRPO steps, replayed by grpo and gspo
    python bench/replay.py --losses=grpo,dapo,cispo --steps=20 --sft_ckpt=out/sft-mul/ckpt.pt

The first loss's replay is the logged run itself (bit for bit: tests/test_rollout_log.py); every
other column is the same data under another update. The rewards are the logged run's (a row's
reward shaping, DAPO's overlong penalty, is part of sampling, so it is not re-applied). Prints, per
loss, the held-out accuracy after the steps, and each step's loss, clip fraction and KL to the
reference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rl(args, out):
    """rl.py with args into out -> its metrics rows."""
    r = subprocess.run([sys.executable, "rl.py", *args, f"--out_dir={out}"], cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode:
        raise SystemExit(f"rl.py {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--losses", default="grpo,gspo", help="the first one samples and logs")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sft_ckpt", default="out/sft-mul/ckpt.pt")
    p.add_argument("--rl_args", default="", help="more rl.py arguments for every run")
    a = p.parse_args(argv)
    losses = a.losses.split(",")
    common = [f"--sft_ckpt={a.sft_ckpt}", f"--max_iters={a.steps}", f"--eval_interval={a.steps}",
              "--eval_samples=0", *a.rl_args.split()]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="nanorl-replay-") as tmp:
        log = os.path.join(tmp, "log")
        rl([f"--loss={losses[0]}", "--log_rollouts=-1", "--log_every=1", *common], log)
        for loss in losses:
            print(f"replaying under {loss}", file=sys.stderr)
            runs[loss] = rl([f"--loss={loss}", f"--replay={log}/rollouts", *common], os.path.join(tmp, loss))
    end = {loss: [r for r in rows if "eval/accuracy" in r] for loss, rows in runs.items()}
    print("| loss | held-out accuracy: start → end |\n|---|---|")
    for loss in losses:
        print(f"| {loss} | {end[loss][0]['eval/accuracy']:.4f} → {end[loss][-1]['eval/accuracy']:.4f} |")
    steps = {loss: {r["step"]: r for r in rows if "rl/loss" in r} for loss, rows in runs.items()}
    print("\n| step | " + " | ".join(f"{loss}: loss, clipfrac, KL" for loss in losses) + " |")
    print("|---|" + "---|" * len(losses))
    for s in sorted(steps[losses[0]]):
        cells = []
        for loss in losses:
            r = steps[loss].get(s, {})
            clip = r.get("rl/clipfrac_low", 0) + r.get("rl/clipfrac_high", 0)
            kl = f"{r['rl/kl']:.4f}" if "rl/kl" in r else "–"  # a row without a KL term logs none
            cells.append(f"{r.get('rl/loss', float('nan')):.4g}, {clip:.3f}, {kl}")
        print(f"| {s} | " + " | ".join(cells) + " |")
    return runs


if __name__ == "__main__":
    main()
