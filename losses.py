"""Losses, advantages and KL estimators for RL post-training, as pure tensor functions;
rl.py --loss=NAME runs the row ALGOS[NAME]. Every loss is *minimised* (loss = -objective) and
returns (loss, stats). Conventions:
- Tensors are aligned to the response: position 0 is the first response token, right padding
  after EOS. logp / old_logp / ref_logp: (B, T) log-probs of the sampled tokens under the policy
  being trained / the policy that sampled them / the frozen reference model.
- mask m (B, T), bool or 0/1: 1 for every sampled token up to and including EOS; |y_i| = sum_t m_t.
  Padding may hold anything, even -inf: it is selected away with `where`, never multiplied by 0.
- adv: (B,) per sequence (broadcast over the tokens) or (B, T) per token.
- d_t = logp_t - old_logp_t, r_t = exp(d_t). Normalisers count the whole rollout batch: a
  micro-batch gets n_tokens and n_seqs, the global response-token and sequence counts (default:
  its own), so the micro-batch losses sum to the full batch's.
- **hp: the loss's full hyperparameters, resolve_hparams(name, ...), resolved once by rl.py.
"""
import math
from collections import namedtuple

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------- reductions, log-probs

def masked_sum(x, mask, dim=None):
    """Sum of x where mask is set (whole tensor, or along dim)."""
    x = torch.where(mask.bool(), x, 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x, mask, dim=None):
    """Mean of x over the masked entries; an empty selection gives 0, not NaN."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def response_logps(logits, input_ids, response_mask, temperature=1.0):
    """(logp, mask), both (B, T-1): logits (B, T, V) at t score token t+1; masked entries are 0."""
    mask = response_mask[:, 1:]                                      # (B, T-1)
    return token_logps(logits[:, :-1], input_ids[:, 1:], mask, temperature), mask


def token_logps(logits, labels, mask, temperature=1.0):
    """(B, T) log-probs of labels under the tempered softmax of shifted logits (B, T, V), in fp32
    (float64 logits stay float64); 0 off the mask."""
    labels = torch.where(mask.bool(), labels, 0)                     # (B, T) valid at padding
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # (B, T, V) fp32+
    logp = z.gather(-1, labels[..., None]).squeeze(-1) - z.logsumexp(-1)  # (B, T)
    return torch.where(mask.bool(), logp, 0.0)


def token_entropy(logits, temperature=1.0):
    """(B, T) entropy of the tempered fp32 softmax at every position; the caller masks it."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)       # (B, T, V)
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)              # 0 * -inf would be NaN

# ---------------------------------------------------------------------- advantages, KL

def group_advantages(rewards, kind="std", eps=1e-6):
    """(P, G) rewards of P groups of G samples -> (P, G) advantages. All-equal groups get exactly 0.

    "std":  (R - mean_g) / (std_g + eps), population std (divide by G) (GRPO, Shao et al. 2024).
            TRL uses the sample std (divide by G-1) and eps 1e-4.
    "mean": R - mean_g (Dr. GRPO, Liu et al. 2025).
    "rloo": R_i - mean_{j != i} R_j = G/(G-1) * (R_i - mean_g) (RLOO, Ahmadian et al. 2024).
    "maxrl": (R - mean_g) / mean_g, 0 where mean_g <= 0: a prompt weighted by 1/p (MaxRL, 2026)."""
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
    elif kind == "maxrl":
        mean = rewards.mean(-1, keepdim=True)                        # (P, 1) the pass rate p
        adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)
    else:
        raise ValueError(f"unknown advantage kind {kind!r}; valid: 'std', 'mean', 'rloo', 'maxrl'")
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
    """Per-token estimate of KL(pi || pi_ref) (Schulman 2020): k1 = -x, k2 = x^2/2, k3 = exp(x)-x-1,
    x = ref_logp - logp clamped to [-20, 20] as in verl (fp32 exp(x) is inf past 88.7)."""
    x = (ref_logp - logp).clamp(-20.0, 20.0)
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator {kind!r}; valid: 'k1', 'k2', 'k3'")
    return {"k1": -x, "k2": 0.5 * x * x, "k3": torch.expm1(x) - x}[kind]


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
    """(B, T) pi(y_<t | x) = exp(sum_{j<t} logp_j): 1 at the first response token."""
    return torch.exp(F.pad(logp, (1, 0))[:, :-1].cumsum(1))


def masked_var(x, mask):
    """Population variance of x over the masked entries (0-d)."""
    return masked_mean((x - masked_mean(x, mask)) ** 2, mask)


