"""Every loss (preference and reward-model ones too), advantage, KL estimator, rollout weight and
token selection as a pure tensor function, and ALGOS: an entry per `rl.py --loss=NAME`, an
algorithm, holding every fact of it; the loop reads its columns, never its name. An objective is
maximised; its loss, minimised, is algo_loss's: (loss, stats).

- Tensors are aligned to the response (position 0: its first token), right-padded.
  logp / old_logp / ref_logp (B, T): log-probs of the sampled tokens under the policy
  trained / the one that sampled them (pi_old) / the frozen reference.
- mask m (B, T): 1 on every token the policy chose, EOS included. Padding may hold -inf:
  it is selected away with `where`, never multiplied by 0.
- adv: (B,) per sequence or (B, T) per token. r_t = exp(logp_t - old_logp_t).
- n_tokens, n_seqs count the whole batch (default: this one): micro-batches add up.
"""
import math
from dataclasses import dataclass, field, make_dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

# -------------------------------------------------------------- reductions, entropy, normalisers


def masked_sum(x, mask, dim=None):
    """Sum of x where mask is set (whole tensor, or along dim)."""
    x = torch.where(mask.bool(), x, 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean of x over the masked entries; an empty selection gives 0, not NaN."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def token_entropy(logits, temperature=1.0):
    """(B, T) entropy of the tempered fp32 softmax; the caller masks it."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)  # 0 * -inf would be NaN


def aggregate(x, mask, agg, n_tokens=None, n_seqs=None, max_len=None):
    """A batch's loss from per-token x (B, T), or per-sequence x (B,), as verl's agg_loss:
        "token-mean"               sum_it x / n_tokens             (DAPO)
        "seq-mean-token-mean"      sum_i mean_t x / n_seqs         (GRPO)
        "seq-mean-token-sum"       sum_it x / n_seqs               (REINFORCE)
        "seq-mean-token-sum-norm"  sum_it x / (n_seqs * max_len)   (Dr. GRPO; max_len: T)
    A per-sequence x is summed and divided by n_seqs."""
    n_seqs = n_seqs or mask.shape[0]
    if x.dim() == 1 or agg == "seq-mean-token-mean":
        return (x if x.dim() == 1 else masked_mean(x, mask, dim=1)).sum() / n_seqs
    if agg == "token-mean":
        return masked_sum(x, mask) / (n_tokens or mask.bool().sum().clamp_min(1))
    if agg == "seq-mean-token-sum":
        return masked_sum(x, mask) / n_seqs
    if agg == "seq-mean-token-sum-norm":
        return masked_sum(x, mask) / (n_seqs * (max_len or mask.shape[1]))
    raise ValueError(f"unknown aggregation {agg!r}")

def add_stats(stats, part, w):
    """A micro-batch's stats into its minibatch's, weighted by w (its share of the tokens); a
    maximum stays the largest."""
    for k, v in part.items():
        top = k in ("ratio_max", "logp_mismatch")
        stats[k] = max(stats.get(k, -1e30), float(v)) if top else stats.get(k, 0.0) + float(v) * w

# -------------------------------------------------------------- advantages, KL


GROUP_KINDS = ("std", "mean", "rloo", "maxrl")  # group_advantages' kinds: R against its group's


def group_advantages(rewards, kind="std", eps=1e-6):
    """Rewards (P, G) of P groups of G -> advantages (P, G); all-equal groups get 0.
    "std":   (R - mean_g) / (std_g + eps), population std (GRPO, Shao et al. 2024)
    "mean":  R - mean_g (Dr. GRPO, Liu et al. 2025)
    "rloo":  R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_g) (Ahmadian et al. 2024)
    "maxrl": (R - mean_g) / mean_g, 0 where mean_g <= 0: weight 1/p (MaxRL, 2026)"""
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    G = rewards.shape[-1]
    mean = rewards.mean(-1, keepdim=True)  # (P, 1)
    centred = rewards - mean  # (P, G)
    if kind == "std":
        adv = centred / (rewards.std(-1, correction=0, keepdim=True) + eps)
    elif kind == "mean":
        adv = centred
    elif kind == "rloo":
        if G < 2:
            raise ValueError("rloo advantages need a group size of at least 2")
        adv = centred * G / (G - 1)
    elif kind == "maxrl":
        adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)
    else:
        raise ValueError(f"unknown advantage kind {kind!r}; valid: {', '.join(GROUP_KINDS)}")
    same = (rewards == rewards[..., :1]).all(-1, keepdim=True)  # (P, 1) no signal
    return torch.where(same, 0.0, adv)


def pass_k_advantages(rewards, k, eps=1e-6):
    """Pass@k training (Chen et al. 2025, arXiv 2508.10751): a group of G 0/1 rewards scored as
    its C(G, k) subsets of k, each worth its best; a sample's advantage is the mean, over the
    subsets that hold it, of the subset's reward minus their mean, over their std. With n wrong:
    mean = 1 - C(n, k) / C(G, k), std = sqrt(mean (1 - mean)), A_right = (1 - mean) / std,
    A_wrong = (1 - mean - C(n - 1, k - 1) / C(G - 1, k - 1)) / std: a wrong sample is charged
    only where the other k - 1 are wrong too. k = 1 is GRPO's. rewards (P, G) -> (P, G)."""
    G = rewards.shape[-1]
    if not 1 <= k < G:  # k = G: one subset, the same for every sample, no signal
        raise ValueError(f"pass_k must be in [1, group_size - 1 = {G - 1}], got {k}")
    n = (rewards <= 0).sum(-1, keepdim=True)  # (P, 1) the wrong samples
    miss = torch.tensor([math.comb(i, k) / math.comb(G, k) for i in range(G + 1)])  # (G + 1,)
    alone = torch.tensor([math.comb(i - 1, k - 1) / math.comb(G - 1, k - 1) if i else 0.0
                          for i in range(G + 1)])  # (G + 1,) the other k - 1 wrong as well
    mean = 1 - miss.to(rewards.device)[n]  # (P, 1)
    wrong = 1 - mean - alone.to(rewards.device)[n]  # (P, 1)
    adv = torch.where(rewards > 0, 1 - mean, wrong) / ((mean * (1 - mean)).sqrt() + eps)
    return torch.where(mean * (1 - mean) > 0, adv, 0.0)  # (P, G) all-equal groups: 0


