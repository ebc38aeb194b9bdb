"""Clip-Cov and KL-Cov's token selection (Cui et al. 2025, arXiv 2505.22617; verl), opened by
the rows with a `select` column: a few tokens whose advantage and log-prob covary most are singled
out over each minibatch, from the current policy's log-probs."""
import torch

import losses
from model import logprobs


@torch.no_grad()
def cov_select(logp, old_logp, adv, mask, generator=None, *, kind, **hp):
    """(B, T) bool: the tokens one minibatch singles out. cov_t = (A_t - mean A)(logp_t - mean
    logp), means over the valid tokens; n = max(floor(cov_ratio n_valid), 1). clip_cov: n drawn
    uniformly (generator) among the valid tokens the clip (eps_low, eps_high) leaves alone with
    cov_lb < cov < cov_ub; kl_cov: the top n by cov."""
    m = mask.bool()
    logp, adv = torch.where(m, logp, 0.0), (adv[:, None] if adv.dim() == 1 else adv).expand(m.shape)
    cov = (adv - losses.masked_mean(adv, m)) * (logp - losses.masked_mean(logp, m))  # (B, T)
    n = max(int(hp["cov_ratio"] * int(m.sum())), 1)
    if kind == "kl_cov":
        top = torch.where(m, cov, -torch.inf).flatten().topk(min(n, int(m.sum()))).indices
    else:
        ratio = torch.exp(logp - torch.where(m, old_logp, 0.0))  # (B, T)
        _, low, high = losses.clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"])
        ok = m & ~low & ~high & (cov > hp["cov_lb"]) & (cov < hp["cov_ub"])  # (B, T)
        ok = ok.flatten().nonzero()[:, 0]
        top = ok[torch.randperm(len(ok), generator=generator, device=ok.device)[:n]]
    sel = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    return sel.index_fill_(0, top, True).view(m.shape)


def select(model, batch, mb, adv, hp, cfg, kind, max_rows, gen, moved):
    """Minibatch mb's tokens (len(mb), L) of the row's kind, from the current policy's
    log-probs: at a rollout's first optimizer step theta = theta_old (pi_old serves), after it
    a no-grad forward."""
    old = now = batch.old_logp[mb]  # (len(mb), L)
    if moved:
        with torch.no_grad():
            now = logprobs(model, batch.ids[mb], batch.offsets[mb], batch.mask[mb],
                           cfg.temperature, max_rows=max_rows)[0]
    return cov_select(now, old, adv[mb], batch.mask[mb], gen, kind=kind, **hp)