def whiten(x, mask, mean=None, var=None, eps=1e-8):
    """(B, T) advantages normalised to mean 0 and std 1 over the masked tokens (PPO's whitening);
    padding stays 0. mean / var (population) default to this batch's; under DDP pass all ranks'."""
    m = mask.bool()
    mean = masked_mean(x, m) if mean is None else mean
    var = masked_var(x, m) if var is None else torch.as_tensor(var, dtype=x.dtype)
    return torch.where(m, (x - mean) * torch.rsqrt(var + eps), 0.0)


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 = exact, 0 = the mean."""
    return 1 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp_min(1e-8)


def adaptive_beta(beta, kl, target, n, horizon=10000):
    """Adaptive KL (Ziegler et al. 2019): beta *= 1 + clip(kl/target - 1, +-0.2) * n/horizon."""
    return beta * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)


def cliff_advantages(rewards, first_wrong, mask, lam=0.0):
    """CLIFF token advantages (2025) -> (P, G, T) from 0/1 rewards (P, G), first_wrong (P, G) (-1:
    none) and mask (P, G, T). With the group's mean mu and population std sd, a correct response
    gets a_good = (1-mu)/sd, a wrong one lam*a_good before its first wrong token and a_bad = -mu/sd
    from it on; each group is then centred by its masked token mean. All-equal groups get 0."""
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
    """GAPO's upper clip for c of G correct: eps_low + (eps_high_max - eps_low) * (G-c)/(G-1)."""
    return eps_low + (eps_high_max - eps_low) * (G - c) / (G - 1)


def sequence_ratio(logp, old_logp, mask):
    """(B,) GSPO sequence ratio s_i = exp(sum_t m*d_t / |y_i|), a geometric mean of token ratios."""
    return torch.exp(masked_mean(logp - old_logp, mask, dim=1))


def clip_objective(ratio, adv, eps_low, eps_high, clip_c=None):
    """PPO clip term (Schulman et al. 2017) -> (obj, low, high):
    obj = min(r*A, clip(r, 1-eps_low, 1+eps_high)*A); with dual-clip (Ye et al. 2020) for A < 0 it
    is at least clip_c*A. low/high flag where the clip is active (gradient cut) on either side."""
    clipped = ratio.clamp(min=1 - eps_low).clamp(max=1 + eps_high)  # eps: floats or (B,) tensors
    obj = torch.minimum(ratio * adv, clipped * adv)
    low = (adv < 0) & (ratio < 1 - eps_low)
    high = (adv > 0) & (ratio > 1 + eps_high)
    if clip_c is not None:
        dual = (adv < 0) & (obj < clip_c * adv)
        obj, high = torch.where(dual, clip_c * adv, obj), high | dual
    return obj, low, high


@torch.no_grad()
def rollout_weights(old_logp, mu_logp, mask, kind, cap=2.0, low=0.5, high=5.0):
    """Detached weights (B, T) of a rollout sampled by mu, trained from pi_old, and the fraction of
    tokens capped or masked (0-d); rho_t = exp(old_t - mu_t). "tis": min(rho_t, cap) (Yao et al. 2025;
    verl); "seq_tis": min(prod_t rho_t, cap) on each token of the sequence; "icepop": rho_t if low <=
    rho_t <= high, else 0 (arXiv 2510.18855); "decoupled": rho_t = pi_prox/mu, 0 above high (decoupled
    PPO, AReaL, arXiv 2505.24298: its clip is anchored at pi_prox, old_logp). Used as w*A: w >= 0 is
    constant, so min(r*wA, clip(r)*wA) = w*min(rA, clip(r)A), the normaliser unchanged."""
    m = mask.bool()
    x = torch.where(m, old_logp - mu_logp, 0.0)                      # (B, T)
    rho = torch.exp(x.sum(1, keepdim=True) if kind == "seq_tis" else x).expand(m.shape)  # (B, T)
    if kind in ("tis", "seq_tis"):
        cut, w = rho > cap, rho.clamp(max=cap)                       # (B, T) capped
    elif kind in ("icepop", "decoupled"):
        cut = (rho > high) | (rho < low) if kind == "icepop" else rho > high  # (B, T) masked
        w = torch.where(cut, 0.0, rho)
    else:
        raise ValueError(f"unknown rollout correction {kind!r}; valid: tis, seq_tis, icepop, decoupled")
    return w, masked_mean(cut.float(), m)


def teacher_advantages(old_logp, teacher_logp, mask, bound=10.0):
    """(B, T) on-policy distillation advantage A_t = -clamp(log pi_old_t - log pi_T_t, +-bound): minus
    the sampled token's reverse-KL term, dense credit with no reward; 0 off the mask."""
    return torch.where(mask.bool(), -(old_logp - teacher_logp).clamp(-bound, bound), 0.0)

# ---------------------------------------------------------------------- policy losses