@torch.no_grad()
def gae(rewards, values, mask, gamma, lam):
    """GAE (Schulman et al. 2016) -> (adv, the value targets A + V), (B, T) each, 0 off the mask:
    delta_t = r_t + gamma V_t' - V_t, A_t = delta_t + gamma lam A_t', t' the next masked
    position (0 after the last): unmasked ones (the environment's) are skipped, as in verl."""
    m = mask.bool()
    adv = torch.zeros_like(values)  # (B, T)
    next_adv = torch.zeros_like(values[:, 0])  # (B,)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = torch.where(m[:, t], delta + gamma * lam * next_adv, next_adv)
        next_value = torch.where(m[:, t], values[:, t], next_value)
        adv[:, t] = next_adv
    return torch.where(m, adv, 0.0), torch.where(m, adv + values, 0.0)


def turn_index(mask):
    """(B, T) each policy token's turn: 0, 1, ... a run of masked tokens each (an observation
    ends a run), -1 off the mask."""
    m = mask.bool()
    first = m & ~F.pad(m, (1, 0))[:, :-1]  # (B, T) a turn's first token
    return torch.where(m, first.long().cumsum(1) - 1, -1)


def per_turn(x, turn, reduce="sum"):
    """(B, T) token values -> (B, S + 1) one a turn: their sum over the turn's tokens, or (reduce
    "same") the value each of its tokens holds; column S, after the last turn, 0."""
    S = int(turn.max()) + 1
    col = torch.where(turn >= 0, turn, S)  # (B, T) off the mask: the spare column
    out = torch.zeros(x.shape[0], S + 1, dtype=x.dtype, device=x.device)
    out = out.scatter_add(1, col, x) if reduce == "sum" else out.scatter(1, col, x)
    out[:, S] = 0
    return out


@torch.no_grad()
def vine_advantages(rewards, values, mask):
    """VinePPO (Kazemnejad et al. 2024, arXiv 2410.01679): every token of turn k gets
    A_k = r_k + V(s_{k+1}) - V(s_k), the turn's rewards plus the value of the state it leads
    to, minus the value of the state it starts from; V after the last turn 0.
    rewards (B, T): per token (a turn's at its end, the outcome on the last); values (B, T):
    V(s_k) on each token of turn k (Monte-Carlo, nanorl/turns.py). -> (B, T), 0 off the mask."""
    turn = turn_index(mask)  # (B, T)
    r, v = per_turn(rewards, turn), per_turn(values, turn, "same")  # (B, S + 1) each
    a = r[:, :-1] + v[:, 1:] - v[:, :-1]  # (B, S)
    return torch.where(turn >= 0, a.gather(1, turn.clamp_min(0)), 0.0)


@torch.no_grad()
def signed_advantages(outcome, turn_rewards, mask, pos_weight):
    """Negative-sample reinforcement (Zhu et al. 2025, arXiv 2506.01347), no baseline: every token
    of turn k gets pos_weight max(c_k, 0) + min(c_k, 0), c_k = 2R - 1 + r_k, the episode's outcome
    R (a 0/1 score: -1 wrong, +1 right) plus the turn's own reward. NSR: pos_weight 0, only the
    negatives are pushed down; W-REINFORCE: 0.1. Turn rewards (a process reward, the oracle's)
    push hardest on the turn that earned the loss. outcome (B,), turn_rewards (B, T) or None,
    mask (B, T) -> (B, T), 0 off the mask."""
    m = mask.bool()
    c = (2 * outcome.float() - 1)[:, None].expand(m.shape)  # (B, T)
    if turn_rewards is not None:  # each token its turn's reward too
        turn = turn_index(m)  # (B, T)
        c = c + per_turn(turn_rewards.float(), turn).gather(1, turn.clamp_min(0))
    return torch.where(m, pos_weight * c.clamp_min(0) + c.clamp_max(0), 0.0)


@torch.no_grad()
def step_advantages(rewards, states, groups, mask, gamma, eps=1e-6):
    """GiGPO's step-level advantage (Feng et al. 2025, arXiv 2505.10978, Eq. 5-7): a turn's
    discounted return R_k = sum_{j>=k} gamma^(j-k) r_j, normalised within its step group, the
    turns of one episode group (groups (B,): each row's) that start from the same state
    (states (B, T): the state's id on each token of its turn): (R_k - mean) / (std + eps),
    population std over the step group's turns; a group of one, or all equal, 0.
    -> (B, T): each token its turn's, 0 off the mask."""
    turn = turn_index(mask)  # (B, T)
    r = per_turn(rewards, turn)  # (B, S + 1)
    ret = torch.zeros_like(r)  # (B, S + 1) the discounted return from each turn on
    for k in reversed(range(r.shape[1] - 1)):
        ret[:, k] = r[:, k] + gamma * ret[:, k + 1]
    on = per_turn(torch.ones_like(rewards), turn)[:, :-1] > 0  # (B, S) the turns there are
    state = per_turn(states, turn, "same")[:, :-1]  # (B, S)
    key = torch.stack([groups[:, None].expand_as(state)[on], state[on]], 1)  # (M, 2)
    _, step_group, n = torch.unique(key, dim=0, return_inverse=True, return_counts=True)
    R = ret[:, :-1][on]  # (M,) each turn's return; step_group (M,) its step group
    mean = torch.zeros_like(n, dtype=R.dtype).index_add_(0, step_group, R) / n  # (groups,)
    var = torch.zeros_like(mean).index_add_(0, step_group, (R - mean[step_group]) ** 2) / n
    adv = torch.zeros_like(ret[:, :-1])  # (B, S)
    adv[on] = torch.where(var[step_group] > 0, (R - mean[step_group])
                          / (var[step_group].sqrt() + eps), 0.0)
    return torch.where(turn >= 0, adv.gather(1, turn.clamp_min(0)), 0.0)


