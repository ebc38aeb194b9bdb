"""Policy-gradient, preference and supervised-baseline losses, advantages and KL estimators for RL
post-training: pure tensor functions.

Every loss is *minimised* (loss = -objective) and returns (loss, stats). Conventions:
- Tensors handed to the losses are aligned to the response: position 0 is the first response token
  (slice the trainer's log-probs from the prompt length on), right padding after EOS.
  logp / old_logp / ref_logp are (B, T) log-probs of the sampled tokens under the policy being
  trained / the policy that sampled them / the frozen reference model.
- mask m (B, T), bool or 0/1 float: 1 for every sampled token up to and including EOS; |y_i| =
  sum_t m_t. Padding may hold anything, even -inf: it is selected away with `where`, never
  multiplied by 0 (-inf * 0 = NaN).
- adv is (B,) per sequence or (B, T) per token; a (B,) advantage is broadcast over the tokens.
- d_t = logp_t - old_logp_t, r_t = exp(d_t). Normalisers count the whole rollout batch: on a
  micro-batch pass n_tokens (global response-token count) and n_seqs (global sequence count);
  they default to this batch's own counts. Summing the micro-batch losses then gives the loss
  of the full batch.
"""
from collections import namedtuple

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------- reductions, log-probs

def masked_sum(x, mask, dim=None):
    """Sum of x where mask is set (whole tensor, or along dim)."""
    x = torch.where(mask.bool(), x, 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean of x over the masked entries; an empty selection gives 0, not NaN."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def response_logps(logits, input_ids, response_mask, temperature=1.0):
    """Log-probs of the sampled tokens under the tempered fp32 softmax -> (logp, mask), both (B, T-1).

    logits (B, T, V) at position t score token t+1, so logp[:, j] = log p(input_ids[:, j+1]) and
    mask = response_mask[:, 1:] (the labels are masked, not the inputs). Masked entries are 0."""
    mask = response_mask[:, 1:]                                      # (B, T-1)
    return token_logps(logits[:, :-1], input_ids[:, 1:], mask, temperature), mask


def token_logps(logits, labels, mask, temperature=1.0):
    """(B, T) log-probs of labels (B, T) under the tempered fp32 softmax of the logits (B, T, V) that
    score them (already shifted); 0 where mask is 0."""
    labels = torch.where(mask.bool(), labels, 0)                     # (B, T) a valid index at padding
    z = logits.float() / temperature                                 # (B, T, V)
    logp = z.gather(-1, labels[..., None]).squeeze(-1) - z.logsumexp(-1)  # (B, T)
    return torch.where(mask.bool(), logp, 0.0)


def token_entropy(logits, temperature=1.0):
    """(B, T) entropy of the tempered fp32 softmax at every position; the caller masks it."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)       # (B, T, V)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)              # 0 * -inf would be NaN

# ----------------------------------------------------------------------------- advantages, KL

def group_advantages(rewards, kind="std", eps=1e-6):
    """(P, G) rewards of P groups of G samples -> (P, G) advantages. All-equal groups get exactly 0.

    "std":  (R - mean_g) / (std_g + eps), population std (divide by G) (GRPO, Shao et al. 2024).
            TRL uses the sample std (divide by G-1) and eps 1e-4.
    "mean": R - mean_g (Dr. GRPO, Liu et al. 2025).
    "rloo": R_i - mean_{j != i} R_j = G/(G-1) * (R_i - mean_g) (RLOO, Ahmadian et al. 2024)."""
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    G = rewards.shape[-1]
    centred = rewards - rewards.mean(-1, keepdim=True)               # (P, G)
    if kind == "std":
        adv = centred / (rewards.std(-1, correction=0, keepdim=True) + eps)
    elif kind == "mean":
        adv = centred
    elif kind == "rloo":
        if G < 2:
            raise ValueError("rloo advantages need a group size of at least 2")
        adv = centred * G / (G - 1)
    else:
        raise ValueError(f"unknown advantage kind {kind!r}; valid: 'std', 'mean', 'rloo'")
    same = (rewards == rewards[..., :1]).all(-1, keepdim=True)       # (P, 1) no signal, no NaN
    return torch.where(same, 0.0, adv)


@torch.no_grad()
def gae(rewards, values, mask, gamma, lam):
    """Generalised advantage estimation (Schulman et al. 2016) -> (adv, returns), both (B, T).

    delta_t = r_t + gamma*V_{t+1} - V_t, A_t = delta_t + gamma*lam*A_{t+1}; the value (and the
    advantage) after the last response token is 0. returns = A + V. Padding gives 0."""
    m = mask.bool()
    adv = torch.zeros_like(values)                                   # (B, T)
    next_adv = torch.zeros_like(values[:, 0])                        # (B,)
    next_value = torch.zeros_like(values[:, 0])                      # (B,)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = torch.where(m[:, t], delta + gamma * lam * next_adv, 0.0)
        next_value = torch.where(m[:, t], values[:, t], 0.0)
        adv[:, t] = next_adv
    return adv, torch.where(m, adv + values, 0.0)


def kl_estimate(logp, ref_logp, kind="k3"):
    """Per-token sample estimate of KL(pi || pi_ref), x = ref_logp - logp (Schulman 2020,
    "Approximating KL divergence"): k1 = -x, k2 = x^2/2, k3 = exp(x) - x - 1 (unbiased, >= 0).
    x is clamped to [-20, 20] first, as verl does: in fp32 exp(x) overflows to inf past x ~ 88.7;
    beyond the clamp the estimate stays finite and has no gradient."""
    x = (ref_logp - logp).clamp(-20.0, 20.0)
    if kind == "k1":
        return -x
    if kind == "k2":
        return 0.5 * x * x
    if kind == "k3":
        return torch.expm1(x) - x
    raise ValueError(f"unknown KL estimator {kind!r}; valid: 'k1', 'k2', 'k3'")


@torch.no_grad()
def kl_in_reward(score, logp, ref_logp, mask, beta):
    """(B, T) per-token rewards for PPO/REINFORCE: -beta*k1 on every response token, plus the (B,)
    sequence score on the last response token. Maximising their sum maximises E[R] - beta*KL."""
    m = mask.bool()
    rewards = torch.where(m, -beta * kl_estimate(logp, ref_logp, "k1"), 0.0)  # (B, T)
    last = (m.sum(1) - 1).clamp_min(0)                               # (B,) right padding
    rows = torch.arange(m.shape[0], device=m.device)
    rewards[rows, last] += torch.where(m.any(1), score.to(rewards.dtype), 0.0)
    return rewards


def prefix_prob(logp):
    """(B, T) the policy's probability of the tokens sampled before each position,
    pi(y_<t | x) = exp(sum_{j<t} logp_j): 1 at the first response token."""
    return torch.exp(F.pad(logp, (1, 0))[:, :-1].cumsum(1))


def masked_var(x, mask):
    """Population variance of x over the masked entries (0-d)."""
    return masked_mean((x - masked_mean(x, mask)) ** 2, mask)


def whiten(x, mask, mean=None, var=None, eps=1e-8):
    """(B, T) advantages normalised to mean 0 and std 1 over the masked tokens (PPO's whitening);
    padding stays 0. mean / var (population) default to this batch's; under DDP pass every rank's."""
    m = mask.bool()
    mean = masked_mean(x, m) if mean is None else mean
    var = masked_var(x, m) if var is None else torch.as_tensor(var, dtype=x.dtype)
    return torch.where(m, (x - mean) * torch.rsqrt(var + eps), 0.0)


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 = the value head predicts
    the returns exactly, 0 = no better than their mean, < 0 = worse."""
    return 1 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp_min(1e-8)


def adaptive_beta(beta, kl, target, n, horizon=10000):
    """Adaptive KL controller (Ziegler et al. 2019): beta *= 1 + clip(kl/target - 1, -0.2, 0.2) * n/horizon,
    n = samples in this step. KL above the target raises beta, below lowers it."""
    return beta * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)


def cliff_advantages(rewards, first_wrong, mask, lam=0.0):
    """CLIFF token advantages (2025) -> (P, G, T), from binary rewards (P, G), first_wrong (P, G)
    (index of a wrong response's first wrong token, -1 for none) and mask (P, G, T).

    mu, sd = mean and population std of the group's 0/1 rewards; a_good = (1-mu)/sd, a_bad = -mu/sd.
    A correct response gets a_good on every token; a wrong one lam*a_good before its first wrong
    token and a_bad from it on (-1 on a wrong response: a_bad everywhere). Then each group is
    centred by its masked token mean. All-equal groups get 0."""
    if not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError("cliff_advantages needs binary 0/1 rewards (use the exact-match verifier)")
    m = mask.bool()
    rewards = rewards.float()
    mu = rewards.mean(-1, keepdim=True)                              # (P, 1)
    sd = rewards.std(-1, correction=0, keepdim=True)                 # (P, 1)
    live = sd > 0                                                    # (P, 1) groups with signal
    sd = torch.where(live, sd, 1.0)
    a_good, a_bad = ((1 - mu) / sd)[..., None], (-mu / sd)[..., None]  # (P, 1, 1)
    t = torch.arange(m.shape[-1], device=m.device)                   # (T,)
    before = t < first_wrong.clamp_min(0)[..., None]                 # (P, G, T)
    adv = torch.where(rewards[..., None] == 1, a_good, torch.where(before, lam * a_good, a_bad))
    adv = adv - masked_mean(adv.expand(m.shape), m, dim=(1, 2))[:, None, None]  # (P, G, T)
    return torch.where(m & live[..., None], adv, 0.0)


def gapo_eps_high(c, G, eps_low, eps_high_max):
    """GAPO's upper clip for a group with c of G correct: eps_low + (eps_high_max-eps_low)*(G-c)/(G-1)."""
    return eps_low + (eps_high_max - eps_low) * (G - c) / (G - 1)


def sequence_ratio(logp, old_logp, mask):
    """(B,) GSPO sequence ratio s_i = exp(sum_t m*d_t / |y_i|), a geometric mean of token ratios."""
    return torch.exp(masked_mean(logp - old_logp, mask, dim=1))


def clip_objective(ratio, adv, eps_low, eps_high, clip_c=None):
    """PPO clip term (Schulman et al. 2017) -> (obj, low, high):
    obj = min(r*A, clip(r, 1-eps_low, 1+eps_high)*A); with dual-clip (Ye et al. 2020) for A < 0 it
    is at least clip_c*A. low/high flag where the clip is active (gradient cut) on either side."""
    clipped = ratio.clamp(min=1 - eps_low).clamp(max=1 + eps_high)     # eps may be per-sequence tensors
    obj = torch.minimum(ratio * adv, clipped * adv)
    low = (adv < 0) & (ratio < 1 - eps_low)
    high = (adv > 0) & (ratio > 1 + eps_high)
    if clip_c is not None:
        dual = (adv < 0) & (obj < clip_c * adv)
        obj, high = torch.where(dual, clip_c * adv, obj), high | dual
    return obj, low, high

# ----------------------------------------------------------------------------- policy losses

def resolve_hparams(name, **overrides):
    """ALGOS[name].defaults with the non-None overrides applied. None means "the loss's default", so a None
    for a knob this loss lacks is ignored (a config can pass all its fields); other unknowns fail."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown loss {name!r}; valid: {', '.join(DEFAULTS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for k in overrides.keys() - DEFAULTS[name].keys():
        raise ValueError(f"loss {name!r} has no hyperparameter {k!r}; it takes {', '.join(DEFAULTS[name])}")
    return {**DEFAULTS[name], **overrides}


def _prep(logp, old_logp, adv, mask, ref_logp):
    """Bool mask, padding zeroed (so -inf there cannot make NaN), constants detached, adv -> (B, T)."""
    m = mask.bool()
    logp = torch.where(m, logp, 0.0)
    old_logp = torch.where(m, old_logp.detach(), 0.0)
    ref_logp = None if ref_logp is None else torch.where(m, ref_logp.detach(), 0.0)
    adv = (adv[:, None] if adv.dim() == 1 else adv).detach().expand(m.shape)  # (B, T)
    return m, logp, old_logp, adv, ref_logp


def _kl_penalty(name, logp, ref_logp, hp):
    """(B, T) beta * KL estimate, the in-loss KL term (zeros when beta is 0)."""
    if hp["beta"] == 0:
        return torch.zeros_like(logp)
    if ref_logp is None:
        raise ValueError(f"{name} with beta={hp['beta']} needs ref_logp")
    return hp["beta"] * kl_estimate(logp, ref_logp, hp["kl_estimator"])


@torch.no_grad()
def _stats(ratio, m, low, high, logp, ref_logp, kind="k3"):
    """Detached 0-d diagnostics: clip fractions over response tokens, ratio mean/max, KL to ref."""
    stats = dict(clipfrac_low=masked_mean(low.float(), m), clipfrac_high=masked_mean(high.float(), m),
                 ratio_mean=masked_mean(ratio, m), ratio_max=torch.where(m, ratio, 0.0).max())
    if ref_logp is not None:
        stats["kl"] = masked_mean(kl_estimate(logp, ref_logp, kind), m)
    return stats


def _n(count, default):
    return default if count is None else count


def reinforce(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """REINFORCE with a baseline (Williams 1992): objective A * sum_t logp_t, on-policy (one update
    per rollout). Divides the sum of the sequences' token sums by n_seqs. KL, if any, goes into the
    reward (kl_in_reward), not into this loss."""
    hp = resolve_hparams("reinforce", **hp)
    m, logp, old_logp, adv, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    loss = -masked_sum(adv * logp, m) / _n(n_seqs, m.shape[0])
    no = torch.zeros_like(m)
    return loss, _stats(torch.exp(logp - old_logp), m, no, no, logp, ref_logp)


def rloo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """RLOO (Ahmadian et al. 2024): REINFORCE with the leave-one-out advantage (group_advantages
    kind "rloo"); objective A * sum_t logp_t, divided by n_seqs."""
    hp = resolve_hparams("rloo", **hp)
    return reinforce(logp, old_logp, adv, mask, ref_logp, n_tokens, n_seqs, **hp)


def _clipped_tokens(name, logp, old_logp, adv, mask, ref_logp, hp):
    """Per-token clip_obj - beta*KL shared by grpo, dr_grpo, dapo, cliff -> (obj (B, T), m, hp, stats)."""
    hp = resolve_hparams(name, **hp)
    m, logp, old_logp, adv, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    ratio = torch.exp(logp - old_logp)                               # (B, T)
    obj, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], hp["clip_c"])
    obj = obj - _kl_penalty(name, logp, ref_logp, hp)                # (B, T)
    return obj, m, hp, _stats(ratio, m, low, high, logp, ref_logp, hp["kl_estimator"])


def grpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """GRPO (Shao et al. 2024, DeepSeekMath): clip_obj - beta*k3 per token, eps 0.2, beta 0.04.
    Each sequence's token sum is divided by its length |y_i|, then the total by n_seqs."""
    obj, m, hp, stats = _clipped_tokens("grpo", logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_mean(obj, m, dim=1).sum() / _n(n_seqs, m.shape[0]), stats


def ppo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, values=None, old_values=None,
        returns=None, entropy=None, **hp):
    """PPO (Schulman et al. 2017) as in InstructGPT (Ouyang et al. 2022): adv are (B, T) whitened GAE
    advantages of per-token rewards -beta*k1 + the score on the last token (kl_in_reward, gae, whiten:
    the KL lives in the reward, not here). Per token:
        clip_obj - vf_coef * 0.5*(V - ret)^2 + ent_coef * entropy
    with value clipping (vf_clip > 0, PPO2): the larger of the errors of V and of old_V + clip(V - old_V,
    +-vf_clip). values (B, T) carry the value head's gradient; old_values, returns (B, T) are constants.
    The token sum is divided by n_tokens. Stats add value_loss and approx_kl = mean 0.5*(logp - old)^2."""
    hp = resolve_hparams("ppo", **hp)
    m, logp, old_logp, adv, _ = _prep(logp, old_logp, adv, mask, None)
    ratio = torch.exp(logp - old_logp)                               # (B, T)
    pg, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], hp["clip_c"])
    old_values, returns = old_values.detach(), returns.detach()
    err = (values - returns) ** 2                                    # (B, T)
    if hp["vf_clip"]:
        v_clip = old_values + (values - old_values).clamp(-hp["vf_clip"], hp["vf_clip"])
        err = torch.maximum(err, (v_clip - returns) ** 2)
    vf = 0.5 * err                                                   # (B, T)
    obj = pg - hp["vf_coef"] * vf + (hp["ent_coef"] * entropy if hp["ent_coef"] else 0.0)
    n = _n(n_tokens, m.sum().clamp_min(1))
    stats = _stats(ratio, m, low, high, logp, None)
    stats.update(value_loss=masked_sum(vf.detach(), m) / n, approx_kl=masked_mean(0.5 * (logp - old_logp).detach() ** 2, m))
    return -masked_sum(obj, m) / n, stats