def _prep(logp, old_logp, adv, mask, ref_logp=None, hp=None):
    """-> (m, logp, old_logp, ratio, adv, kl), all (B, T), padding zeroed (no -inf to make NaN),
    constants detached; kl = beta * kl_estimate, the in-loss KL term (0 without hp or at beta 0)."""
    m = mask.bool()
    logp = torch.where(m, logp, 0.0)
    old_logp = torch.where(m, old_logp.detach(), 0.0)
    adv = (adv[:, None] if adv.dim() == 1 else adv).detach().expand(m.shape)  # (B, T)
    kl = torch.zeros_like(logp)                                      # (B, T)
    if hp and hp["beta"]:
        if ref_logp is None:
            raise ValueError(f"an in-loss KL term (beta={hp['beta']}) needs ref_logp")
        ref_logp = torch.where(m, ref_logp.detach(), 0.0)
        kl = hp["beta"] * kl_estimate(logp, ref_logp, hp["kl_estimator"])
    return m, logp, old_logp, torch.exp(logp - old_logp), adv, kl


@torch.no_grad()
def _stats(ratio, m, low=None, high=None):
    """Detached 0-d ratio mean/max and fractions of tokens clipped low / high (None: no clip)."""
    no = torch.zeros_like(m)
    return dict(clipfrac_low=masked_mean((no if low is None else low).float(), m),
                clipfrac_high=masked_mean((no if high is None else high).float(), m),
                ratio_mean=masked_mean(ratio, m), ratio_max=torch.where(m, ratio, 0.0).max())


def reinforce(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """REINFORCE with a baseline (Williams 1992), on-policy: objective A * sum_t logp_t, summed over
    sequences and divided by n_seqs. Its KL (beta) goes into the reward (kl_in_reward)."""
    m, logp, _, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    return -masked_sum(adv * logp, m) / (n_seqs or m.shape[0]), _stats(ratio, m)


rloo = reinforce  # RLOO (Ahmadian et al. 2024): REINFORCE with the leave-one-out advantage


def _clipped_tokens(logp, old_logp, adv, mask, ref_logp, hp):
    """Per-token clip_obj - beta*KL of grpo, dr_grpo, dapo, cliff -> (obj (B, T), m, stats)."""
    m, logp, _, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    obj, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], hp["clip_c"])
    return obj - kl, m, _stats(ratio, m, low, high)


def grpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """GRPO (Shao et al. 2024, DeepSeekMath): clip_obj - beta*k3 per token, eps 0.2, beta 0.04.
    Each sequence's token sum is divided by its length |y_i|, then the total by n_seqs."""
    obj, m, stats = _clipped_tokens(logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_mean(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), stats


cliff = grpo  # CLIFF (2025): GRPO on the (B, T) token advantages of cliff_advantages


def dr_grpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """Dr. GRPO (Liu et al. 2025): clip_obj with mean-centred advantages and no KL. The token sum
    is divided by the constant n_seqs * max_new_tokens, so no length bias."""
    if hp["max_new_tokens"] is None:
        raise ValueError("dr_grpo needs max_new_tokens (its constant normaliser)")
    obj, m, stats = _clipped_tokens(logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_sum(obj, m) / ((n_seqs or m.shape[0]) * hp["max_new_tokens"]), stats


def dapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """DAPO (Yu et al. 2025): clip_obj with clip-higher (eps_low 0.2, eps_high 0.28), no KL; the
    token sum is divided by n_tokens. Dynamic sampling and overlong shaping live in rl.py."""
    obj, m, stats = _clipped_tokens(logp, old_logp, adv, mask, ref_logp, hp)
    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), stats


def ppo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, values=None,
        old_values=None, returns=None, entropy=None, **hp):
    """PPO (Schulman et al. 2017) as in InstructGPT (Ouyang et al. 2022), per token
    clip_obj - vf_coef * 0.5*err + ent_coef * entropy, err = (V - ret)^2 or, with vf_clip > 0
    (PPO2), the larger of it and (old_V + clip(V - old_V, +-vf_clip) - ret)^2. adv: (B, T) whitened
    GAE advantages of rewards that hold the KL (kl_in_reward). Token sum divided by n_tokens."""
    m, logp, old_logp, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    pg, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], hp["clip_c"])
    old_values, returns = old_values.detach(), returns.detach()
    err = (values - returns) ** 2                                    # (B, T)
    if hp["vf_clip"]:
        v_clip = old_values + (values - old_values).clamp(-hp["vf_clip"], hp["vf_clip"])
        err = torch.maximum(err, (v_clip - returns) ** 2)
    vf = 0.5 * err                                                   # (B, T)
    obj = pg - hp["vf_coef"] * vf + (hp["ent_coef"] * entropy if hp["ent_coef"] else 0.0)
    n = n_tokens or m.sum().clamp_min(1)
    stats = dict(_stats(ratio, m, low, high), value_loss=masked_sum(vf.detach(), m) / n,
                 approx_kl=masked_mean(0.5 * (logp - old_logp).detach() ** 2, m))
    return -masked_sum(obj, m) / n, stats