def cliff_advantages(rewards, first_wrong, mask, lam=0.0):
    """CLIFF (2025) -> (P, G, T) from 0/1 rewards (P, G), first_wrong (P, G) (-1: none) and
    mask (P, G, T). With the group's mean mu, std sd: a correct answer gets (1-mu)/sd = a_good,
    a wrong one lam a_good before its first wrong token, -mu/sd from it; centred per group."""
    if not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError("cliff_advantages needs binary 0/1 rewards (the exact verifier)")
    m, rewards = mask.bool(), rewards.float()
    mu = rewards.mean(-1, keepdim=True)  # (P, 1)
    sd = rewards.std(-1, correction=0, keepdim=True)  # (P, 1)
    live = sd > 0  # (P, 1) groups with signal
    sd = torch.where(live, sd, 1.0)
    a_good, a_bad = ((1 - mu) / sd)[..., None], (-mu / sd)[..., None]  # (P, 1, 1)
    t = torch.arange(m.shape[-1], device=m.device)  # (T,)
    before = t < first_wrong.clamp_min(0)[..., None]  # (P, G, T)
    adv = torch.where(rewards[..., None] == 1, a_good, torch.where(before, lam * a_good, a_bad))
    adv = adv - masked_mean(adv.expand(m.shape), m, dim=(1, 2))[:, None, None]
    return torch.where(m & live[..., None], adv, 0.0)


def teacher_advantages(old_logp, teacher_lp, mask, bound=10.0):
    """On-policy distillation's (N, L) A_t = -clamp(log pi_old_t - log pi_T_t, +-bound), 0 off
    the mask. From pi_old, not mu: under staleness an advantage from mu would add grad KL(pi ||
    mu), a push away from the sampler; pi_old is what the trainer recomputes (offpolicy.py)."""
    return torch.where(mask.bool(), -(old_logp - teacher_lp).clamp(-bound, bound), 0.0)


def kl_estimate(logp, ref_logp, kind="k3"):
    """Per-token KL(pi || pi_ref) (Schulman 2020): k1 = -x, k2 = x^2/2, k3 = e^x - x - 1,
    x = ref_logp - logp clamped to +-20 as verl clamps it (e^x overflows). The estimate itself is
    not clamped, as TRL's: verl's k3 (low_var_kl) is also clamped to [-10, 10], which zeroes
    the gradient past it (logp -30, ref -27: 16.086 here and in TRL, 10.0 in verl)."""
    x = (ref_logp - logp).clamp(-20.0, 20.0)
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator {kind!r}; valid: k1, k2, k3")
    return {"k1": -x, "k2": 0.5 * x * x, "k3": torch.expm1(x) - x}[kind]


def last_token(mask):
    """(B,) position of each row's last masked token (T - 1 in a row with none)."""
    return mask.shape[1] - 1 - mask.flip(1).int().argmax(1)


@torch.no_grad()
def kl_in_reward(reward, logp, ref_logp, mask, beta):
    """(B, T) token rewards: -beta k1 on every masked token, the (B,) reward on the last one:
    maximising their sum maximises E[R] - beta KL (PPO, REINFORCE++)."""
    m = mask.bool()
    rewards = torch.where(m, -beta * kl_estimate(logp, ref_logp, "k1"), 0.0)  # (B, T)
    rows = torch.arange(m.shape[0], device=m.device)
    rewards[rows, last_token(m)] += torch.where(m.any(1), reward.to(rewards.dtype), 0.0)
    return rewards


def prefix_prob(logp):
    """(B, T) pi(y_<t | x) = exp(sum_{j<t} logp_j): 1 at the first response token."""
    return torch.exp(F.pad(logp, (1, 0))[:, :-1].cumsum(1))


def prefix_value(head, logp):
    """PPO's value (B, T): V_t = head(h_t) pi(y_<t | x). One wrong token zeroes an exact
    match's return, so a prefix is worth at most the chance of having sampled it."""
    return head * prefix_prob(logp.detach())


def masked_var(x, mask):
    """Population variance of x over the masked entries (0-d)."""
    return masked_mean((x - masked_mean(x, mask)) ** 2, mask)


def whiten(x, mask, mean=None, var=None, eps=1e-8):
    """(B, T) x at mean 0 and std 1 over the masked tokens (PPO's whitening); 0 off the mask.
    mean / var default to this batch's; under DDP pass every rank's."""
    m = mask.bool()
    mean = masked_mean(x, m) if mean is None else mean
    var = masked_var(x, m) if var is None else torch.as_tensor(var, dtype=x.dtype)
    return torch.where(m, (x - mean) * torch.rsqrt(var + eps), 0.0)


def adaptive_beta(beta, kl, target, n, horizon=10000):
    """Adaptive KL (Ziegler et al. 2019): beta *= 1 + clip(kl/target - 1, +-0.2) n/horizon; kl
    and --kl_target per sequence (k1 summed over its tokens), as theirs and TRL's."""
    return beta * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)


def clip_objective(ratio, adv, eps_low, eps_high, clip_c=None):
    """PPO's clip (Schulman et al. 2017) -> (obj, low, high): min(rA, clip(r, 1-eps_low,
    1+eps_high) A), dual clip (Ye et al. 2020): >= clip_c A for A < 0; low/high: cut there."""
    clipped = ratio.clamp(min=1 - eps_low).clamp(max=1 + eps_high)  # eps: floats or (B,)
    obj = torch.minimum(ratio * adv, clipped * adv)
    low = (adv < 0) & (ratio < 1 - eps_low)
    high = (adv > 0) & (ratio > 1 + eps_high)
    if clip_c is not None:
        dual = (adv < 0) & (obj < clip_c * adv)
        obj, high = torch.where(dual, clip_c * adv, obj), high | dual
    return obj, low, high

@torch.no_grad()
def rollout_weights(old_logp, mu_logp, mask, kind, cap=2.0, low=0.5, high=5.0):
    """Detached weights (B, T) of a rollout sampled by mu and trained from pi_old, and the share
    of tokens capped or masked (0-d); rho_t = exp(old_t - mu_t).
      tis:       min(rho_t, cap) (Yao et al. 2025; verl)
      seq_tis:   min(prod_t rho_t, cap) on each token of the sequence
      icepop:    rho_t if low <= rho_t <= high, else 0 (arXiv 2510.18855)
      decoupled: rho_t = pi_prox / mu, 0 above high (decoupled PPO, AReaL, arXiv 2505.24298;
                 its clip is anchored at pi_prox = old_logp)
    Used as w A: w >= 0 is constant, so min(r wA, clip(r) wA) = w min(rA, clip(r) A)."""
    m = mask.bool()
    x = torch.where(m, old_logp - mu_logp, 0.0)  # (B, T)
    rho = torch.exp(x.sum(1, keepdim=True) if kind == "seq_tis" else x).expand(m.shape)
    if kind in ("tis", "seq_tis"):
        cut, w = rho > cap, rho.clamp(max=cap)  # (B, T) capped
    elif kind in ("icepop", "decoupled"):
        cut = (rho > high) | (rho < low) if kind == "icepop" else rho > high  # (B, T)
        w = torch.where(cut, 0.0, rho)
    else:
        raise ValueError(f"unknown rollout correction {kind!r}; valid: tis, seq_tis, icepop, "
                         "decoupled")
    return w, masked_mean(cut.float(), m)


