"""Mutation testing of the loss and advantage maths: does a test fail when a one-line defect is planted?

    python bench/mutate.py              # every mutant, about 15 min on 2 busy CPU cores
    python bench/mutate.py pnpo kto     # only the mutants whose description or changed text names a word
    python bench/mutate.py --check      # only check that every mutant applies (its text occurs once)

MUTANTS holds single-line defects (file, an exact substring that occurs once in that file, its
replacement, what the defect breaks) in every function of losses.py and in rl.advantages: flipped
signs, wrong normalisers, a removed .detach(), changed clamps, swapped hyperparameters, sample for
population std. For each one the script copies the repo's .py files, tests/, data/ and pytest.ini to a
temporary folder (the working tree is never touched), plants the defect there and runs

  python -m pytest -x -q -p no:cacheprovider tests/test_losses.py tests/test_advantages.py tests/test_pref.py

(test_pref.py last: its end-to-end runs are the slow part, and -x stops at the first failure). A failing
test means the mutant was caught; a passing run means it was missed. The unmutated copy must pass first.
Prints one line per mutant, then "caught N of M"; exits 1 if any mutant was missed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["tests/test_losses.py", "tests/test_advantages.py", "tests/test_pref.py"]
TIMEOUT = 600  # seconds per pytest run; a mutant that hangs counts as caught

LP = "losses.py"
MUTANTS = [  # (file, old, new, what it breaks)
    # reductions, log-probs, entropy
    (LP, "x = torch.where(mask.bool(), x, 0.0)", "x = x * mask", "masked_sum multiplies padding by 0"),
    (LP, "masked_sum(x, mask, dim) / count.clamp_min(1)", "masked_sum(x, mask, dim) / count",
     "masked_mean: empty selection gives NaN"),
    (LP, "else mask.bool().sum(dim)", "else torch.tensor(float(mask.shape[-1]))",
     "masked_mean along dim divides by T, not the masked count"),
    (LP, "labels = torch.where(mask.bool(), labels, 0)", "labels = labels",
     "token_logps gathers padding ids"),
    (LP, "torch.float32)) / temperature", "torch.float32)) * temperature",
     "token_logps: temperature multiplies"),
    (LP, "- z.logsumexp(-1)", "- z.max(-1).values", "token_logps: unnormalised log-softmax"),
    (LP, "return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)",
     "return (p * torch.where(p > 0, logp, 0.0)).sum(-1)", "token_entropy: sign"),
    (LP, "F.log_softmax(logits.float() / temperature, dim=-1)", "F.log_softmax(logits.float(), dim=-1)",
     "token_entropy ignores the temperature"),
    # group_advantages
    (LP, "adv = centred / (rewards.std(-1, correction=0, keepdim=True) + eps)",
     "adv = centred / (rewards.std(-1, correction=1, keepdim=True) + eps)", "group_advantages: sample std"),
    (LP, "adv = centred * G / (G - 1)", "adv = centred * (G - 1) / G",
     "group_advantages: rloo factor inverted"),
    (LP, "centred = rewards - rewards.mean(-1, keepdim=True)", "centred = rewards - rewards.mean()",
     "group_advantages: batch mean, not group mean"),
    (LP, "same = (rewards == rewards[..., :1]).all(-1, keepdim=True)",
     "same = (rewards == rewards[..., :1]).any(-1, keepdim=True)", "group_advantages: zeroes every group"),
    (LP, "        adv = centred\n    elif", "        adv = rewards\n    elif",
     "group_advantages: mean kind without baseline"),
    # gae, kl
    (LP, "delta = rewards[:, t] + gamma * next_value - values[:, t]",
     "delta = rewards[:, t] + next_value - values[:, t]", "gae: undiscounted bootstrap"),
    (LP, "delta + gamma * lam * next_adv", "delta + lam * next_adv", "gae: gamma dropped from the trace"),
    (LP, "next_value = torch.where(m[:, t], values[:, t], 0.0)", "next_value = values[:, t]",
     "gae: bootstraps from padding values"),
    (LP, "return adv, torch.where(m, adv + values, 0.0)", "return adv, torch.where(m, adv, 0.0)",
     "gae: returns without V"),
    (LP, "x = (ref_logp - logp).clamp(-20.0, 20.0)", "x = ref_logp - logp",
     "kl_estimate: log-ratio not clamped"),
    (LP, '"k1": -x,', '"k1": x,', "kl_estimate: k1 sign"),
    (LP, '"k2": 0.5 * x * x', '"k2": x * x', "kl_estimate: k2 without 1/2"),
    (LP, '"k3": torch.expm1(x) - x', '"k3": torch.expm1(x) + x', "kl_estimate: k3 sign of x"),
    (LP, '-beta * kl_estimate(logp, ref_logp, "k1")', '-beta * kl_estimate(logp, ref_logp, "k3")',
     "kl_in_reward: k3, not k1"),
    (LP, '-beta * kl_estimate(logp, ref_logp, "k1")', 'beta * kl_estimate(logp, ref_logp, "k1")',
     "kl_in_reward: KL rewarded"),
    (LP, "last = (m.sum(1) - 1).clamp_min(0)", "last = (m.sum(1) - 2).clamp_min(0)",
     "kl_in_reward: score on the wrong token"),
    (LP, "torch.exp(F.pad(logp, (1, 0))[:, :-1].cumsum(1))", "torch.exp(logp.cumsum(1))",
     "prefix_prob includes the current token"),
    # whiten, explained variance, adaptive KL, cliff, gapo bound, sequence ratio, clip
    (LP, "return masked_mean((x - masked_mean(x, mask)) ** 2, mask)", "return masked_mean(x ** 2, mask)",
     "masked_var: uncentred"),
    (LP, "(x - mean) * torch.rsqrt(var + eps)", "(x - mean) / (var + eps)",
     "whiten: divides by the variance"),
    (LP, "torch.where(m, (x - mean) * torch.rsqrt", "torch.where(m, x * torch.rsqrt",
     "whiten: not centred"),
    (LP, "var = masked_var(x, m) if var is None", "var = masked_var(x, m) * 2 if var is None",
     "whiten: wrong batch variance"),
    (LP, "/ masked_var(returns, mask).clamp_min(1e-8)", "/ masked_var(values, mask).clamp_min(1e-8)",
     "explained_variance: wrong denominator"),
    (LP, "return beta * (1 + min(", "return beta * (1 - min(", "adaptive_beta: sign"),
    (LP, "0.2) * n / horizon)", "0.2))", "adaptive_beta: ignores n / horizon"),
    (LP, "sd = rewards.std(-1, correction=0, keepdim=True)",
     "sd = rewards.std(-1, correction=1, keepdim=True)", "cliff_advantages: sample std"),
    (LP, "(-mu / sd)[..., None]", "(mu / sd)[..., None]", "cliff_advantages: a_bad sign"),
    (LP, "before = t < first_wrong", "before = t <= first_wrong",
     "cliff_advantages: first wrong token off by one"),
    (LP, "torch.where(before, lam * a_good, a_bad)", "torch.where(before, a_good, a_bad)",
     "cliff_advantages: ignores lam"),
    (LP, "adv = adv - masked_mean(adv.expand(m.shape), m, dim=(1, 2))[:, None, None]",
     "adv = adv - adv.expand(m.shape).mean((1, 2))[:, None, None]", "cliff_advantages: centred over padding"),
    (LP, "(eps_high_max - eps_low) * (G - c) / (G - 1)", "(eps_high_max - eps_low) * (G - c) / G",
     "gapo_eps_high: divides by G"),
    (LP, "torch.exp(masked_mean(logp - old_logp, mask, dim=1))",
     "torch.exp(masked_sum(logp - old_logp, mask, dim=1))", "sequence_ratio: product, not geometric mean"),
    (LP, "ratio.clamp(min=1 - eps_low).clamp(max=1 + eps_high)",
     "ratio.clamp(min=1 - eps_high).clamp(max=1 + eps_low)", "clip_objective: eps_low / eps_high swapped"),
    (LP, "obj = torch.minimum(ratio * adv, clipped * adv)", "obj = torch.maximum(ratio * adv, clipped * adv)",
     "clip_objective: max, not min"),
    (LP, "low = (adv < 0) & (ratio < 1 - eps_low)", "low = (adv > 0) & (ratio < 1 - eps_low)",
     "clip_objective: low flag on the wrong side"),
    (LP, "dual = (adv < 0) & (obj < clip_c * adv)", "dual = (adv < 0) & (obj > clip_c * adv)",
     "clip_objective: dual clip inverted"),
    # loss plumbing: _prep
    (LP, "logp = torch.where(m, logp, 0.0)", "logp = logp * m", "_prep multiplies padding by 0"),
    (LP, "old_logp = torch.where(m, old_logp.detach(), 0.0)", "old_logp = torch.where(m, old_logp, 0.0)",
     "_prep: old_logp not detached"),
    (LP, "ref_logp.detach(), 0.0)", "ref_logp, 0.0)", "_prep: ref_logp not detached"),
    (LP, ".detach().expand(m.shape)", ".expand(m.shape)", "_prep: advantages not detached"),
    (LP, 'hp["beta"] * kl_estimate(logp, ref_logp, hp["kl_estimator"])',
     'hp["beta"] * kl_estimate(logp, ref_logp, "k3")', "_prep: in-loss KL ignores kl_estimator"),
    (LP, 'hp["beta"] * kl_estimate(logp, ref_logp, hp["kl_estimator"])',
     'hp["beta"] * kl_estimate(ref_logp, logp, hp["kl_estimator"])',
     "_prep: in-loss KL(ref || pi), arguments swapped"),
    # policy losses
    (LP, "-masked_sum(adv * logp, m) / (n_seqs or m.shape[0])",
     "-masked_sum(adv * logp, m) / (n_tokens or m.sum())", "reinforce: divides by tokens"),
    (LP, "ref_logp, n_tokens, n_seqs, **hp)", "ref_logp, n_seqs, n_tokens, **hp)",
     "gapo: counts swapped calling gspo"),
    (LP, "return obj - kl, m, _stats(", "return obj + kl, m, _stats(",
     "grpo/dapo/dr_grpo/cliff: KL sign"),
    (LP, 'obj, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], hp["clip_c"])',
     'obj, low, high = clip_objective(ratio, adv, hp["eps_low"], hp["eps_high"], None)',
     "_clipped_tokens drops clip_c"),
    (LP, "return -masked_mean(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), stats\n\n\ncliff",
     "return -masked_sum(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), stats\n\n\ncliff",
     "grpo/cliff: token sum, not per-sequence mean"),
    (LP, "return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1)), stats\n\n\ndef ppo",
     "return -masked_sum(obj, m) / (n_seqs or m.shape[0]), stats\n\n\ndef ppo",
     "dapo: divides by sequences, not tokens"),
    (LP, '((n_seqs or m.shape[0]) * hp["max_new_tokens"])', "((n_seqs or m.shape[0]) * m.shape[1])",
     "dr_grpo: batch width, not max_new_tokens"),
    (LP, '+ (hp["ent_coef"] * entropy if hp["ent_coef"] else 0.0)',
     '- (hp["ent_coef"] * entropy if hp["ent_coef"] else 0.0)', "ppo: entropy bonus sign"),
    (LP, "err = torch.maximum(err, (v_clip - returns) ** 2)",
     "err = torch.minimum(err, (v_clip - returns) ** 2)", "ppo: value clip takes the smaller error"),
    (LP, '.clamp(-hp["vf_clip"], hp["vf_clip"])', '.clamp(-2 * hp["vf_clip"], 2 * hp["vf_clip"])',
     "ppo: value clip range doubled"),
    (LP, "vf = 0.5 * err", "vf = err", "ppo: value loss without 1/2"),
    (LP, "old_values.detach(), returns.detach()", "old_values.detach(), returns",
     "ppo: returns not detached"),
    (LP, 'obj = pg - hp["vf_coef"] * vf', 'obj = pg - hp["vf_clip"] * vf', "ppo: vf_clip used as vf_coef"),
    (LP, "n = n_tokens or m.sum().clamp_min(1)", "n = n_seqs or m.shape[0]",
     "ppo: divides by sequences"),
    (LP, "obj = obj - masked_mean(kl, m, dim=1)", "obj = obj - masked_sum(kl, m, dim=1)",
     "gspo/gapo: KL summed over tokens"),
    (LP, 'clip_objective(s, adv.detach(), hp["eps_low"]', 'clip_objective(s, adv, hp["eps_low"]',
     "gspo/gapo: advantages not detached"),
    (LP, "return -obj.sum() / (n_seqs or m.shape[0]), stats",
     "return -obj.sum() / m.shape[0], stats",
     "gspo/gapo: ignore the global n_seqs"),
    (LP, 'adv.detach(), hp["eps_low"], hp["eps_high"], hp["clip_c"])',
     'adv.detach(), hp["eps_low"], hp["eps_low"], hp["clip_c"])', "gspo/gapo: eps_low as eps_high"),
    (LP, "adv = torch.where((c > 0) & (c < group_size), adv, 0.0)", "adv = torch.where(c > 0, adv, 0.0)",
     "gapo: all-correct groups keep their advantage"),
    (LP, 'eps_high = gapo_eps_high(c, group_size, hp["eps_low"], hp["eps_high"])',
     'eps_high = gapo_eps_high(group_size - c, group_size, hp["eps_low"], hp["eps_high"])',
     "gapo: bound reversed in c"),
    (LP, 'tau = torch.where(adv > 0, hp["tau_pos"], hp["tau_neg"])',
     'tau = torch.where(adv > 0, hp["tau_neg"], hp["tau_pos"])', "sapo: tau_pos / tau_neg swapped"),
    (LP, "obj = 4 / tau * torch.sigmoid", "obj = 2 / tau * torch.sigmoid", "sapo: gate scale 2/tau"),
    (LP, "return -masked_mean(obj, m, dim=1).sum() / (n_seqs or m.shape[0]), _stats(ratio, m)\n",
     "return -masked_sum(obj, m) / (n_tokens or m.sum()), _stats(ratio, m)\n",
     "sapo: token mean over the batch"),
    (LP, 'obj = ratio.clamp(max=hp["eps_max"]).detach() * adv',
     'obj = ratio.clamp(max=hp["eps_max"]) * adv',
     "cispo: weight not detached"),
    (LP, 'obj = ratio.clamp(max=hp["eps_max"]).detach() * adv', "obj = ratio.detach() * adv",
     "cispo: weight not capped"),
    (LP, "* adv * logp - kl  # (B, T)", "* adv * logp + kl  # (B, T)", "cispo: KL sign"),
    (LP, "w = torch.exp(d.cumsum(1) / t)", "w = torch.exp(d.cumsum(1))", "pnpo: prefix ratio a product"),
    (LP, "h = torch.sqrt(m.sum(1, keepdim=True) / t)", "h = torch.sqrt(t / m.sum(1, keepdim=True))",
     "pnpo: length weight inverted"),
    (LP, 'low, high = w < 1 - hp["eps_low"] * h, w > 1 + hp["eps_high"] * h',
     'low, high = w < 1 - hp["eps_high"] * h, w > 1 + hp["eps_low"] * h', "pnpo: eps_low / eps_high swapped"),
    (LP, "torch.where(low | high, 0.0, w * adv * logp)", "torch.where(high, 0.0, w * adv * logp)",
     "pnpo: no lower gate"),
    (LP, "d = (logp - old_logp).detach()", "d = logp - old_logp",
     "pnpo: prefix weight not detached"),
    (LP, "torch.arange(1, m.shape[1] + 1, device=m.device)",
     "torch.arange(2, m.shape[1] + 2, device=m.device)", "pnpo: t counted from 2"),
    # gmpo, dppo, maxrl
    (LP, "ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))",
     "ell = torch.where(A > 0, torch.maximum(d, lim), torch.minimum(d, lim))", "gmpo: clip sides swapped"),
    (LP, "ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))", "ell = lim",
     "gmpo: every token clamped (no sign-aware min/max)"),
    (LP, "obj = torch.exp(masked_mean(ell, m, dim=1)) * adv.detach()",
     "obj = torch.exp(masked_sum(ell, m, dim=1)) * adv.detach()", "gmpo: product, not geometric mean"),
    (LP, "low, high = (A <= 0) & (d < -hp[\"eps_low\"]), (A > 0) & (d > hp[\"eps_high\"])  # gradient cut",
     "low, high = (A <= 0) & (d < -hp[\"eps_high\"]), (A > 0) & (d > hp[\"eps_low\"])  # gradient cut",
     "gmpo: clip fractions with swapped eps"),
    (LP, "dp = (logp.exp() - old_logp.exp()).detach()", "dp = (logp - old_logp).detach()",
     "dppo: log-ratio instead of probability change"),
    (LP, "low, high = (adv <= 0) & (dp < -hp[\"delta\"]), (adv > 0) & (dp > hp[\"delta\"])",
     "low, high = (adv <= 0) & (dp > hp[\"delta\"]), (adv > 0) & (dp < -hp[\"delta\"])",
     "dppo: trust region on the wrong sides"),
    (LP, "ratio.clamp(max=hp[\"is_cap\"]).detach() * adv * logp", "ratio.detach() * adv * logp",
     "dppo: weight not capped"),
    (LP, "ratio.clamp(max=hp[\"is_cap\"]).detach() * adv * logp",
     "ratio.clamp(max=hp[\"is_cap\"]) * adv * logp",
     "dppo: weight not detached"),
    (LP, "* adv * logp) - kl\n    return -masked_sum(obj, m) / (n_tokens or m.sum().clamp_min(1))",
     "* adv * logp) - kl\n    return -masked_sum(obj, m) / (n_seqs or m.shape[0])",
     "dppo: divided by sequences, not tokens"),
    (LP, "return -masked_mean(adv * logp, m, dim=1).sum() / (n_seqs or m.shape[0]), _stats(ratio, m)",
     "return -masked_sum(adv * logp, m) / (n_seqs or m.shape[0]), _stats(ratio, m)",
     "maxrl: token sum, not the per-sequence mean"),
    (LP, "adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)",
     "adv = torch.where(mean > 0, centred, 0.0)", "maxrl advantage: not divided by the pass rate"),
    (LP, "adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)",
     "adv = centred / torch.where(mean > 0, mean, 1.0)", "maxrl advantage: mean <= 0 not zeroed"),
    # clip_cov, kl_cov, reinforce_pp, remax
    (LP, "cov = (adv - masked_mean(adv, m)) * (logp - masked_mean(logp, m))", "cov = adv * logp",
     "cov_select: covariance not centred"),
    (LP, "(m & ~low & ~high & (cov", "(m & (cov", "cov_select: clip_cov takes tokens the clip already cut"),
    (LP, "n = max(int(hp[\"cov_ratio\"] * int(m.sum())), 1)", "n = int(hp[\"cov_ratio\"] * int(m.sum()))",
     "cov_select: no minimum of one token"),
    (LP, "obj = torch.where(cov_mask.bool(), 0.0, obj)", "obj = obj",
     "clip_cov: chosen tokens keep their loss"),
    (LP, "hp[\"cov_kl_coef\"] * (logp - old_logp).abs()", "hp[\"cov_kl_coef\"] * (logp - old_logp)",
     "kl_cov: signed, not absolute, log-ratio penalty"),
    (LP, "hp[\"cov_kl_coef\"] * (logp - old_logp).abs()",
     "hp[\"cov_kl_coef\"] * (logp - old_logp).abs().detach()",
     "kl_cov: penalty without gradient"),
    (LP, "obj, low, high = clip_objective(ratio, adv, hp[\"eps_low\"], hp[\"eps_high\"])\n    return",
     "obj, low, high = clip_objective(ratio, adv, hp[\"eps_high\"], hp[\"eps_low\"])\n    return",
     "reinforce_pp: clip bounds swapped"),
    (LP, "return -masked_sum(adv * logp, m) / (n_tokens or m.sum().clamp_min(1)), _stats(ratio, m)",
     "return -masked_sum(adv * logp, m) / (n_seqs or m.shape[0]), _stats(ratio, m)",
     "remax: divided by sequences, not tokens"),
    ("rl.py", 'R = L.group_advantages(R.view(-1, G), "mean").flatten()',
     'R = L.group_advantages(R.view(-1, G), "std").flatten()',
     "advantages: reinforce_pp_baseline divides by the group std"),
    ("rl.py", "if gae else (1.0, 1.0)))", "if gae else (1.0, 0.0)))",
     "advantages: reinforce_pp one-step rewards, not returns to go"),
    ("rl.py", 'return R - batch["baseline"], {}', "return R, {}",
     "advantages: remax without its greedy baseline"),
    (LP, 'Algo(reinforce_pp, "pg", "rpp"', 'Algo(reinforce_pp, "pg", "std"',
     "ALGOS: reinforce_pp gets GRPO's advantage"),
    # simpo, orpo
    (LP, "(-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c)",
     "(-F.logsigmoid(m + gamma_beta_ratio * beta) - rpo_alpha * a_c)", "simpo: target margin added"),
    (LP, "(-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c)",
     "(-F.logsigmoid(m - gamma_beta_ratio * beta) + rpo_alpha * a_c)", "simpo: rpo NLL sign"),
    (LP, "a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len           # (B,) each\n",
     "a_c, a_r = pi_chosen, pi_rejected\n", "simpo: sequence sums, not length-normalised"),
    (LP, "return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats",
     "return (a_c - lam * F.logsigmoid(log_odds)).mean(), stats", "orpo: NLL sign"),
    (LP, "log_odds = (a_c - a_r) - (log1mexp(a_c) - log1mexp(a_r))", "log_odds = a_c - a_r",
     "orpo: log-probability ratio, not log-odds ratio"),
    (LP, "return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats",
     "return (-a_c - F.logsigmoid(log_odds)).mean(), stats", "orpo: lambda ignored"),
    # preference losses, baselines
    (LP, "- label_smoothing * F.logsigmoid(-beta * m)", "+ label_smoothing * F.logsigmoid(-beta * m)",
     "dpo: label smoothing sign"),
    (LP, "-(1 - label_smoothing) * F.logsigmoid(beta * m)", "-F.logsigmoid(beta * m)",
     "dpo: no (1 - eps) weight"),
    (LP, "per_pair = (m - 1 / (2 * beta)) ** 2", "per_pair = (m - 1 / beta) ** 2",
     "ipo: target margin 1/beta"),
    (LP, "per_pair = per_pair - rpo_alpha * pi_chosen / chosen_len",
     "per_pair = per_pair + rpo_alpha * pi_chosen / chosen_len", "dpo: rpo NLL sign"),
    (LP, "m = chosen - rejected", "m = rejected - chosen", "dpo: margin sign"),
    (LP, "chosen, rejected = pi_chosen - ref_chosen, pi_rejected - ref_rejected",
     "chosen, rejected = pi_chosen - ref_rejected, pi_rejected - ref_chosen",
     "dpo: references swapped (stats)"),
    (LP, "lambda_d * (1 - torch.sigmoid(beta * (r - z))),\n                      lambda_u * (1",
     "lambda_u * (1 - torch.sigmoid(beta * (r - z))),\n                      lambda_d * (1",
     "kto: lambda_d / lambda_u swapped"),
    (LP, ".mean().clamp_min(0).detach()", ".mean().detach()", "kto: z not clamped at 0"),
    (LP, ".mean().clamp_min(0).detach()", ".mean().clamp_min(0)", "kto: z not detached"),
    (LP, "lambda_u * (1 - torch.sigmoid(beta * (z - r)))", "lambda_u * (1 - torch.sigmoid(beta * (r - z)))",
     "kto: undesirable sign"),
    (LP, "rpo_alpha * torch.where(d, pi_logp / length, 0.0)", "rpo_alpha * pi_logp / length",
     "kto: rpo NLL on undesirable answers too"),
    (LP, "return per.mean(), stats", "return per.sum(), stats", "kto: sum, not mean over answers"),
    (LP, "-F.logsigmoid(d).mean()", "-F.logsigmoid(-d).mean()", "bt_loss: sign"),
    (LP, "loss = -masked_sum(logp, m) / (n_tokens or m.sum().clamp_min(1))",
     "loss = -masked_sum(logp, m) / (n_tokens or m.shape[0])", "nll_loss: divides by sequences"),
    (LP, 'Algo(rloo, "pg", "rloo"', 'Algo(rloo, "pg", "mean"', "ALGOS: rloo gets the mean advantage"),
    (LP, 'Algo(dr_grpo, "pg", "mean"', 'Algo(dr_grpo, "pg", "std"', "ALGOS: dr_grpo gets the std advantage"),
    (LP, 'Algo(gapo, "pg", "mean"', 'Algo(gapo, "pg", "std"', "ALGOS: gapo gets the std advantage"),
    # rl.advantages
    ("rl.py", 'ref_logp if hp["beta"] else lp', "ref_logp", "advantages: ppo needs a reference at beta 0"),
    ("rl.py", 'hp["gamma"], hp["lam"])', 'hp["lam"], hp["gamma"])', "advantages: gamma / lam swapped"),
    ("rl.py", "adv = L.whiten(adv, mask, s / n, s2 / n - (s / n) ** 2)", "adv = adv",
     "advantages: ppo not whitened"),
    ("rl.py", 'dict(old_values=v, returns=returns)', 'dict(old_values=v, returns=adv)',
     "advantages: ppo returns are the advantages"),
    ("rl.py", 'and hp["beta"] > 0:', 'and hp["beta"] < 0:', "advantages: reinforce KL in reward skipped"),
    ("rl.py", 'ref_logp, mask, hp["beta"]).sum(1)', 'ref_logp, mask, hp["beta"]).mean(1)',
     "advantages: KL in reward averaged over T"),
    ("rl.py", 'R = L.kl_in_reward(R, batch["logps"], ref_logp, mask,',
     'R = L.kl_in_reward(R, batch["logps"], ref_logp, torch.ones_like(mask),',
     "advantages: KL counts padding"),
    (LP, 'Algo(grpo, "pg", "std"', 'Algo(grpo, "pg", "mean"', "ALGOS: grpo gets the mean advantage"),
    (LP, 'Algo(dapo, "pg", "std", 2,', 'Algo(dapo, "pg", "std", 0,', "ALGOS: dapo without overlong shaping"),
    ("rl.py", ".sum(1).repeat_interleave(G)", ".sum(1).repeat(G)", "advantages: gapo counts misaligned"),
    ("rl.py", 'mask = batch["response_mask"][:, batch["prompt_len"]:]  # (N, L)\n    if kind',
     'mask = batch["response_mask"][:, batch["prompt_len"] - 1:-1]  # (N, L)\n    if kind',
     "advantages: response mask off by one"),
]


def copy_repo(dst):
    """The code and tests the run needs, into dst: top-level .py files, pytest.ini, tests/, data/."""
    for name in os.listdir(ROOT):
        if name.endswith(".py") or name == "pytest.ini":
            shutil.copy2(os.path.join(ROOT, name), dst)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("tests", "data"):  # data/ holds tasks.py and the generated splits test_pref.py reads
        shutil.copytree(os.path.join(ROOT, folder), os.path.join(dst, folder), ignore=skip)


def run_tests(dst):
    """-> (passed, first failing test or "timeout", seconds)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")  # no stale .pyc after a mutation
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           f"--basetemp={os.path.join(dst, '.pytest_tmp')}", *TESTS]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, cwd=dst, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return False, "timeout", time.time() - t0
    lines = out.stdout.splitlines()
    failed = [l.split(" - ")[0].split(" ", 1)[1] for l in lines if l.startswith(("FAILED", "ERROR"))]
    why = failed[0] if failed else ((out.stdout + out.stderr).strip().splitlines() or ["?"])[-1]
    return out.returncode == 0, why, time.time() - t0