def gspo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """GSPO (Zheng et al. 2025): min(s*A, clip(s, 1-eps_low, 1+eps_high)*A) - beta*mean_t KL, with
    the sequence ratio s_i = exp(sum_t m*d_t/|y_i|), eps 3e-4/4e-4; summed and divided by n_seqs.
    Clip fractions count the tokens of clipped sequences."""
    if adv.dim() != 1:
        raise ValueError("gspo and gapo need a per-sequence advantage of shape (B,)")
    m, logp, old_logp, ratio, _, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    s = sequence_ratio(logp, old_logp, m)                            # (B,) grad s_i/|y_i| per token
    obj, low, high = clip_objective(s, adv.detach(), hp["eps_low"], hp["eps_high"], hp["clip_c"])
    obj = obj - masked_mean(kl, m, dim=1)                            # (B,)
    stats = _stats(ratio, m, low[:, None].expand(m.shape), high[:, None].expand(m.shape))
    return -obj.sum() / (n_seqs or m.shape[0]), stats


def gapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, *,
         group_correct, group_size, **hp):
    """GAPO (2025): GSPO with the upper clip gapo_eps_high(c, G, eps_low, eps_high) of each group,
    c = group_correct (B,) of G = group_size (hp eps_high is eps_high_max); groups with c in {0, G}
    get 0. Divided by n_seqs like GSPO (= mean over sequences, then groups)."""
    c = torch.as_tensor(group_correct, dtype=torch.float32, device=logp.device)  # (B,)
    if group_size < 2 or ((c < 0) | (c > group_size) | (c != c.round())).any():
        raise ValueError(f"gapo needs binary rewards: group_correct must be integer counts in "
                         f"[0, group_size={group_size}] (group_size >= 2), got {c.tolist()}")
    adv = torch.where((c > 0) & (c < group_size), adv, 0.0)          # (B,) all-equal: no signal
    eps_high = gapo_eps_high(c, group_size, hp["eps_low"], hp["eps_high"])  # (B,)
    hp = dict(hp, eps_high=eps_high)
    return gspo(logp, old_logp, adv, mask, ref_logp, n_tokens, n_seqs, **hp)


def sapo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """SAPO (Gao et al. 2025): (4/tau)*sigmoid(tau*(r-1))*A - beta*KL, a soft gate for the clip,
    tau = tau_pos where A > 0, else tau_neg; per-sequence token mean, then divided by n_seqs."""
    m, logp, _, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    tau = torch.where(adv > 0, hp["tau_pos"], hp["tau_neg"])         # (B, T)
    obj = 4 / tau * torch.sigmoid(tau * (ratio - 1)) * adv - kl      # (B, T)
    return -masked_mean(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), _stats(ratio, m)


def cispo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """CISPO (MiniMax-M1, 2025): sg(min(r, eps_max))*A*logp - beta*KL, the weight capped but never
    blocking the gradient (eps_max 5 as in ScaleRL); token sum divided by n_tokens."""
    m, logp, _, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    obj = ratio.clamp(max=hp["eps_max"]).detach() * adv * logp - kl  # (B, T)
    stats = _stats(ratio, m, high=ratio > hp["eps_max"])             # capped, gradient kept
    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), stats


def pnpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """PNPO (2025): gate*w*A*logp - beta*KL, prefix weight w_t = sg(exp(cumsum(d)_t / t)), t from 1,
    gate 1 iff 1 - eps_low*h_t <= w_t <= 1 + eps_high*h_t, h_t = sqrt(|y_i|/t); eps 7e-4/9.5e-4.
    Per-sequence token mean (over |y_i|, not the accepted tokens), then divided by n_seqs."""
    m, logp, old_logp, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    d = (logp - old_logp).detach()                                   # (B, T) 0 at padding
    t = torch.arange(1, m.shape[1] + 1, device=m.device)             # (T,)
    w = torch.exp(d.cumsum(1) / t)                                   # (B, T)
    h = torch.sqrt(m.sum(1, keepdim=True) / t)                       # (B, T)
    low, high = w < 1 - hp["eps_low"] * h, w > 1 + hp["eps_high"] * h
    obj = torch.where(low | high, 0.0, w * adv * logp) - kl          # (B, T)
    return -masked_mean(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), _stats(ratio, m, low, high)