@torch.no_grad()
def cov_select(logp, old_logp, adv, mask, generator=None, *, kind, **hp):
    """(B, T) bool: the tokens one minibatch singles out. cov_t = (A_t - mean A)(logp_t - mean
    logp), means over the valid tokens; n = max(floor(cov_ratio n_valid), 1). clip_cov: n drawn
    uniformly (generator) among the valid tokens the clip (eps_low, eps_high) leaves alone with
    cov_lb < cov < cov_ub; kl_cov: the top n by cov."""
    m = mask.bool()
    logp, adv = torch.where(m, logp, 0.0), (adv[:, None] if adv.dim() == 1 else adv).expand(m.shape)
    cov = (adv - masked_mean(adv, m)) * (logp - masked_mean(logp, m))  # (B, T)
    n = max(int(hp["cov_ratio"] * int(m.sum())), 1)
    if kind == "kl_cov":
        top = torch.where(m, cov, -torch.inf).flatten().topk(min(n, int(m.sum()))).indices
    else:
        ratio = torch.exp(logp - torch.where(m, old_logp, 0.0))  # (B, T)
        _, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"])
        ok = m & ~low & ~high & (cov > hp["cov_lb"]) & (cov < hp["cov_ub"])  # (B, T)
        ok = ok.flatten().nonzero()[:, 0]
        top = ok[torch.randperm(len(ok), generator=generator, device=ok.device)[:n]]
    sel = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    return sel.index_fill_(0, top, True).view(m.shape)

# -------------------------------------------------------------- objectives
# (logp, old_logp, adv, m, hp, **inputs), padding zeroed, constants detached -> (objective to
# maximise, (B, T) or (B,), stats); algo_loss adds the KL and aggregates.


@torch.no_grad()
def _stats(ratio, m, low=None, high=None):
    """0-d ratio mean / max and the fractions of tokens clipped low / high (None: none), over the
    masked tokens: masked_mean's sums written out, so that a loss's deepest call is this one."""
    n, none = m.sum().clamp_min(1), torch.zeros_like(m)  # the tokens; no token clipped
    low = none if low is None else low
    high = none if high is None else high
    return dict(clipfrac_low=torch.where(m, low.float(), 0.0).sum() / n,
                clipfrac_high=torch.where(m, high.float(), 0.0).sum() / n,
                ratio_mean=torch.where(m, ratio, 0.0).sum() / n,
                ratio_max=torch.where(m, ratio, 0.0).max())


def _tok(adv, m):
    return (adv[:, None] if adv.dim() == 1 else adv).expand(m.shape)  # (B, T)


def pg(logp, old_logp, adv, m, hp):
    """The plain policy gradient A logp (REINFORCE, Williams 1992): on-policy only."""
    return _tok(adv, m) * logp, _stats(torch.exp(logp - old_logp), m)


def clip(logp, old_logp, adv, m, hp):
    """PPO's clipped surrogate per token: min(rA, clip(r, 1-eps_low, 1+eps_high) A)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    obj, low, high = clip_objective(ratio, _tok(adv, m), hp["eps_low"], hp["eps_high"],
                                    hp.get("clip_c"))
    return obj, _stats(ratio, m, low, high)


def ppo(logp, old_logp, adv, m, hp, values, old_values, value_targets, entropy=None):
    """PPO as InstructGPT: clip - vf_coef err / 2 + ent_coef entropy, err = (V - target)^2 (GAE's
    A + V), or with vf_clip (PPO2) the larger of it and (old_V + clip(V - old_V, +-vf_clip) -
    target)^2."""
    obj, stats = clip(logp, old_logp, adv, m, hp)
    old_values, targets = old_values.detach(), value_targets.detach()
    err = (values - targets) ** 2  # (B, T)
    if hp["vf_clip"]:
        v_clip = old_values + (values - old_values).clamp(-hp["vf_clip"], hp["vf_clip"])
        err = torch.maximum(err, (v_clip - targets) ** 2)
    obj = obj - hp["vf_coef"] * 0.5 * err
    if hp["ent_coef"]:
        obj = obj + hp["ent_coef"] * entropy
    stats.update(value_loss=masked_mean(0.5 * err.detach(), m),
                 approx_kl=masked_mean(0.5 * (logp - old_logp).detach() ** 2, m))
    return obj, stats


def gspo(logp, old_logp, adv, m, hp):
    """GSPO (Zheng et al. 2025): min(sA, clip(s, 1-eps_low, 1+eps_high) A) per sequence,
    s_i = exp(mean_t d_t) the geometric mean of its token ratios."""
    if adv.dim() != 1:
        raise ValueError("a sequence-ratio loss needs a per-sequence advantage (B,)")
    s = torch.exp(masked_mean(logp - old_logp, m, dim=1))  # (B,) grad s_i / |y_i| per token
    obj, low, high = clip_objective(s, adv, hp["eps_low"], hp["eps_high"], hp.get("clip_c"))
    obj = torch.where(m.any(1), obj, 0.0)  # a row with no policy token: its s = e^0 = 1, not A
    return obj, _stats(torch.exp(logp - old_logp), m, low[:, None] & m, high[:, None] & m)


def gapo(logp, old_logp, adv, m, hp, group_correct, group_size):
    """GAPO (2025): GSPO whose upper clip grows as the group gets harder, eps_low + (eps_high -
    eps_low) (G - c)/(G - 1) for c of G correct; groups with c in {0, G} get 0."""
    c = torch.as_tensor(group_correct, dtype=torch.float32, device=logp.device)  # (B,)
    G = group_size
    if G < 2 or ((c < 0) | (c > G) | (c != c.round())).any():
        raise ValueError(f"gapo needs binary rewards: group_correct must be integer counts "
                         f"in [0, group_size={G}], got {c.tolist()}")
    eps_high = hp["eps_low"] + (hp["eps_high"] - hp["eps_low"]) * (G - c) / (G - 1)  # (B,)
    adv = torch.where((c > 0) & (c < G), adv, 0.0)  # (B,) all-equal: no signal
    return gspo(logp, old_logp, adv, m, dict(hp, eps_high=eps_high))


def gmpo(logp, old_logp, adv, m, hp):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): w_i A_i, w_i = exp(mean_t l_t), l_t = d_t
    clipped in log space: min(d_t, clamp(d_t, -eps_low, eps_high)) if A > 0, else max."""
    if adv.dim() != 1:
        raise ValueError("a sequence-ratio loss needs a per-sequence advantage (B,)")
    d, A = logp - old_logp, _tok(adv, m)  # (B, T) each
    lim = d.clamp(-hp["eps_low"], hp["eps_high"])
    ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))  # (B, T)
    low, high = (A <= 0) & (d < -hp["eps_low"]), (A > 0) & (d > hp["eps_high"])
    obj = torch.where(m.any(1), torch.exp(masked_mean(ell, m, dim=1)) * adv, 0.0)  # (B,) as GSPO
    return obj, _stats(d.exp(), m, low, high)


