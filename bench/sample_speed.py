"""
Sampling speed with and without the KV cache, both measured in the same run (a ratio, not a timing).

    python bench/sample_speed.py [--max_new_tokens=16] [--prompts=64] [--group_size=8] [--repeats=5] [--threads=0]

Default model (4 layers x 128 wide), random weights, EOS disabled so every row decodes
max_new_tokens tokens. Prints the median completion tokens/s of each and the speed-up.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanorl.config import load_config  # noqa: E402
from model import GPT, GPTConfig, generate  # noqa: E402
from dataclasses import dataclass  # noqa: E402


@dataclass
class Config:
    max_new_tokens: int = 16
    prompts: int = 64
    group_size: int = 8
    prompt_len: int = 6  # "23*47="
    repeats: int = 5
    threads: int = 0


def main(cfg):
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=max(32, cfg.prompt_len + cfg.max_new_tokens))).eval()
    prompts = torch.randint(2, 16, (cfg.prompts, cfg.prompt_len)).tolist()
    n_tok = cfg.prompts * cfg.group_size * cfg.max_new_tokens
    res = {}
    for use_cache in (True, False, True, False):  # interleaved, the first of each is warm-up
        times = []
        for _ in range(cfg.repeats):
            t = time.perf_counter()
            generate(model, prompts, cfg.max_new_tokens, eos_id=-1, pad_id=0, G=cfg.group_size,
                     generator=torch.Generator().manual_seed(0), use_cache=use_cache)
            times.append(time.perf_counter() - t)
        res[use_cache] = statistics.median(times)
    print(f"{cfg.prompts} prompts x {cfg.group_size} samples x {cfg.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {cfg.repeats}")
    print(f"cached:   {n_tok / res[True]:10.0f} tok/s ({res[True]:.3f} s)")
    print(f"uncached: {n_tok / res[False]:10.0f} tok/s ({res[False]:.3f} s)")
    print(f"speedup={res[False] / res[True]:.2f}x")


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
