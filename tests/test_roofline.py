"""bench/roofline.py's arithmetic: its FLOP formula against a hand count and torch's counter, and
the M it measures a stage's own peak at."""
import os
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import roofline  # noqa: E402
from model import GPT, GPTConfig, KVCache  # noqa: E402


def test_forward_flops_by_hand():
    """1 layer, C = 4, V = 10, 2 rows x 3 tokens after 2 cached: M = 6, L = 5.
    linear 2*6*12*16 = 2304; attention 4*6*5*4 = 480; lm_head 2*6*4*10 = 480."""
    c = GPTConfig(n_layer=1, n_head=2, n_embd=4, vocab_size=10, block_size=8)
    assert roofline.forward_flops(c, 2, 3, 2) == 2304 + 480 + 480


def test_forward_flops_match_the_counter_on_the_models_forwards():
    """The prompt forward and a cached forward of several tokens (the CPU's matmul attention,
    which the counter sees; one query runs SDPA, which it does not)."""
    torch.manual_seed(0)
    c = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=12, block_size=16)
    model, cache = GPT(c).eval(), KVCache()
    ids = torch.randint(0, 12, (3, 9))
    with torch.no_grad():
        for start, end in ((0, 5), (5, 9)):
            with FlopCounterMode(display=False) as counter:
                model(ids[:, start:end], None, cache)
            assert counter.get_total_flops() == roofline.forward_flops(c, 3, end - start, start)
        keep = torch.rand(3, 9, generator=torch.Generator().manual_seed(1)) < 0.4  # the heads' positions
        with FlopCounterMode(display=False) as counter:
            model(ids, None, None, keep=keep)
        assert counter.get_total_flops() == roofline.forward_flops(c, 3, 9, 0, int(keep.sum()))


def test_typical_m_is_the_flop_weighted_median():
    assert roofline.typical_m([(1, 1), (4, 10), (100, 2)]) == 4
    assert roofline.typical_m([(1, 1), (100, 30), (4, 10)]) == 100