def sapo(logp, old_logp, adv, m, hp):
    """SAPO (Gao et al. 2025): (4/tau) sigmoid(tau (r-1)) A, a soft gate for the clip, tau =
    tau_pos where A > 0, else tau_neg."""
    ratio, A = torch.exp(logp - old_logp), _tok(adv, m)  # (B, T) each
    tau = torch.where(A > 0, hp["tau_pos"], hp["tau_neg"])
    return 4 / tau * torch.sigmoid(tau * (ratio - 1)) * A, _stats(ratio, m)


def cispo(logp, old_logp, adv, m, hp):
    """CISPO (MiniMax-M1, 2025): sg(min(r, eps_max)) A logp: the weight capped, the gradient
    never blocked (eps_max 5 as in ScaleRL)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    obj = ratio.clamp(max=hp["eps_max"]).detach() * _tok(adv, m) * logp
    return obj, _stats(ratio, m, high=ratio > hp["eps_max"])


def pnpo(logp, old_logp, adv, m, hp):
    """PNPO (2025): gate w A logp, prefix weight w_t = sg(exp(cumsum(d)_t / t)), t the token's
    index among the policy's, from 1; gate 1 iff 1 - eps_low h_t <= w_t <= 1 + eps_high h_t,
    h_t = sqrt(|y_i| / t)."""
    d = (logp - old_logp).detach()  # (B, T) 0 off the mask
    t = m.cumsum(1).clamp_min(1)  # (B, T) an environment's tokens do not count
    w = torch.exp(d.cumsum(1) / t)  # (B, T)
    h = torch.sqrt(m.sum(1, keepdim=True) / t)  # (B, T)
    low, high = w < 1 - hp["eps_low"] * h, w > 1 + hp["eps_high"] * h
    obj = torch.where(low | high, 0.0, w * _tok(adv, m) * logp)
    return obj, _stats(d.exp(), m, low, high)


def dppo(logp, old_logp, adv, m, hp):
    """DPPO (Qi et al. 2026, arXiv 2602.04879; verl): sg(min(r, is_cap)) A logp on tokens
    whose probability moved at most delta the way A pushes; the others drop out."""
    ratio, A = torch.exp(logp - old_logp), _tok(adv, m)  # (B, T) each
    dp = (logp.exp() - old_logp.exp()).detach()  # (B, T)
    low, high = (A <= 0) & (dp < -hp["delta"]), (A > 0) & (dp > hp["delta"])
    obj = torch.where(low | high, 0.0, ratio.clamp(max=hp["is_cap"]).detach() * A * logp)
    return obj, _stats(ratio, m, low, high)


def clip_cov(logp, old_logp, adv, m, hp, cov_mask):
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl): the clip per token, except that a
    few random high-covariance tokens (cov_mask, from cov.select) lose loss and gradient."""
    obj, stats = clip(logp, old_logp, adv, m, hp)
    stats["cov_frac"] = masked_mean(cov_mask.float(), m)
    return torch.where(cov_mask.bool(), 0.0, obj), stats


def kl_cov(logp, old_logp, adv, m, hp, cov_mask):
    """KL-Cov (Cui et al. 2025; verl): no clip; rA per token, minus cov_kl_coef |logp -
    old_logp| on the top-covariance tokens of cov_mask (cov.select)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    pen = torch.where(cov_mask.bool(), hp["cov_kl_coef"] * (logp - old_logp).abs(), 0.0)
    stats = dict(_stats(ratio, m), cov_frac=masked_mean(cov_mask.float(), m))
    return ratio * _tok(adv, m) - pen, stats


def ratio_pg(logp, old_logp, adv, m, hp):
    """rA, no clip: on-policy distillation (Agarwal et al. 2024; Thinking Machines 2025),
    A_t = log pi_T - log pi_old (distill.py): at r = 1 the gradient of KL(pi || pi_T)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    return ratio * _tok(adv, m), _stats(ratio, m)


def gkd(logp, old_logp, adv, m, hp, logits, teacher_logits):
    """GKD (Agarwal et al. 2024; TRL): minus the exact divergence of the student's next-token
    distribution p (tempered logits (B, T, V)) from the teacher's q. gkd_beta b: 1 KL(p||q),
    0 KL(q||p), between TRL's JSD b KL(q||M) + (1-b) KL(p||M), M = b q + (1-b) p."""
    b, lp = hp["gkd_beta"], F.log_softmax(logits.float(), -1)  # (B, T, V) student
    lq = F.log_softmax(teacher_logits.detach().float(), -1)  # (B, T, V) teacher

    def kl(a, c):  # KL(a || c) of log-probs (B, T, V) -> (B, T)
        return (a.exp() * (a - c)).sum(-1)
    if b in (0, 1):
        div = kl(lp, lq) if b == 1 else kl(lq, lp)
    else:
        lm = torch.logaddexp(lq + math.log(b), lp + math.log(1 - b))  # log M
        div = b * kl(lq, lm) + (1 - b) * kl(lp, lm)
    return -div, _stats(torch.exp(logp - old_logp), m)


