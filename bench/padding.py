"""
How much of the trainer's forward is padding (issue 65): each micro-batch of rl.pg_step, the
positions its forward computes against the tokens it needs, over a few real steps of each config.

    python bench/padding.py                        # grpo, dapo, guess, gpt2: a table
    python bench/padding.py --configs=guess --steps=5

The trainer's forward (model.response_forward) runs each distinct prompt once (n x P positions,
left-padded to the longest prompt P) and each distinct row's response once (U x (L-1),
right-padded to the longest response L). Needed: the distinct prompts' own tokens and each
distinct row's response tokens but its last (the last is scored, never read). padding = 1 -
needed / computed. "packed" is first-fit-decreasing of the distinct rows (prompt and response,
no pads) into rows of P + L - 1 tokens: those rows' positions over the padded forward's.
Each config is rl.py's own step (roofline's build_run) with its dynamic sampling and prompt
selection on, fp32, from its SFT checkpoint when there is one, else a fresh model of its shape.
"""
import os
import sys
import tempfile
from dataclasses import dataclass
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rl  # noqa: E402
from bench import roofline  # noqa: E402
from model import seeded  # noqa: E402
from nanorl import bpe  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from tokenizer import TokenizerError  # noqa: E402

CONFIGS = {"grpo": ("grpo", []), "dapo": ("grpo", ["--loss=dapo"]), "guess": ("guess", []),
           "gpt2": ("gpt2", ["--dynamic_sampling=false"])}  # name -> (roofline's run, flags)
# gpt2's fresh model is never right: with dynamic sampling every group would be dropped


@dataclass
class Config:
    configs: str = "grpo,dapo,guess,gpt2"
    steps: int = 3
    threads: int = 2


def bins(sizes, capacity):
    """First-fit-decreasing: the number of rows of `capacity` tokens that hold these sizes."""
    free = []
    for s in sorted(sizes, reverse=True):
        i = next((i for i, f in enumerate(free) if f >= s), None)
        if i is None:
            free.append(capacity - s)
        else:
            free[i] -= s
    return len(free)


def count(ids, offsets, mask, length):
    """One micro-batch -> (positions computed, needed, packed, computed if trimmed to its own
    longest prompt and response)."""
    P, L = ids.size(1) - mask.size(1), mask.size(1)
    P_own, L_own = P - int(offsets.min()), int(length.max())
    rows = torch.cat([offsets[:, None], ids], 1)
    uniq, first = torch.unique(rows, dim=0, return_inverse=True)
    n_len = torch.zeros(len(uniq), dtype=torch.long).index_put_((first,), length.long())
    prompts = torch.unique(uniq[:, :1 + P], dim=0)
    computed = len(prompts) * P + len(uniq) * (L - 1)
    needed = int((P - prompts[:, 0]).sum() + (n_len - 1).clamp_min(0).sum())
    sizes = (P - uniq[:, 0] + n_len - 1).tolist()  # a distinct row's tokens, prompt and response
    trimmed = len(prompts) * P_own + len(uniq) * (L_own - 1)
    return computed, needed, bins(sizes, P + L - 1) * (P + L - 1), trimmed


def measure(b, name):
    which, flags = CONFIGS[name]
    run_args, sft_args = roofline.RUNS[which]
    seen = []
    with tempfile.TemporaryDirectory() as tmp:
        options = roofline.Config(gpt2_prompts_per_step=8, gpt2_group_size=4)
        with mock.patch.object(roofline, "SAME_WORK", ["--bf16=false"]), \
                mock.patch.dict(roofline.RUNS, {which: (run_args + flags, sft_args)}):
            try:
                cfg, algo, run, origin = roofline.build_run(options, which, tmp)
            except TokenizerError:
                with mock.patch.object(bpe, "load", roofline.standin_gpt2):
                    cfg, algo, run, origin = roofline.build_run(options, which, tmp)
        logprobs = rl.logprobs

        def recorded(model, ids, offsets, mask, *a, **kw):
            if torch.is_grad_enabled():  # the trainer's micro-batches, not the reference's
                length = (ids[:, ids.size(1) - mask.size(1):] != run.task.tok.pad_id).sum(1)
                seen.append(count(ids, offsets, mask, length.clamp_min(mask.sum(1))))
            return logprobs(model, ids, offsets, mask, *a, **kw)
        with mock.patch.object(rl, "logprobs", recorded):
            for i in range(b.steps):
                rl.train_step(cfg)(cfg, algo, run, cfg.lr, seeded(torch.device("cpu"), "rollout",
                                                                   cfg.seed, 0, i + 1))
    computed, needed, packed, trimmed = (sum(x[k] for x in seen) for k in range(4))
    return (f"| {name} | {origin} | {len(seen)} | {computed:,} | {needed:,} | "
            f"{1 - needed / computed:.1%} | {packed / computed:.2f} | {trimmed / computed:.2f} |")


def main(b):
    torch.set_num_threads(b.threads)
    print(f"{b.steps} steps each, fp32\n")
    print("| config | model | micro-batches | positions computed | needed | padding | packed / "
          "padded | trimmed / padded |\n|---|---|---|---|---|---|---|---|")
    for name in b.configs.split(","):
        print(measure(b, name), flush=True)


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
