"""
Time GRPO steps of the default model: rollout vs update, median over steps after a warm-up.

    python bench/rl_step.py [--threads=1] [--prompts_per_step=8] [--group_size=8] [--max_new_tokens=8]
                            [--beta=0.04] [--steps=20] [--sft_ckpt=out/sft-mul/ckpt.pt]
                            [--sample_batch_size=256] [--micro_batch_size=256] [--profile=true]

Uses the SFT checkpoint when it exists (realistic response lengths and rewards), else a freshly
initialised default model. Runs the real rl.collect, then rl.pg_step on it (no dynamic sampling). Prints the
rollout's sampled tokens/s and `median_step_s=<seconds>`, the number the speed work compares; with
--profile, then each phase's share of a step and the top ops.
"""
import copy
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import losses as L  # noqa: E402
import rl  # noqa: E402
from data.tasks import ALPHABET, load_split  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from nanorl.evaluate import Task  # noqa: E402
from model import adamw  # noqa: E402
from nanorl.rows import encode_prompts  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402


@dataclass
class Config:
    threads: int = 1
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 8
    beta: float = 0.04
    steps: int = 20
    warmup: int = 3
    sft_ckpt: str = "out/sft-mul/ckpt.pt"
    sample_batch_size: int = 256  # rl.py's default
    micro_batch_size: int = 256  # rl.py's default
    profile: bool = False  # then also: where a step's time goes (cProfile phases, torch.profiler ops)


def grpo_run(model, tok, reverse, beta, lr):
    """rl.py's Run around a model in hand (the mul task's train prompts, a frozen reference)."""
    task = Task(tok, "mul", reverse, "exact", 0, load_split("mul", "train"))
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    cfg, hp = rl.Config(loss="grpo", beta=beta), L.resolve_hparams("grpo", beta=beta)
    return rl.Run(model.eval(), model, ref, adamw(model, lr, 0.0), task, rl.PromptSampler(len(task.train), 1, False),
                  hp, advantages=rl.advantage_stage(cfg, L.ALGOS["grpo"], hp, None),
                  prompt_ids=encode_prompts(tok, [p for p, _ in task.train], reverse))


def grpo_step(cfg, run, gen, lr):
    """One step of rl.py's GRPO -> (rollout seconds, update seconds, the rollout)."""
    row, t0 = L.ALGOS["grpo"], time.perf_counter()
    batch, _ = rl.collect(cfg, row, run, gen)
    t1 = time.perf_counter()
    rl.pg_step(cfg, row, run, lr, gen, (batch, {}))
    return t1 - t0, time.perf_counter() - t1, batch


def main(b):
    torch.set_num_threads(b.threads)
    torch.manual_seed(0)
    if os.path.exists(b.sft_ckpt):
        ckpt = load_checkpoint(b.sft_ckpt)
        model, tok = model_from_checkpoint(ckpt, b.sft_ckpt)
        reverse, what = ckpt["config"].get("reverse", False), b.sft_ckpt
    else:
        tok = CharTokenizer(ALPHABET)
        model, reverse, what = GPT(GPTConfig(vocab_size=tok.vocab_size)), True, "fresh default model"
    cfg = rl.Config(loss="grpo", prompts_per_step=b.prompts_per_step, group_size=b.group_size,
                    max_new_tokens=b.max_new_tokens, beta=b.beta, prompt_selection=False, dynamic_sampling=False,
                    overlong_window=0, sample_batch_size=b.sample_batch_size, micro_batch_size=b.micro_batch_size)
    run, gen = grpo_run(model, tok, reverse, b.beta, 1e-5), torch.Generator().manual_seed(0)
    roll, upd, tokens = [], [], []

    def one_step():
        r, u, batch = grpo_step(cfg, run, gen, 1e-5)
        tokens.append(batch.mask.sum().item())  # sampled tokens, EOS included
        return r, u

    for i in range(b.warmup + b.steps):
        r, u = one_step()
        if i >= b.warmup:
            roll.append(r)
            upd.append(u)
    rate = statistics.median(n / r for n, r in zip(tokens[b.warmup:], roll))
    step = [r + u for r, u in zip(roll, upd)]
    print(f"GRPO step, {what}, {b.threads} threads, {b.prompts_per_step} prompts x {b.group_size} samples, "
          f"<= {b.max_new_tokens} new tokens, beta {b.beta}, median of {b.steps} steps")
    print(f"rollout_s={statistics.median(roll):.4f} update_s={statistics.median(upd):.4f} "
          f"rollout_tokens_per_s={rate:.0f}")
    print(f"median_step_s={statistics.median(step):.4f}")
    if b.profile:
        profile(one_step, b.steps)


PHASES = {"rollout: sampler": "model.py:.*\\(generate\\)", "rollout: grading": "rl.py:.*\\(rollout\\)",
          "update: reference forward": "rl.py:.*\\(with_reference\\)",
          "update: policy forward": "model.py:.*\\(logprobs\\)|losses.py:.*\\(algo_loss\\)",
          "update: backward": "method 'run_backward'", "update: optimizer": "model.py:.*\\(optimizer_step\\)",
          "update: all": "rl.py:.*\\(pg_step\\)", "step": "one_step"}


def profile(one_step, n):
    """Per phase (cProfile, cumulative; grading = rollout less the sampler, policy forward = the
    log-probs' forwards less the reference's, and the loss) and per op (torch.profiler, self time),
    per step."""
    import cProfile
    import pstats
    import re
    from torch.profiler import profile as torch_profile
    cp = cProfile.Profile()
    cp.runcall(lambda: [one_step() for _ in range(n)])
    stats = pstats.Stats(cp).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    cum = {k: sum(v[3] for f, v in stats.items() if re.search(pat, f"{f[0]}:{f[1]}({f[2]})"))
           for k, pat in PHASES.items()}
    cum["rollout: grading"] -= cum["rollout: sampler"]
    cum["update: policy forward"] -= cum["update: reference forward"]  # its log-probs too
    for k, v in cum.items():
        print(f"{k:28s} {1e3 * v / n:8.1f} ms  {100 * v / cum['step']:5.1f}%")
    with torch_profile() as p:
        for _ in range(n):
            one_step()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
