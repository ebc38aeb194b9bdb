"""
SFT training speed in tokens/s: fp32 against bf16 autocast, and one batch against micro-batches,
all measured in the same run (ratios, not timings).

    python bench/sft_speed.py [--batch_size=256] [--micro_batch_size=64] [--repeats=10] [--threads=1]

The default model (4 layers x 128 wide) on real batches of the mul task; each step is what sft.py
runs (sft.accumulate_grads, clip, AdamW). The variants take turns, one step each, after a warm-up;
tokens/s counts every position of the batch (B x T). bf16 is measured where the CPU has native bf16.
"""
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sft  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from data.tasks import ALPHABET, load_split  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402
from nanorl.evaluate import Task  # noqa: E402
from model import adamw  # noqa: E402


@dataclass
class Config:
    batch_size: int = 256
    micro_batch_size: int = 64
    repeats: int = 10
    warmup: int = 2
    threads: int = 1


def main(b):
    torch.set_num_threads(b.threads)
    torch.manual_seed(0)
    tok = CharTokenizer(ALPHABET)
    x, y, mask = sft.encode_split(Task(tok, "mul", True, "exact", 0).gold_rows(load_split("mul", "train")),
                                   tok.pad_id, "response")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size)).train()
    opt = adamw(model, 1e-4, 0.1)
    variants = {"fp32": (b.batch_size, False), f"fp32 micro {b.micro_batch_size}": (b.micro_batch_size, False)}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        variants["bf16"] = (b.batch_size, True)
    gen = torch.Generator().manual_seed(0)
    times = {k: [] for k in variants}
    for i in range(b.warmup + b.repeats):
        for name, (micro, bf16) in variants.items():
            idx = torch.randint(len(x), (b.batch_size,), generator=gen)
            t = time.perf_counter()
            opt.zero_grad()
            sft.accumulate_grads(model, x[idx], y[idx], mask[idx], micro, bf16)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if i >= b.warmup:
                times[name].append(time.perf_counter() - t)
    n_tok = b.batch_size * x.size(1)
    tps = {k: n_tok / statistics.median(v) for k, v in times.items()}
    print(f"SFT steps, default model, batch {b.batch_size} x {x.size(1)} tokens, {torch.get_num_threads()} thread(s), "
          f"median of {b.repeats}")
    for k, v in tps.items():
        print(f"{k:>16}: {v:10.0f} tok/s ({n_tok / v * 1000:.1f} ms/step)")
    print(f"micro_batch_ratio={tps[f'fp32 micro {b.micro_batch_size}'] / tps['fp32']:.2f}x"
          + (f" bf16_ratio={tps['bf16'] / tps['fp32']:.2f}x" if "bf16" in tps else " (no native bf16)"))


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