def dr_grpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """Dr. GRPO (Liu et al. 2025): clip_obj with mean-centred advantages and no KL. The token sum
    is divided by the constant n_seqs * max_new_tokens, so no length bias."""
    obj, m, hp, stats = _clipped_tokens("dr_grpo", logp, old_logp, adv, mask, ref_logp, hp)
    if hp["max_new_tokens"] is None:
        raise ValueError("dr_grpo needs max_new_tokens (its constant normaliser)")
    return -masked_sum(obj, m) / (_n(n_seqs, m.shape[0]) * hp["max_new_tokens"]), stats


def dapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """DAPO (Yu et al. 2025): clip_obj with clip-higher (eps_low 0.2, eps_high 0.28), no KL. The
    token sum is divided by n_tokens, all response tokens of the batch. (Dynamic sampling and
    overlong shaping happen in the rollout, not here.)"""
    obj, m, hp, stats = _clipped_tokens("dapo", logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_sum(obj, m) / _n(n_tokens, m.sum().clamp_min(1)), stats


def cliff(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """CLIFF (2025): GRPO's clip_obj - beta*k3 with the (B, T) token advantages of
    cliff_advantages. Divides like GRPO: per-sequence token mean, then by n_seqs."""
    obj, m, hp, stats = _clipped_tokens("cliff", logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_mean(obj, m, dim=1).sum() / _n(n_seqs, m.shape[0]), stats


def _sequence_clip(name, logp, old_logp, adv, mask, ref_logp, n_seqs, hp, eps_high):
    """Sequence-ratio clip_obj - beta*(per-sequence mean KL), summed and divided by n_seqs."""
    if adv.dim() != 1:
        raise ValueError(f"{name} needs a per-sequence advantage of shape (B,)")
    m, logp, old_logp, _, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    s = sequence_ratio(logp, old_logp, m)                            # (B,) grad s_i/|y_i| per token
    obj, low, high = clip_objective(s, adv.detach(), hp["eps_low"], eps_high, hp["clip_c"])
    obj = obj - masked_mean(_kl_penalty(name, logp, ref_logp, hp), m, dim=1)  # (B,)
    stats = _stats(torch.exp(logp - old_logp), m, low[:, None].expand(m.shape),
                   high[:, None].expand(m.shape), logp, ref_logp, hp["kl_estimator"])
    return -obj.sum() / _n(n_seqs, m.shape[0]), stats


def gspo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """GSPO (Zheng et al. 2025): min(s*A, clip(s, 1-eps_low, 1+eps_high)*A) with the sequence ratio
    s_i = exp(sum_t m*d_t/|y_i|); eps 3e-4/4e-4. The sum over sequences is divided by n_seqs.
    Clip fractions count the tokens of clipped sequences."""
    hp = resolve_hparams("gspo", **hp)
    return _sequence_clip("gspo", logp, old_logp, adv, mask, ref_logp, n_seqs, hp, hp["eps_high"])


def gapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, *,
         group_correct, group_size, **hp):
    """GAPO (2025): GSPO's sequence-ratio clip with an upper clip that depends on the group:
    eps_high = gapo_eps_high(c, G, eps_low, eps_high) for c = group_correct (B,) of G = group_size
    (the hparam eps_high is eps_high_max); mean-centred advantages, groups with c in {0, G} give 0.
    The sum over sequences is divided by n_seqs (= mean over sequences, then groups, as all groups
    have G members)."""
    hp = resolve_hparams("gapo", **hp)
    c = torch.as_tensor(group_correct, dtype=torch.float32, device=logp.device)  # (B,)
    if group_size < 2 or ((c < 0) | (c > group_size) | (c != c.round())).any():
        raise ValueError(f"gapo needs binary rewards: group_correct must be integer counts in "
                         f"[0, group_size={group_size}] (group_size >= 2), got {c.tolist()}")
    adv = torch.where((c > 0) & (c < group_size), adv, 0.0)          # (B,) no signal in all-equal groups
    eps_high = gapo_eps_high(c, group_size, hp["eps_low"], hp["eps_high"])  # (B,)
    return _sequence_clip("gapo", logp, old_logp, adv, mask, ref_logp, n_seqs, hp, eps_high)


def sapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """SAPO (Gao et al. 2025, Qwen): soft gate instead of a clip, objective (4/tau)*sigmoid(tau*(r-1))*A
    with tau = tau_pos (1.0) where A > 0, else tau_neg (1.05); equals r*A to first order at r = 1.
    Per-sequence token mean, then divided by n_seqs. Nothing is hard-clipped: clip fractions are 0."""
    hp = resolve_hparams("sapo", **hp)
    m, logp, old_logp, adv, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    ratio = torch.exp(logp - old_logp)                               # (B, T)
    tau = torch.where(adv > 0, hp["tau_pos"], hp["tau_neg"])         # (B, T)
    obj = 4 / tau * torch.sigmoid(tau * (ratio - 1)) * adv - _kl_penalty("sapo", logp, ref_logp, hp)
    no = torch.zeros_like(m)
    stats = _stats(ratio, m, no, no, logp, ref_logp, hp["kl_estimator"])
    return -masked_mean(obj, m, dim=1).sum() / _n(n_seqs, m.shape[0]), stats


def cispo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """CISPO (MiniMax-M1, 2025): sg(min(r, eps_max)) * A * logp, the importance weight capped from
    above but never blocking the gradient (eps_max 5.0 as in ScaleRL, 2025). The token sum is
    divided by n_tokens. clipfrac_high counts capped tokens (their gradient still flows)."""
    hp = resolve_hparams("cispo", **hp)
    m, logp, old_logp, adv, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    ratio = torch.exp(logp - old_logp)                               # (B, T)
    w = ratio.clamp(max=hp["eps_max"]).detach()                      # (B, T)
    obj = w * adv * logp - _kl_penalty("cispo", logp, ref_logp, hp)
    stats = _stats(ratio, m, torch.zeros_like(m), ratio > hp["eps_max"], logp, ref_logp,
                   hp["kl_estimator"])
    return -masked_sum(obj, m) / _n(n_tokens, m.sum().clamp_min(1)), stats


def pnpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """PNPO (2025): no-grad prefix weight w_t = exp(cumsum(m*d)_t / t), t = 1 at the first response
    token; a token counts only if 1 - eps_low*h_t <= w_t <= 1 + eps_high*h_t, h_t = sqrt(|y_i|/t);
    objective gate*w*A*logp, eps 7e-4/9.5e-4. Per-sequence token mean (over |y_i|, not over the
    accepted tokens), then divided by n_seqs."""
    hp = resolve_hparams("pnpo", **hp)
    m, logp, old_logp, adv, ref_logp = _prep(logp, old_logp, adv, mask, ref_logp)
    with torch.no_grad():
        d = logp - old_logp                                          # (B, T) 0 at padding
        t = torch.arange(1, m.shape[1] + 1, device=m.device)         # (T,)
        w = torch.exp(d.cumsum(1) / t)                               # (B, T)
        h = torch.sqrt(m.sum(1, keepdim=True) / t)                   # (B, T)
        low, high = w < 1 - hp["eps_low"] * h, w > 1 + hp["eps_high"] * h
    obj = torch.where(low | high, 0.0, w * adv * logp) - _kl_penalty("pnpo", logp, ref_logp, hp)
    stats = _stats(torch.exp(d), m, low, high, logp, ref_logp, hp["kl_estimator"])
    return -masked_mean(obj, m, dim=1).sum() / _n(n_seqs, m.shape[0]), stats


# ----------------------------------------------------------------------------- preference losses
# Inputs are sequence sums of response log-probs (B,): the policy's with grad, the frozen reference's
# without. Both losses are means over the batch (pairs for DPO/IPO, labelled answers for KTO).

def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta=0.1, kind="sigmoid", label_smoothing=0.0,
             rpo_alpha=0.0, chosen_len=None):
    """DPO (Rafailov et al. 2023) on the log-ratio margin m = (pi_c - ref_c) - (pi_r - ref_r):
      sigmoid: -(1-eps) log sigmoid(beta*m) - eps log sigmoid(-beta*m); eps = label_smoothing
               (conservative DPO, Mitchell 2023: optimum at beta*m = logit(1-eps); eps 0 = plain DPO)
      ipo:     (m - 1/(2*beta))^2 (IPO, Azar et al. 2023: optimum at m = 1/(2*beta)).
    rpo_alpha > 0 adds rpo_alpha * (-pi_c / |y_c|), the chosen answer's per-token NLL (RPO, Pang et
    al. 2024), which stops DPO from lowering the chosen answers' likelihood along with the rejected
    ones; chosen_len (B,) gives |y_c|. Mean over pairs. Stats: implicit rewards beta*(pi - ref) of
    chosen/rejected, beta*m, and the fraction of pairs whose chosen reward is higher."""
    chosen, rejected = pi_chosen - ref_chosen, pi_rejected - ref_rejected  # (B,) log-ratios
    m = chosen - rejected                                                   # (B,)
    if kind == "sigmoid":
        per_pair = -(1 - label_smoothing) * F.logsigmoid(beta * m) - label_smoothing * F.logsigmoid(-beta * m)
    elif kind == "ipo":
        per_pair = (m - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO kind {kind!r}; valid: sigmoid, ipo")
    if rpo_alpha:
        per_pair = per_pair - rpo_alpha * pi_chosen / chosen_len
    stats = {"chosen_reward": (beta * chosen).mean().detach(), "rejected_reward": (beta * rejected).mean().detach(),
             "margin": (beta * m).mean().detach(), "pair_accuracy": (m > 0).float().mean()}
    return per_pair.mean(), stats


def kto_loss(pi_logp, ref_logp, desirable, pi_mismatch, ref_mismatch, beta=0.1, lambda_d=1.0, lambda_u=1.0,
             rpo_alpha=0.0, length=None):
    """KTO (Ethayarajh et al. 2024). r = pi - ref per answer (B,); the reference point
    z = max(0, mean_j(pi_mismatch_j - ref_mismatch_j)) over mismatched pairs (x_i, y_j), j != i,
    detached; desirable answers lose lambda_d*(1 - sigmoid(beta*(r - z))), undesirable ones
    lambda_u*(1 - sigmoid(beta*(z - r))). rpo_alpha > 0 adds rpo_alpha * (-pi / |y|) on desirable
    answers, their per-token NLL as RPO adds it to DPO; length (B,) gives |y|. Mean over the batch
    (B answers)."""
    r = pi_logp - ref_logp                                                  # (B,)
    z = (pi_mismatch - ref_mismatch).mean().clamp_min(0).detach()           # () reference point
    d = desirable.bool()
    per = torch.where(d, lambda_d * (1 - torch.sigmoid(beta * (r - z))), lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    if rpo_alpha:
        per = per - rpo_alpha * torch.where(d, pi_logp / length, 0.0)
    rew = (beta * r).detach()
    stats = {"z": z, "desirable_reward": rew[d].mean() if d.any() else torch.tensor(0.0),
             "undesirable_reward": rew[~d].mean() if (~d).any() else torch.tensor(0.0)}
    return per.mean(), stats


def bt_loss(s_chosen, s_rejected):
    """Bradley-Terry reward-model loss -log sigmoid(s_chosen - s_rejected), mean over pairs (B,),
    scores read at the EOS position. Stats: pair accuracy (chosen scored higher) and the mean margin."""
    d = s_chosen - s_rejected                                               # (B,)
    return -F.logsigmoid(d).mean(), {"pair_accuracy": (d > 0).float().mean(), "margin": d.mean().detach()}


# ----------------------------------------------------------------------------- supervised baselines
# The question every RL result must answer: does it beat plain supervised training on the same budget?

def nll_loss(logp, mask, n_tokens=None):
    """Mean per-token negative log-likelihood of the response tokens (answer + EOS):
    -sum_t m*logp / n_tokens, n_tokens = every response token of the batch (default: this batch's).
    Continued SFT feeds it the gold answers of train problems; rejection-sampling fine-tuning (RFT,
    Yuan et al. 2023) the policy's own samples that the verifier accepted."""
    m = mask.bool()
    loss = -masked_sum(logp, m) / _n(n_tokens, m.sum().clamp_min(1))
    return loss, {"nll": loss.detach()}


# ----------------------------------------------------------------------------- the table of algorithms
# One row per --loss=NAME: its function; its family ("pg": policy gradient on rollouts, "pref": preference
# pairs, "sft": a supervised baseline, rl.py --loss=sft on gold answers, rft on verified samples); the
# advantage rl.py gives it (a group_advantages kind, "cliff": cliff_advantages, "gae": PPO's); DAPO's
# overlong shaping window in tokens (0 = off); and its hyperparameters at the papers' values, kept only
# here (None = off, as clip_c, or given by rl.py, as dr_grpo's max_new_tokens).
Algo = namedtuple("Algo", "fn family advantage overlong defaults")
_CLIP = dict(eps_low=0.2, eps_high=0.2, kl_estimator="k3", clip_c=None)
# rpo_alpha 1 (RPO's NLL on the chosen / desirable answers) rather than the papers' 0: without it, on the
# offline pairs DPO lowered the chosen answers' likelihood along with the rejected ones and lost 15 points
# here, IPO 3 and KTO 18 (docs/results.md). IPO's beta 0.5 (target margin 1/(2*beta) = 1 nat, not 5):
# at 0.1 its squared loss outweighs the NLL and it still lost 3 points.
ALGOS = {
    "reinforce": Algo(reinforce, "pg", "mean", 0, dict(beta=0.0)),  # beta: the KL-in-reward coefficient
    "rloo": Algo(rloo, "pg", "rloo", 0, dict(beta=0.0)),
    # beta: k1 KL in the reward (kl_target set = adaptive); gamma/lam: GAE; vf_lr_mult: the value head's lr
    "ppo": Algo(ppo, "pg", "gae", 0, dict(eps_low=0.2, eps_high=0.2, clip_c=None, vf_coef=0.1, vf_clip=0.2,
                                          ent_coef=0.0, beta=0.05, kl_target=None, gamma=1.0, lam=0.95,
                                          vf_lr_mult=10.0)),
    "grpo": Algo(grpo, "pg", "std", 0, dict(_CLIP, beta=0.04)),
    "dr_grpo": Algo(dr_grpo, "pg", "mean", 0, dict(_CLIP, beta=0.0, max_new_tokens=None)),
    "dapo": Algo(dapo, "pg", "std", 2, dict(_CLIP, eps_high=0.28, beta=0.0)),
    "gspo": Algo(gspo, "pg", "std", 0, dict(_CLIP, eps_low=3e-4, eps_high=4e-4, beta=0.0)),
    "sapo": Algo(sapo, "pg", "std", 0, dict(tau_pos=1.0, tau_neg=1.05, beta=0.0, kl_estimator="k3")),
    "cispo": Algo(cispo, "pg", "std", 0, dict(eps_max=5.0, beta=0.0, kl_estimator="k3")),
    "gapo": Algo(gapo, "pg", "mean", 0, dict(_CLIP, eps_low=0.003, eps_high=0.005, beta=0.0)),  # eps_high_max
    "pnpo": Algo(pnpo, "pg", "std", 0, dict(eps_low=7e-4, eps_high=9.5e-4, beta=0.0, kl_estimator="k3")),
    "cliff": Algo(cliff, "pg", "cliff", 0, dict(_CLIP, beta=0.04)),
    "dpo": Algo(dpo_loss, "pref", None, 0, dict(beta=0.1, kind="sigmoid", label_smoothing=0.0, rpo_alpha=1.0)),
    "ipo": Algo(dpo_loss, "pref", None, 0, dict(beta=0.5, kind="ipo", rpo_alpha=1.0)),
    "kto": Algo(kto_loss, "pref", None, 0, dict(beta=0.1, lambda_d=1.0, lambda_u=1.0, rpo_alpha=1.0)),
    "sft": Algo(nll_loss, "sft", None, 0, {}),
    "rft": Algo(nll_loss, "sft", None, 0, {}),
}
DEFAULTS = {n: a.defaults for n, a in ALGOS.items()}
LOSSES = {n: a.fn for n, a in ALGOS.items() if a.family == "pg"}  # the families, as rl.py and compare.py
PREF_LOSSES = {n: a.fn for n, a in ALGOS.items() if a.family == "pref"}  # ask for them
BASELINES = {n: a.fn for n, a in ALGOS.items() if a.family == "sft"}
