"""
What VinePPO's branches cost (nanorl/turns.py): one step of configs/rl_guess_vine.py from a
checkpoint, its rollout and its branches timed apart, with the turns that need a value (each
row's after its first), the distinct prefixes that get branches (a group's rows that share one
share its branches: what sharing saves) and the tokens sampled.

    python bench/branch_cost.py --ckpt=out/sft-guess/ckpt.pt --repeats=3
    python bench/branch_cost.py --ckpt=out/rl-guess-vine/ckpt.pt --repeats=3
"""
import os
import sys
import time
from statistics import median

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import losses as L  # noqa: E402
import rl  # noqa: E402
from model import seeded  # noqa: E402
from nanorl import turns  # noqa: E402
from nanorl.config import load_config  # noqa: E402


def one_step(cfg, algo, run, step):
    """-> (rollout s, branch s, turns that need a value, prefixes branched, branches, rollout
    tokens, branch tokens): one step's, all groups kept."""
    gen = seeded("cpu", "rollout", cfg.seed, 0, step)
    idx = run.prompts.draw(cfg.prompts_per_step)
    t0 = time.time()
    batch = rl.rollout(cfg, algo, run, idx, gen, cfg.group_size, cfg.temperature)
    t1 = time.time()
    calls, generate = [], turns.generate

    def counting(model, prompts, *args, **kw):
        out = generate(model, prompts, *args, **kw)
        calls.append((len(prompts), len(out["ids"]), out["response_mask"].sum().item()))
        return out
    turns.generate = counting
    try:
        turns.credit(cfg, algo, run, batch, idx, torch.zeros(len(idx), dtype=torch.bool), gen)
    finally:
        turns.generate = generate
    later = int(L.turn_index(batch.mask).max(1).values.clamp_min(0).sum())  # turns after the 1st
    return (t1 - t0, time.time() - t1, later, sum(c[0] for c in calls), sum(c[1] for c in calls),
            batch.length.sum().item(), sum(c[2] for c in calls))


def main(argv):
    args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in argv)
    cfg = load_config(rl.Config, [os.path.join(ROOT, "configs/rl_guess_pp.py"),
                                  os.path.join(ROOT, "configs/rl_guess_vine.py"),
                                  f"--sft_ckpt={args.get('ckpt', 'out/sft-guess/ckpt.pt')}",
                                  f"--threads={args.get('threads', 2)}"])
    torch.set_num_threads(cfg.threads)
    cfg, algo, hp = rl.check(cfg)
    cfg, run = rl.setup(cfg, algo, hp, torch.device("cpu"), 0, 1)
    rows = [one_step(cfg, algo, run, s) for s in range(1, int(args.get("repeats", 3)) + 1)]
    roll, branch, later, prefixes, n_rows, tok, btok = (median(c) for c in zip(*rows))
    print(f"{cfg.sft_ckpt}: rollout {roll:.2f} s ({tok:.0f} tokens); branches {branch:.2f} s "
          f"({btok:.0f} tokens, {btok / tok:.1f}x the rollout's): {later:.0f} turns need a value, "
          f"{prefixes:.0f} prefixes branched, {n_rows:.0f} branches (K = {run.hp['branches']}); "
          f"medians of {len(rows)} steps on {cfg.threads} threads")


if __name__ == "__main__":
    main(sys.argv[1:])