def main(argv):
    sources = {}
    for path, old, new, what in MUTANTS:
        text = sources.setdefault(path, open(os.path.join(ROOT, path)).read())
        n = text.count(old)
        assert n == 1, f"{path}: {what}: the text to mutate occurs {n} times, not once: {old!r}"
        assert old != new, what
    if "--check" in argv:
        print(f"all {len(MUTANTS)} mutants apply")
        return 0
    words = [w for w in argv if not w.startswith("--")]
    todo = [m for m in MUTANTS if not words or any(w in m[3] or w in m[2] for w in words)]
    with tempfile.TemporaryDirectory(prefix="nanorl-mutate-") as dst:
        copy_repo(dst)
        ok, why, secs = run_tests(dst)
        if not ok:
            print(f"the unmutated copy fails its tests ({why}); fix that first")
            return 1
        print(f"unmutated: tests pass ({secs:.0f} s); {len(todo)} mutants")
        print(f"{'':6} {'file':10} {'mutant':50} {'s':>4}  first failing test")
        missed = []
        for path, old, new, what in todo:
            target = os.path.join(dst, path)
            with open(target, "w") as f:
                f.write(sources[path].replace(old, new))
            try:
                ok, why, secs = run_tests(dst)
            finally:
                with open(target, "w") as f:
                    f.write(sources[path])
            if ok:
                missed.append(what)
            verdict = "MISSED" if ok else "caught"
            print(f"{verdict:6} {path:10} {what[:50]:50} {secs:4.0f}  {'' if ok else why}", flush=True)
    print(f"caught {len(todo) - len(missed)} of {len(todo)}")
    for what in missed:
        print(f"  missed: {what}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
