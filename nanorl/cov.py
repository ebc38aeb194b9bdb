"""Clip-Cov and KL-Cov's token selection (Cui et al. 2025, arXiv 2505.22617; verl), opened by
the rows with a `select` column: a few tokens whose advantage and log-prob covary most are singled
out over each minibatch, from the current policy's log-probs."""
import torch

import losses
from model import logprobs


def select(model, batch, mb, adv, hp, cfg, kind, max_rows, gen, moved):
    """Minibatch mb's tokens (len(mb), L) of the row's kind, from the current policy's
    log-probs: at a rollout's first optimizer step theta = theta_old (pi_old serves), after it
    a no-grad forward."""
    old = now = batch.old_logp[mb]  # (len(mb), L)
    if moved:
        with torch.no_grad():
            now = logprobs(model, batch.ids[mb], batch.offsets[mb], batch.mask[mb],
                           cfg.temperature, max_rows=max_rows)[0]
    return losses.cov_select(now, old, adv[mb], batch.mask[mb], gen, kind=kind, **hp)