# preference and supervised objectives: (B,) sums of response log-probs (pref.py) -> (loss, stats)


def bt_loss(s_chosen, s_rejected):
    """Bradley-Terry reward-model loss -log sigmoid(s_c - s_r), mean over pairs (B,)."""
    d = s_chosen - s_rejected  # (B,)
    stats = {"pair_accuracy": (d > 0).float().mean(), "margin": d.mean().detach()}
    return -F.logsigmoid(d).mean(), stats


def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta=0.1, kind="sigmoid",
             label_smoothing=0.0, rpo_alpha=0.0, chosen_len=None):
    """DPO (Rafailov et al. 2023), mean over pairs, for m = (pi_c - ref_c) - (pi_r - ref_r):
      sigmoid: -(1-eps) log sigmoid(beta m) - eps log sigmoid(-beta m), eps = label_smoothing
               (conservative DPO, Mitchell 2023)
      ipo:     (m - 1/(2 beta))^2 (IPO, Azar et al. 2023).
    rpo_alpha > 0 adds the chosen answers' NLL -rpo_alpha pi_c / chosen_len (RPO, Pang 2024)."""
    chosen, rejected = pi_chosen - ref_chosen, pi_rejected - ref_rejected  # (B,) log-ratios
    m = chosen - rejected  # (B,)
    if kind == "sigmoid":
        per_pair = (-(1 - label_smoothing) * F.logsigmoid(beta * m)
                    - label_smoothing * F.logsigmoid(-beta * m))  # (B,)
    elif kind == "ipo":
        per_pair = (m - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO kind {kind!r}; valid: sigmoid, ipo")
    if rpo_alpha:
        per_pair = per_pair - rpo_alpha * pi_chosen / chosen_len
    stats = {"chosen_reward": (beta * chosen).mean().detach(),
             "rejected_reward": (beta * rejected).mean().detach(),
             "margin": (beta * m).mean().detach(), "pair_accuracy": (m > 0).float().mean()}
    return per_pair.mean(), stats


def kto_loss(pi_logp, ref_logp, desirable, pi_mismatch, ref_mismatch, beta=0.1, lambda_d=1.0,
             lambda_u=1.0, rpo_alpha=0.0, length=None):
    """KTO (Ethayarajh et al. 2024), mean over answers: r = pi - ref (B,), reference point
    z = sg(max(0, mean(pi_mismatch - ref_mismatch))) over mismatched pairs (x_i, y_j);
    desirable answers lose lambda_d (1 - sigmoid(beta (r - z))), undesirable ones lambda_u
    (1 - sigmoid(beta (z - r))). rpo_alpha > 0 adds the desirable ones' NLL / length."""
    r = pi_logp - ref_logp  # (B,)
    z = (pi_mismatch - ref_mismatch).mean().clamp_min(0).detach()  # () reference point
    d = desirable.bool()
    per = torch.where(d, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                      lambda_u * (1 - torch.sigmoid(beta * (z - r))))  # (B,)
    if rpo_alpha:
        per = per - rpo_alpha * torch.where(d, pi_logp / length, 0.0)
    rew = (beta * r).detach()  # (B,)

    def mean(sel):  # 0 when empty
        return torch.where(sel, rew, 0.0).sum() / sel.sum().clamp_min(1)
    return per.mean(), {"z": z, "desirable_reward": mean(d), "undesirable_reward": mean(~d)}


def simpo_loss(pi_chosen, pi_rejected, chosen_len, rejected_len, beta=2.0, gamma_beta_ratio=0.25,
               rpo_alpha=0.0):
    """SimPO (Meng et al. 2024, arXiv 2405.14734), no reference: with a = pi / |y| (EOS
    included), mean over pairs of -log sigmoid(beta (a_c - a_r) - gamma) - rpo_alpha a_c,
    gamma = gamma_beta_ratio beta; rpo_alpha is the authors' sft_weight (CPO-SimPO)."""
    a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len  # (B,) each
    m = beta * (a_c - a_r)  # (B,)
    stats = {"chosen_reward": (beta * a_c).mean().detach(),
             "rejected_reward": (beta * a_r).mean().detach(),
             "margin": m.mean().detach(), "pair_accuracy": (m > 0).float().mean()}
    return (-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c).mean(), stats


def log1mexp(a):
    """log(1 - exp(a)) for a < 0, accurate on both sides of -log 2 (Maechler 2012); a is
    clamped to at most -1e-6, where 0 would give -inf."""
    a = a.clamp(max=-1e-6)
    return torch.where(a > -0.6931, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def orpo_loss(pi_chosen, pi_rejected, chosen_len, rejected_len, lam=0.1):
    """ORPO (Hong et al. 2024, arXiv 2403.07691), no reference: with a = pi / |y| and log
    odds(y) = a - log(1 - e^a), mean over pairs of -a_c - lam log sigmoid(odds_c - odds_r).
    The NLL covers the chosen response only (TRL's also counts the prompt)."""
    a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len  # (B,) each, <= 0
    log_odds = (a_c - a_r) - (log1mexp(a_c) - log1mexp(a_r))  # (B,)
    stats = {"chosen_reward": a_c.mean().detach(), "rejected_reward": a_r.mean().detach(),
             "margin": log_odds.mean().detach(),
             "pair_accuracy": (log_odds > 0).float().mean()}
    return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats


def nll_loss(logp, mask, n_tokens=None):
    """The supervised baselines (sft: gold answers; rft: verified own samples, Yuan et al.
    2023): -sum_t m logp / n_tokens, n_tokens = every response token of the batch."""
    m = mask.bool()
    loss = -torch.where(m, logp, 0.0).sum() / (n_tokens or m.sum().clamp_min(1))
    return loss, {"nll": loss.detach()}


def algo_loss(algo, hp, logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None,
              **inputs):
    """A row's loss with its resolved hyperparameters hp: -(objective - beta KL if its KL is in
    the loss), aggregated as the algorithm says."""
    m = mask.bool()
    logp, old_logp = torch.where(m, logp, 0.0), torch.where(m, old_logp.detach(), 0.0)
    obj, stats = algo.objective(logp, old_logp, adv.detach(), m, hp, **inputs)
    counts = dict(n_tokens=n_tokens, n_seqs=n_seqs, max_len=hp.get("max_new_tokens"))
    out = -aggregate(obj, m, algo.agg, **counts)
    if algo.kl == "loss" and hp["beta"]:
        if ref_logp is None:
            raise ValueError(f"an in-loss KL term (beta={hp['beta']}) needs ref_logp")
        kl = kl_estimate(logp, torch.where(m, ref_logp.detach(), 0.0), hp["kl_estimator"])
        out = out + hp["beta"] * aggregate(kl, m, algo.agg, **counts)
    return out, stats

# -------------------------------------------------------------- the table


@dataclass(frozen=True)
class Algo:  # an algorithm: everything rl.py does for one --loss
    objective: Callable  # per token or per sequence (pg, clip, ...), or a pair loss
    advantage: Optional[str]  # group_advantages' kind, first_wrong, gae, rpp, vine, step_group,
    # greedy, signed, pass_k, teacher
    kl: Optional[str]  # where beta's KL goes: "loss" (-beta KL), "reward" (-beta k1)
    agg: str  # what the loss divides by (aggregate)
    needs: tuple = ()  # values, teacher(_logits), greedy, group_correct, ref
    ratio: Optional[str] = "token"  # what --rollout_is reweighs: token, sequence, none
    on_policy: bool = False  # one optimizer step per fresh rollout
    binary: bool = False  # its advantage assumes 0/1 rewards
    flat_teaches: bool = False  # an all-equal group has a signal (a teacher's, or no group
    # baseline): dynamic sampling and prompt selection keep it
    overlong: int = 0  # DAPO's overlong shaping window in tokens
    family: str = "pg"  # pg: rollouts; pref: pairs; sft: supervised rows
    data: str = "rollout"  # pref: pairs, labels (KTO); sft: gold, samples
    select: Optional[str] = None  # the tokens singled out (nanorl/cov.py): clip_cov, kl_cov
    defaults: dict = field(default_factory=dict)  # the papers' values, unless measured

    def __post_init__(self):  # a typo in a column fails at import, not silently
        for column, valid in COLUMNS.items():
            value = getattr(self, column)
            for v in value if column == "needs" else (value,):
                if v not in valid:
                    raise ValueError(f"ALGOS: column {column} has no value {v!r}; valid: {valid}")


COLUMNS = dict(advantage=(None, *GROUP_KINDS, "first_wrong", "gae", "rpp",
                          "rpp_baseline", "vine", "step_group", "greedy", "signed", "pass_k",
                          "teacher"),
               kl=(None, "loss", "reward"),
               agg=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                    "seq-mean-token-sum-norm", "pairs", "answers"),
               needs=("values", "teacher", "teacher_logits", "greedy", "group_correct", "ref"),
               ratio=("token", "sequence", None), family=("pg", "pref", "sft"),
               data=("rollout", "pairs", "labels", "gold", "samples"),
               select=(None, "clip_cov", "kl_cov"))


TOK, SEQ = "token-mean", "seq-mean-token-mean"
SUM, NORM = "seq-mean-token-sum", "seq-mean-token-sum-norm"
_CLIP = dict(beta=0.0, kl_estimator="k3", eps_low=0.2, eps_high=0.2, clip_c=None)
_PPO = dict(eps_low=0.2, eps_high=0.2, clip_c=None, beta=0.05, kl_target=None, vf_coef=0.1,
            vf_clip=0.2, ent_coef=0.0, gamma=1.0, lam=0.95, vf_lr_mult=10.0)
_SOFT = dict(beta=0.0, kl_estimator="k3")  # the in-loss KL of the unclipped rows, off
_RPP = dict(eps_low=0.2, eps_high=0.2, beta=0.01)
_RPO = dict(beta=0.1, rpo_alpha=1.0)  # an NLL anchor (measured: docs/results.md)
ON = dict(ratio=None, on_policy=True)  # REINFORCE-style: no ratio, one step per rollout
SIGNED = dict(ON, flat_teaches=True)  # no group baseline: a group that lost every game teaches
PAIRS = dict(ratio=None, on_policy=True, family="pref", data="pairs")
ALGOS = {  # name: Algo(objective=, advantage=, kl=, agg=, ...), a column a keyword
    "reinforce": Algo(objective=pg, advantage="mean", kl="reward", agg=SUM, **ON,
                      defaults=dict(beta=0.0)),
    "rloo": Algo(objective=pg, advantage="rloo", kl="reward", agg=SUM, **ON,
                 defaults=dict(beta=0.0)),
    "ppo": Algo(objective=ppo, advantage="gae", kl="reward", agg=TOK, needs=("values",),
                defaults=_PPO),
    "grpo": Algo(objective=clip, advantage="std", kl="loss", agg=SEQ,
                 defaults=dict(_CLIP, beta=0.04)),
    "dr_grpo": Algo(objective=clip, advantage="mean", kl="loss", agg=NORM,
                    defaults=dict(_CLIP, max_new_tokens=None)),
    "dapo": Algo(objective=clip, advantage="std", kl="loss", agg=TOK, overlong=2,
                 defaults=dict(_CLIP, eps_high=0.28)),
    "gspo": Algo(objective=gspo, advantage="std", kl="loss", agg=SEQ, ratio="sequence",
                 defaults=dict(_CLIP, eps_low=3e-4, eps_high=4e-4)),
    "sapo": Algo(objective=sapo, advantage="std", kl="loss", agg=SEQ,
                 defaults=dict(_SOFT, tau_pos=1.0, tau_neg=1.05)),
    "cispo": Algo(objective=cispo, advantage="std", kl="loss", agg=TOK,
                  defaults=dict(_SOFT, eps_max=5.0)),
    "gapo": Algo(objective=gapo, advantage="mean", kl="loss", agg=SEQ, needs=("group_correct",),
                 ratio="sequence", binary=True,
                 defaults=dict(_CLIP, eps_low=0.003, eps_high=0.005)),
    "pnpo": Algo(objective=pnpo, advantage="std", kl="loss", agg=SEQ,
                 defaults=dict(_SOFT, eps_low=7e-4, eps_high=9.5e-4)),
    "cliff": Algo(objective=clip, advantage="first_wrong", kl="loss", agg=SEQ, binary=True,
                  defaults=dict(_CLIP, beta=0.04)),
    "gmpo": Algo(objective=gmpo, advantage="std", kl="loss", agg=SEQ, ratio="sequence",
                 defaults=dict(_SOFT, eps_low=0.4, eps_high=0.4)),
    "dppo": Algo(objective=dppo, advantage="std", kl="loss", agg=TOK,
                 defaults=dict(_SOFT, delta=0.2, is_cap=20.0)),
    "maxrl": Algo(objective=pg, advantage="maxrl", kl=None, agg=SEQ, **ON, binary=True),
    "pass_at_k": Algo(objective=clip, advantage="pass_k", kl="loss", agg=SEQ, binary=True,
                      defaults=dict(_CLIP, pass_k=8)),
    "clip_cov": Algo(objective=clip_cov, advantage="std", kl="loss", agg=TOK, select="clip_cov",
                     defaults=dict(_CLIP, cov_ratio=2e-4, cov_lb=1.0, cov_ub=5.0)),
    "kl_cov": Algo(objective=kl_cov, advantage="std", kl="loss", agg=TOK, select="kl_cov",
                   defaults=dict(_SOFT, cov_ratio=2e-3, cov_kl_coef=1.0)),  # the 7B recipe
    "reinforce_pp": Algo(objective=clip, advantage="rpp", kl="reward", agg=TOK, defaults=_RPP),
    "reinforce_pp_baseline": Algo(objective=clip, advantage="rpp_baseline", kl="reward", agg=TOK,
                                  defaults=_RPP),
    "vineppo": Algo(objective=clip, advantage="vine", kl="reward", agg=TOK,  # V: K branches from
                    defaults=dict(eps_low=0.2, eps_high=0.2, beta=1e-4, branches=4,  # a turn's
                                  value_table=0.0)),  # state; > 0: a table, its least step
    "gigpo": Algo(objective=clip, advantage="step_group", kl="loss", agg=TOK,  # gamma: the
                  defaults=dict(_CLIP, beta=0.01, gamma=0.95, step_weight=1.0)),  # turns' discount
    "remax": Algo(objective=pg, advantage="greedy", kl="reward", agg=TOK, needs=("greedy",), **ON,
                  defaults=dict(beta=0.0)),
    "nsr": Algo(objective=pg, advantage="signed", kl="reward", agg=TOK, **SIGNED,
                defaults=dict(beta=0.0, pos_weight=0.0)),
    "w_reinforce": Algo(objective=pg, advantage="signed", kl="reward", agg=TOK, **SIGNED,
                        defaults=dict(beta=0.0, pos_weight=0.1)),  # the paper's lambda
    "opd": Algo(objective=ratio_pg, advantage="teacher", kl=None, agg=TOK, needs=("teacher",),
                flat_teaches=True),
    "gkd": Algo(objective=gkd, advantage=None, kl=None, agg=TOK,
                needs=("teacher", "teacher_logits"), ratio=None, flat_teaches=True,
                defaults=dict(gkd_beta=1.0)),  # 1 = reverse KL
    "dpo": Algo(objective=dpo_loss, advantage=None, kl=None, agg="pairs", needs=("ref",), **PAIRS,
                defaults=dict(_RPO, kind="sigmoid", label_smoothing=0.0)),
    "ipo": Algo(objective=dpo_loss, advantage=None, kl=None, agg="pairs", needs=("ref",), **PAIRS,
                defaults=dict(_RPO, beta=0.5, kind="ipo")),  # a 1-nat margin
    "kto": Algo(objective=kto_loss, advantage=None, kl=None, agg="answers", needs=("ref",),
                **dict(PAIRS, data="labels"),
                defaults=dict(_RPO, beta=1.0, lambda_d=1.0, lambda_u=1.0)),  # 0.1: -pass@8
    "simpo": Algo(objective=simpo_loss, advantage=None, kl=None, agg="pairs", **PAIRS,
                  defaults=dict(_RPO, beta=2.0, gamma_beta_ratio=0.25)),
    "orpo": Algo(objective=orpo_loss, advantage=None, kl=None, agg="pairs", **PAIRS,
                 defaults=dict(lam=0.1)),
    "sft": Algo(objective=nll_loss, advantage=None, kl=None, agg=TOK,
                **dict(PAIRS, family="sft", data="gold")),
    "rft": Algo(objective=nll_loss, advantage=None, kl=None, agg=TOK,
                **dict(PAIRS, family="sft", data="samples")),
}
DEFAULTS = {n: a.defaults for n, a in ALGOS.items()}
KNOBS = {k: type(v) if v is not None else float for d in DEFAULTS.values() for k, v in d.items()
         if k not in ("kind", "max_new_tokens")}  # max_new_tokens: the run's; kind: the algorithm's
Knobs = make_dataclass("Knobs", [(k, Optional[t], None) for k, t in KNOBS.items()])  # rl.py --k=v
Knobs.__module__, Knobs.help = __name__, {k: "None = the algorithm's: " + ", ".join(
    f"{n} {d[k]}" for n, d in DEFAULTS.items() if k in d) for k in KNOBS}  # rl.py --help


def resolve_hparams(name, **overrides):
    """ALGOS[name].defaults with the non-None overrides (None: the default; a None for a knob
    the loss lacks is ignored, a config passes all); unknown or out-of-range ones fail."""
    if name not in ALGOS:
        fams = {"pg": "policy gradient", "pref": "preference", "sft": "baselines"}
        raise ValueError(f"unknown loss {name!r}; valid: " + "; ".join(f"{v}: " + ", ".join(
            n for n, a in ALGOS.items() if a.family == f) for f, v in fams.items()))
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for k in overrides.keys() - DEFAULTS[name].keys():
        raise ValueError(f"loss {name!r} has no hyperparameter {k!r}; "
                         f"it takes {', '.join(DEFAULTS[name]) or 'none'}")
    for k in ("beta", "eps_low", "eps_high"):
        if overrides.get(k, 0) < 0:
            raise ValueError(f"{k} must be >= 0, got {overrides[k]}")
    if not 0 <= overrides.get("gkd_beta", 0) <= 1:
        raise ValueError(f"gkd_beta must be in [0, 1], got {overrides['gkd_beta']}")
    if overrides.get("clip_c", 2) <= 1:  # c < 1 would raise the objective for A < 0
        raise ValueError(f"clip_c must be > 1 or unset (dual clip: obj >= clip_c A for A < 0), "
                         f"got {overrides['clip_c']}")
    return {**DEFAULTS[name], **overrides}

