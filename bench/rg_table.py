"""
Does RL help beyond arithmetic? For each reasoning-gym task: SFT (configs/rg_<task>.py), then GRPO
from it, and one row of the README's table: held-out accuracy (a score of 1) before and after,
pass@8, the mean score (partial credit) and the wall time of each stage.

    python bench/rg_table.py chain_sum                 # one task: SFT then GRPO, its row
    python bench/rg_table.py chain_sum basic_arithmetic spell_backward
    python bench/rg_table.py chain_sum --rl_args="--lr=1e-4" --skip_sft
    python bench/rg_table.py chain_sum --sft_args="--bf16=false"   # as a CPU without bf16 would

Runs write to out/sft-rg-<task>/ and out/rl-rg-<task>/, logs beside them (sft.log, rl.log).
"""
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RL_ARGS = ["--loss=grpo", "--beta=0", "--group_size=8", "--prompts_per_step=32", "--max_iters=300",
           "--eval_interval=50"]


def run(cmd, log):
    """cmd from the repo root, its output to log -> wall seconds; a failure stops with its tail."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"{shlex.join(cmd)} failed; see {log}:\n" + "".join(open(log).readlines()[-5:]))
    return time.time() - t0


def evals(out_dir):
    return [r for r in map(json.loads, open(os.path.join(ROOT, out_dir, "metrics.jsonl"))) if "eval/accuracy" in r]


def main(argv):
    tasks = [a for a in argv if not a.startswith("--")]
    extra, sft_extra = ([x for a in argv if a.startswith(f"--{k}=") for x in shlex.split(a.split("=", 1)[1])]
                        for k in ("rl_args", "sft_args"))
    print("| task (config) | SFT held-out | GRPO held-out | Δ | pass@8 before → after | mean score | time |")
    print("|---|---|---|---|---|---|---|")
    for task in tasks:
        sft_dir, rl_dir = f"out/sft-rg-{task}", f"out/rl-rg-{task}"
        t_sft = 0.0 if "--skip_sft" in argv else \
            run(["sft.py", f"configs/rg_{task}.py", *sft_extra], os.path.join(ROOT, sft_dir + "-sft.log"))
        t_rl = run(["rl.py", f"--sft_ckpt={sft_dir}/ckpt.pt", f"--out_dir={rl_dir}", *RL_ARGS, *extra],
                   os.path.join(ROOT, rl_dir + "-rl.log"))
        e = evals(rl_dir)
        a, b = e[0], e[-1]
        print(f"| {task} (`configs/rg_{task}.py`) | {a['eval/accuracy']:.3f} | {b['eval/accuracy']:.3f} | "
              f"{100 * (b['eval/accuracy'] - a['eval/accuracy']):+.1f} | {a['eval/pass@8']:.3f} → "
              f"{b['eval/pass@8']:.3f} | {a['eval/mean_score']:.3f} → {b['eval/mean_score']:.3f} | "
              f"SFT {t_sft / 60:.1f} + RL {t_rl / 60:.1f} min |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
