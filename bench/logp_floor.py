"""
How far apart are fp32 log-probs of the same tokens? The sampler's own (mu), the trainer's route
(model.logprobs: prompts once, distinct rows once, a KV cache) and one plain forward, each against
float64, per sampler call of a real rl.py run. rl/logp_mismatch's excursions past 1e-5 are this
floor, not a bookkeeping error: the trainer's two fp32 routes disagree with each other as much.

    python bench/logp_floor.py configs/rl_guess.py configs/rl_guess_bpe.py --max_iters=4 \
        --eval_interval=1000 --out_dir=out/logp-floor

(any rl.py arguments: the run is rl.py's, with model.generate wrapped to measure each call)
"""
import copy
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model as M  # noqa: E402

sampler = M.generate


def measured(model, prompts, *args, **kwargs):
    """model.generate, then one line: the max |difference| over the call's action tokens."""
    out = sampler(model, prompts, *args, **kwargs)
    P, ids, offsets, mu = out["prompt_len"], out["ids"], out["offsets"], out["logps"]
    act = out["action_mask"][:, P:]  # (N, L)
    with torch.no_grad():
        route = M.logprobs(model, ids, offsets, act)[0]  # (N, L) the trainer's
        plain = M.token_logps(model(ids, offsets)[:, P - 1:-1], ids[:, P:], act)  # (N, L)
        exact = M.token_logps(copy.deepcopy(model).double()(ids, offsets)[:, P - 1:-1],
                              ids[:, P:], act)  # (N, L) float64
    gap = {"mu-trainer": (mu, route), "trainer-plain": (route, plain), "mu-fp64": (mu, exact),
           "trainer-fp64": (route, exact), "plain-fp64": (plain, exact)}
    print("logp_floor " + " ".join(f"{k} {((a - b).abs() * act).max().item():.1e}"
                                   for k, (a, b) in gap.items()), flush=True)
    return out


if __name__ == "__main__":
    M.generate = measured  # rl.py imports it from model when it runs
    sys.argv = ["rl.py", *sys.argv[1:]]
    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "rl.py"), run_name="__main__")