def gmpo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): the geometric mean of the token ratios, clipped per
    token in log space (verl's geo_mean): l_t = clamp(d_t, -eps_low, eps_high), min(d_t, l_t) where
    A > 0, max(d_t, l_t) where A <= 0; w_i = exp(sum_t m*l_t / |y_i|); objective w_i*A_i - beta *
    mean_t KL, summed and divided by n_seqs. eps 0.4 / 0.4 (ratios e^-0.4 .. e^0.4)."""
    if adv.dim() != 1:
        raise ValueError("gmpo needs a per-sequence advantage of shape (B,)")
    m, logp, old_logp, ratio, A, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    d = logp - old_logp                                              # (B, T)
    lim = d.clamp(-hp["eps_low"], hp["eps_high"])
    ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))  # (B, T)
    obj = torch.exp(masked_mean(ell, m, dim=1)) * adv.detach() - masked_mean(kl, m, dim=1)  # (B,)
    low, high = (A <= 0) & (d < -hp["eps_low"]), (A > 0) & (d > hp["eps_high"])  # gradient cut
    return -obj.sum() / (n_seqs or m.shape[0]), _stats(ratio, m, low, high)


def dppo(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """DPPO trust-region masking (Qi et al. 2026, arXiv 2602.04879; verl dppo_tv): a token counts
    where A > 0 and p - p_old <= delta, or A <= 0 and p - p_old >= -delta (p = exp(logp): the change
    in probability, not in ratio); objective sg(min(r, is_cap))*A*logp on the counted tokens - beta*KL,
    token sum divided by n_tokens (every valid token, counted or not)."""
    m, logp, old_logp, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    dp = (logp.exp() - old_logp.exp()).detach()                     # (B, T)
    low, high = (adv <= 0) & (dp < -hp["delta"]), (adv > 0) & (dp > hp["delta"])  # masked out
    obj = torch.where(low | high, 0.0, ratio.clamp(max=hp["is_cap"]).detach() * adv * logp) - kl
    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m, low, high)


def maxrl(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710): REINFORCE, on-policy, on the advantage
    (R - mean_g) / mean_g (group_advantages "maxrl"): each sequence's token mean of A*logp, summed
    and divided by n_seqs."""
    m, logp, _, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    return -masked_mean(adv * logp, m, dim=1).sum() / (n_seqs or m.shape[0]), _stats(ratio, m)


def reinforce_pp(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262; OpenRLHF, verl): no critic; PPO-clip (eps 0.2)
    on (B, T) advantages, the return-to-go (gamma 1) of the token rewards R - beta*k1(old, ref),
    whitened over the batch's tokens (advantage "rpp"; "rpp_baseline" subtracts R's group mean
    first). Its beta lives in the reward, not here; token sum divided by n_tokens."""
    m, logp, _, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    obj, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"])
    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m, low, high)


reinforce_pp_baseline = reinforce_pp  # REINFORCE++-baseline: the same loss, R - mean_g R in the reward


def remax(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE, on-policy, with A_i = R_i - R(greedy_i),
    the reward of the prompt's greedy response, sampled in the same step (rl.py); token sum of
    A*logp divided by n_tokens. Its beta lives in the reward."""
    m, logp, _, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    return -masked_sum(adv * logp, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m)


@torch.no_grad()
def cov_select(logp, old_logp, adv, mask, generator=None, *, kind, **hp):
    """(B, T) bool: the tokens Clip-Cov / KL-Cov (Cui et al. 2025) single out, over one minibatch.
    cov_t = (A_t - mean A)(logp_t - mean logp), means over the valid tokens; n = max(floor(cov_ratio *
    n_valid), 1). kind "clip_cov": n tokens drawn uniformly (generator) among the valid ones the
    PPO clip (eps_low / eps_high) leaves alone with cov_lb < cov < cov_ub; "kl_cov": the top n by cov."""
    m, logp, old_logp, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    cov = (adv - masked_mean(adv, m)) * (logp - masked_mean(logp, m))  # (B, T)
    n = max(int(hp["cov_ratio"] * int(m.sum())), 1)
    if kind == "kl_cov":
        top = torch.where(m, cov, -torch.inf).flatten().topk(min(n, int(m.sum()))).indices
    else:
        _, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"])
        ok = (m & ~low & ~high & (cov > hp["cov_lb"]) & (cov < hp["cov_ub"])).flatten().nonzero()[:, 0]
        top = ok[torch.randperm(len(ok), generator=generator, device=ok.device)[:n]]
    return torch.zeros(m.numel(), dtype=torch.bool, device=m.device).index_fill_(0, top, True).view(m.shape)


def clip_cov(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, *, cov_mask, **hp):
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl): PPO-clip per token (eps 0.2, no dual clip),
    except that the tokens of cov_mask (cov_select: a few random high-covariance ones) lose their
    loss and gradient; token sum divided by n_tokens (every valid token)."""
    obj, m, stats = _clipped_tokens(logp, old_logp, adv, mask, ref_logp, hp)
    obj = torch.where(cov_mask.bool(), 0.0, obj)                    # (B, T)
    stats["cov_frac"] = masked_mean(cov_mask.float(), m)
    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), stats


def kl_cov(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, *, cov_mask, **hp):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl): no clip; per token r*A, minus
    cov_kl_coef * |logp - old_logp| on the tokens of cov_mask (cov_select: the top-covariance ones);
    token sum divided by n_tokens."""
    m, logp, old_logp, ratio, adv, kl = _prep(logp, old_logp, adv, mask, ref_logp, hp)
    pen = torch.where(cov_mask.bool(), hp["cov_kl_coef"] * (logp - old_logp).abs(), 0.0)  # (B, T)
    stats = dict(_stats(ratio, m), cov_frac=masked_mean(cov_mask.float(), m))
    return -masked_sum(ratio * adv - pen - kl, m) / (n_tokens or m.sum().clamp_min(1)), stats


