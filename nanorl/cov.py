"""Clip-Cov and KL-Cov's token selection (Cui et al. 2025, arXiv 2505.22617; verl), opened by
the rows with a `select` column: a few tokens whose advantage and log-prob covary most are singled
out over each minibatch, from the current policy's log-probs."""
import torch

import losses
from model import logprobs


def select(cfg, algo, run, batch, mb, adv, max_rows, gen, first):
    """The tokens (N, L) of minibatch mb's rows the algorithm's kind singles out (others False),
    from the current policy's log-probs: at a rollout's first optimizer step theta = theta_old
    (pi_old serves), after it a no-grad forward."""
    old = now = batch.old_logp[mb]  # (len(mb), L)
    if not first:
        with torch.no_grad():
            now = logprobs(run.model, batch.ids[mb], batch.offsets[mb], batch.mask[mb],
                           cfg.temperature, max_rows=max_rows)[0]
    chosen = torch.zeros_like(batch.mask, dtype=torch.bool)  # (N, L)
    chosen[mb] = losses.cov_select(now, old, adv[mb], batch.mask[mb], gen, kind=algo.select,
                                   **run.hp)
    return chosen