def opd(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **hp):
    """On-policy distillation (Agarwal et al. 2024, arXiv 2306.13649, GKD's reverse KL on the sampled
    tokens; Thinking Machines 2025): objective r_t*A_t, no clip, r_t = exp(logp_t - old_logp_t),
    A_t = teacher_advantages(old_logp, teacher); token sum divided by n_tokens. old_logp is pi_old,
    recomputed by the trainer whenever the sampler mu may differ (--staleness, --sampler_bf16): an
    advantage built from mu would add grad KL(pi || mu), a push away from the sampler. At the first
    step (r = 1) the gradient is the reverse KL(pi || pi_teacher)'s on the sampled tokens."""
    m, logp, _, ratio, adv, _ = _prep(logp, old_logp, adv, mask)
    return -masked_sum(ratio * adv, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m)


def gkd(logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, *, logits,
        teacher_logits, **hp):
    """GKD (Agarwal et al. 2024, arXiv 2306.13649; TRL's GKDTrainer convention): at every response
    position the exact divergence between the student's next-token distribution p (logits (B, T, V),
    tempered, with grad) and the teacher's q (teacher_logits, constant), summed over the vocabulary;
    token sum divided by n_tokens. gkd_beta b: 1 = reverse KL(p||q), 0 = forward KL(q||p), else
    TRL's generalized JSD b*KL(q||M) + (1-b)*KL(p||M), M = b*q + (1-b)*p. The sampled prefixes are
    data: adv is unused, logp and old_logp give the ratio stats only."""
    m, _, _, ratio, _, _ = _prep(logp, old_logp, adv, mask)
    b, lp = hp["gkd_beta"], F.log_softmax(logits.float(), -1)        # (B, T, V) student
    lq = F.log_softmax(teacher_logits.detach().float(), -1)          # (B, T, V) teacher

    def kl(a, c):  # KL(a || c) of log-probs (B, T, V) -> (B, T)
        return (a.exp() * (a - c)).sum(-1)
    lm = torch.logaddexp(lq + math.log(b), lp + math.log(1 - b)) if 0 < b < 1 else None  # log M
    div = kl(lp, lq) if b == 1 else kl(lq, lp) if b == 0 else b * kl(lq, lm) + (1 - b) * kl(lp, lm)
    return masked_sum(div, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m)

# ---------------------------------------------------------------------- preference, supervised
# Inputs: (B,) sequence sums of response log-probs, the policy's (with grad) and the reference's.

def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta=0.1, kind="sigmoid",
             label_smoothing=0.0, rpo_alpha=0.0, chosen_len=None):
    """DPO (Rafailov et al. 2023), mean over pairs of, for m = (pi_c - ref_c) - (pi_r - ref_r):
      sigmoid: -(1-eps) log sigmoid(beta*m) - eps log sigmoid(-beta*m), eps = label_smoothing
               (conservative DPO, Mitchell 2023; eps 0 = plain DPO)
      ipo:     (m - 1/(2*beta))^2 (IPO, Azar et al. 2023).
    rpo_alpha > 0 adds the chosen answers' NLL -rpo_alpha * pi_c / chosen_len (RPO, Pang 2024)."""
    chosen, rejected = pi_chosen - ref_chosen, pi_rejected - ref_rejected  # (B,) log-ratios
    m = chosen - rejected                                                   # (B,)
    if kind == "sigmoid":
        per_pair = (-(1 - label_smoothing) * F.logsigmoid(beta * m)
                    - label_smoothing * F.logsigmoid(-beta * m))            # (B,)
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
    """KTO (Ethayarajh et al. 2024), mean over answers: r = pi - ref (B,), reference point z =
    sg(max(0, mean(pi_mismatch - ref_mismatch))) over mismatched pairs (x_i, y_j); desirable
    answers lose lambda_d*(1 - sigmoid(beta*(r - z))), undesirable ones lambda_u*(1 -
    sigmoid(beta*(z - r))). rpo_alpha > 0 adds the desirable ones' NLL -rpo_alpha * pi / length."""
    r = pi_logp - ref_logp                                                  # (B,)
    z = (pi_mismatch - ref_mismatch).mean().clamp_min(0).detach()           # () reference point
    d = desirable.bool()
    per = torch.where(d, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                      lambda_u * (1 - torch.sigmoid(beta * (z - r))))       # (B,)
    if rpo_alpha:
        per = per - rpo_alpha * torch.where(d, pi_logp / length, 0.0)
    rew = (beta * r).detach()                                               # (B,)
    stats = {"z": z, "desirable_reward": masked_mean(rew, d),
             "undesirable_reward": masked_mean(rew, ~d)}                    # 0 when empty
    return per.mean(), stats


def simpo_loss(pi_chosen, pi_rejected, chosen_len, rejected_len, beta=2.0, gamma_beta_ratio=0.25,
               rpo_alpha=0.0):
    """SimPO (Meng et al. 2024, arXiv 2405.14734), reference-free: with the mean response-token
    log-probs a = pi / |y| (EOS included), the mean over pairs of
        -log sigmoid(beta * (a_c - a_r) - gamma) - rpo_alpha * a_c,  gamma = gamma_beta_ratio * beta;
    rpo_alpha > 0 adds the chosen answers' NLL (the authors' code calls it sft_weight, CPO-SimPO)."""
    a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len           # (B,) each
    m = beta * (a_c - a_r)                                                  # (B,)
    stats = {"chosen_reward": (beta * a_c).mean().detach(), "rejected_reward": (beta * a_r).mean().detach(),
             "margin": m.mean().detach(), "pair_accuracy": (m > 0).float().mean()}
    return (-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c).mean(), stats


def log1mexp(a):
    """log(1 - exp(a)) for a < 0, accurate on both sides of -log 2 (Maechler 2012); a is clamped to
    at most -1e-6, where 0 would give -inf."""
    a = a.clamp(max=-1e-6)
    return torch.where(a > -0.6931, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def orpo_loss(pi_chosen, pi_rejected, chosen_len, rejected_len, lam=0.1):
    """ORPO (Hong et al. 2024, arXiv 2403.07691), reference-free: with a = pi / |y| (the mean
    response-token log-prob, EOS included), log odds(y) = a - log(1 - exp(a)), the mean over pairs of
        -a_c - lam * log sigmoid(log odds_c - log odds_r).
    The NLL covers the chosen response's tokens only (TRL's also counts the prompt's)."""
    a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len           # (B,) each, <= 0

    log_odds = (a_c - a_r) - (log1mexp(a_c) - log1mexp(a_r))               # (B,)
    stats = {"chosen_reward": a_c.mean().detach(), "rejected_reward": a_r.mean().detach(),
             "margin": log_odds.mean().detach(), "pair_accuracy": (log_odds > 0).float().mean()}
    return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats


def bt_loss(s_chosen, s_rejected):
    """Bradley-Terry reward-model loss -log sigmoid(s_chosen - s_rejected), mean over pairs (B,)."""
    d = s_chosen - s_rejected                                               # (B,)
    stats = {"pair_accuracy": (d > 0).float().mean(), "margin": d.mean().detach()}
    return -F.logsigmoid(d).mean(), stats


def nll_loss(logp, mask, n_tokens=None):
    """Supervised baseline (sft: gold answers; rft: verified own samples, Yuan et al. 2023): the
    per-token NLL -sum_t m*logp / n_tokens, n_tokens = all response tokens of the batch."""
    m = mask.bool()
    loss = -masked_sum(logp, m) / (n_tokens or m.sum().clamp_min(1))
    return loss, {"nll": loss.detach()}

# ---------------------------------------------------------------------- the table of algorithms
# --loss=NAME -> function; family ("pg": policy gradient on rollouts, "pref": preference pairs,
# "sft": supervised baseline); the advantage rl.py gives it (a group_advantages kind, "cliff",
# "gae", "rpp", "rpp_baseline", "remax", "teacher"); DAPO's overlong shaping window in tokens (0 = off);
# hyperparameters at the papers' values (None: off, or set by rl.py), except the preference losses'
# rpo_alpha 1 (an NLL anchor), IPO's beta 0.5 and KTO's beta 1 (measured: docs/results.md).
Algo = namedtuple("Algo", "fn family advantage overlong defaults")
_KL = dict(beta=0.0, kl_estimator="k3")  # the in-loss KL term, off
_CLIP = dict(_KL, eps_low=0.2, eps_high=0.2, clip_c=None)
_PPO = dict(eps_low=0.2, eps_high=0.2, clip_c=None, vf_coef=0.1, vf_clip=0.2, ent_coef=0.0,
            beta=0.05, kl_target=None, gamma=1.0, lam=0.95, vf_lr_mult=10.0)
_RPO = dict(beta=0.1, rpo_alpha=1.0)
ALGOS = {
    "reinforce": Algo(reinforce, "pg", "mean", 0, dict(beta=0.0)),  # beta: KL in the reward
    "rloo": Algo(rloo, "pg", "rloo", 0, dict(beta=0.0)),
    # beta: k1 KL in the reward (kl_target set: adaptive); gamma/lam: GAE; vf_lr_mult: value lr
    "ppo": Algo(ppo, "pg", "gae", 0, _PPO),
    "grpo": Algo(grpo, "pg", "std", 0, dict(_CLIP, beta=0.04)),
    "dr_grpo": Algo(dr_grpo, "pg", "mean", 0, dict(_CLIP, max_new_tokens=None)),
    "dapo": Algo(dapo, "pg", "std", 2, dict(_CLIP, eps_high=0.28)),
    "gspo": Algo(gspo, "pg", "std", 0, dict(_CLIP, eps_low=3e-4, eps_high=4e-4)),
    "sapo": Algo(sapo, "pg", "std", 0, dict(_KL, tau_pos=1.0, tau_neg=1.05)),
    "cispo": Algo(cispo, "pg", "std", 0, dict(_KL, eps_max=5.0)),
    "gapo": Algo(gapo, "pg", "mean", 0, dict(_CLIP, eps_low=0.003, eps_high=0.005)),  # eps_high_max
    "pnpo": Algo(pnpo, "pg", "std", 0, dict(_KL, eps_low=7e-4, eps_high=9.5e-4)),
    "cliff": Algo(cliff, "pg", "cliff", 0, dict(_CLIP, beta=0.04)),
    "gmpo": Algo(gmpo, "pg", "std", 0, dict(_KL, eps_low=0.4, eps_high=0.4)),
    "dppo": Algo(dppo, "pg", "std", 0, dict(_KL, delta=0.2, is_cap=20.0)),
    "maxrl": Algo(maxrl, "pg", "maxrl", 0, {}),  # binary rewards: A is relative to the pass rate
    "clip_cov": Algo(clip_cov, "pg", "std", 0, dict(_CLIP, cov_ratio=2e-4, cov_lb=1.0, cov_ub=5.0)),
    "kl_cov": Algo(kl_cov, "pg", "std", 0, dict(_KL, cov_ratio=2e-3, cov_kl_coef=1.0)),  # the 7B recipe
    "reinforce_pp": Algo(reinforce_pp, "pg", "rpp", 0, dict(eps_low=0.2, eps_high=0.2, beta=0.01)),
    "reinforce_pp_baseline": Algo(reinforce_pp_baseline, "pg", "rpp_baseline", 0,
                                  dict(eps_low=0.2, eps_high=0.2, beta=0.01)),
    "remax": Algo(remax, "pg", "remax", 0, dict(beta=0.0)),  # beta: KL in the reward
    "opd": Algo(opd, "pg", "teacher", 0, {}),  # --teacher_ckpt
    "gkd": Algo(gkd, "pg", "teacher", 0, dict(gkd_beta=1.0)),  # --teacher_ckpt; 1 = reverse KL
    "dpo": Algo(dpo_loss, "pref", None, 0, dict(_RPO, kind="sigmoid", label_smoothing=0.0)),
    "ipo": Algo(dpo_loss, "pref", None, 0, dict(_RPO, beta=0.5, kind="ipo")),  # 1-nat margin
    "kto": Algo(kto_loss, "pref", None, 0, dict(_RPO, beta=1.0, lambda_d=1.0, lambda_u=1.0)),  # 0.1: -pass@8
    "simpo": Algo(simpo_loss, "pref", None, 0, dict(_RPO, beta=2.0, gamma_beta_ratio=0.25)),  # no reference
    "orpo": Algo(orpo_loss, "pref", None, 0, dict(lam=0.1)),  # no reference
    "sft": Algo(nll_loss, "sft", None, 0, {}),  # on gold answers
    "rft": Algo(nll_loss, "sft", None, 0, {}),  # on the policy's verified samples
}
DEFAULTS = {n: a.defaults for n, a in ALGOS.items()}


def _with_defaults(name):
    """ALGOS[name].fn taking any subset of its hyperparameters: the row's defaults fill the rest."""
    def loss(*args, **kw):
        hp = {k: kw.pop(k) for k in list(kw) if k in DEFAULTS[name]}
        bad = [k for k in kw if k not in INPUTS]
        if bad:
            raise ValueError(f"loss {name!r} has no hyperparameter {bad[0]!r}; "
                             f"it takes {', '.join(DEFAULTS[name]) or 'none'}")
        return ALGOS[name].fn(*args, **kw, **{**DEFAULTS[name], **hp})
    return loss


INPUTS = ("ref_logp", "n_tokens", "n_seqs", "values", "old_values", "returns", "entropy", "cov_mask",
          "group_correct", "group_size", "logits", "teacher_logits")  # tensors, not hyperparameters
LOSSES = {n: _with_defaults(n) for n, a in ALGOS.items() if a.family == "pg"}
PREF_LOSSES = {n: a.fn for n, a in ALGOS.items() if a.family == "pref"}
BASELINES = {n: a.fn for n, a in ALGOS.items() if a.family == "sft"}


def resolve_hparams(name, **overrides):
    """ALGOS[name].defaults with the non-None overrides applied. None means the default, so a None
    for a knob this loss lacks is ignored (a config passes all its fields); other unknowns fail."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown loss {name!r}; valid: {', '.join(DEFAULTS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for k in overrides.keys() - DEFAULTS[name].keys():
        raise ValueError(f"loss {name!r} has no hyperparameter {k!r}; "
                         f"it takes {', '.join(DEFAULTS[name])}")
    return {**DEFAULTS[name], **overrides}
