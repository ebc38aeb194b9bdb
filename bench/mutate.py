"""Mutation testing: does a test fail when a one-line defect is planted in the code?

    python bench/mutate.py              # every mutant, about 15 min on 2 busy CPU cores
    python bench/mutate.py pnpo kto     # only mutants whose description or new text has a word
    python bench/mutate.py --check      # only check that every mutant applies

MUTANTS holds single-line defects (file, an exact substring that occurs once in that file, its
replacement, what the defect breaks, the tests that should catch it) across the maths and its
plumbing: losses.py (reductions, advantages, KL, the objectives, `loss` and `aggregate`, the
ALGOS rows' advantage / aggregation columns), rl.py (grading key, advantages, the ratio's
anchor, logp_mismatch), model.py (log-probs, the sampler's prefix key and forced tool tokens,
response_forward's grouping key) and nanorl/ (cliff, cov, offpolicy, distill, pref, rm, rows,
tools), verify.py and sft.py: flipped signs, wrong normalisers, a removed .detach() or mask,
changed clamps and bounds, swapped hyperparameters, sample for population std.

Each mutant names its own tests: test files or pytest node ids (file::test), fast ones first.
The script copies the repo's top-level .py files, pytest.ini, README.md and the folders nanorl/,
bench/, data/, tests/ and configs/ to a temporary folder (the working tree is never touched). There
it first runs, unmutated, every test the chosen mutants name (all must pass), then for each
mutant plants the defect and runs

    python -m pytest -x -q -p no:cacheprovider --hypothesis-seed=0 <the mutant's tests>

(-x: the first failure ends the run; the seed makes the fuzz tests the same every run.)
A failing test means the mutant was caught; a passing run means it was missed; a run past
TIMEOUT counts as caught. Prints one line per mutant, then "caught N of M"; exits 1 if any
mutant was missed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 600  # seconds per pytest run; a mutant that hangs counts as caught
FOLDERS = ("nanorl", "bench", "data", "envs", "tests", "configs")  # data/: tasks.py, generated splits

LP, RL, MD = "losses.py", "rl.py", "model.py"
ORACLE = ("tests/test_explore.py",)  # the oracle, visits, losing states, NSR and the bonus: one file
VISITS = LOSING = SIGNED = BONUS = ORACLE
PF, OP, DI = "nanorl/pref.py", "nanorl/offpolicy.py", "nanorl/distill.py"
LOSS, ADV = ("tests/test_losses.py",), ("tests/test_advantages.py",)
LOSS_TESTS = LOSS + ADV
PREF, TOOLS, MODEL = ("tests/test_pref.py",), ("tests/test_tools.py",), ("tests/test_model.py",)
OFF, VERIFY = ("tests/test_offpolicy.py",), ("tests/test_verify.py",)
T, O, R = "tests/test_tools.py::test_", "tests/test_offpolicy.py::test_", "tests/test_rl.py::test_"
GAP = (T + "gae_and_return_to_go_carry_across_an_environment_span_by_hand",)
LAST = (T + "the_score_lands_on_the_last_action_token",)
CALC = (T + "calculator_bounds_by_hand", T + "calculator_is_total_and_follows_its_grammar",
        T + "calls_past_the_limit_and_specials_get_the_error_token")
FORCED = (T + "forced_results_count_against_max_new_tokens_by_hand",
          T + "sampler_forces_the_results_and_matches_the_trainer_with_and_without_cache")
COUNTS = (T + "episode_counts_skip_the_padding_the_sampler_leaves",
          T + "episode_metrics_count_turns_invalid_turns_and_environment_tokens")
PNPO_GAP = (T + "pnpo_counts_only_the_policys_tokens_by_hand",)
TOOL_ROLLOUT = (T + "rollout_keeps_the_environments_tokens_in_each_response",)
AT_TEMPERATURE = (O + "stale_batch_at_a_temperature_recomputes_pi_old_at_it",)
OFF_MASK = (O + "logp_mismatch_reads_only_the_policys_tokens",)
GRADE = (R + "the_same_response_under_two_prompts_gets_each_prompts_grade",)
MISMATCH = (R + "tempered_sampling_matches_training_and_dropout_is_off",)  # sft + 3 rl steps
AS, A = "nanorl/asyncrl.py", "tests/test_async.py::test_"
ASYNC_SAME = (A + "async_gives_the_simulated_stalenesss_weights_bit_for_bit",)
ASYNC_INFLIGHT = (A + "inflight_swaps_weights_between_decode_steps_and_keeps_the_cache",)
LOG, LG = "nanorl/rollout_log.py", "tests/test_rollout_log.py::test_"
LOG_FIELDS = (LG + "the_log_holds_the_rollout_and_the_advantages_the_update_took",)
LOG_REPLAY = (LG + "replay_gives_the_logged_runs_weights",)
EV, DDP, EP = "nanorl/evaluate.py", "tests/test_ddp.py::test_", "nanorl/episodes.py"
TP, BP, TM = "nanorl/templates.py", "nanorl/bpe.py", "tests/test_templates.py::test_"
STOPS = (TM + "a_stop_across_four_tokens_ends_the_turn_at_its_last",
         TM + "a_stop_that_ends_inside_a_longer_token_keeps_the_whole_token")
X = "tests/test_explore.py::test_"
M = "tests/test_model.py::test_"
EXPLORE_REFUSED = (X + "exploration_flags_a_run_would_ignore_are_refused",)
REWRITES = (TM + "templates_that_rewrite_earlier_turns_or_pad_the_stop_are_refused",)
SPLIT_STOP = (TM + "every_tokenization_of_a_one_token_stop_ends_the_turn_alike",)
MALFORMED = (TM + "two_stops_or_a_stop_then_eos_are_malformed_and_eos_alone_ends_the_answer",)
GOLDEN = (TM + "each_templates_three_turn_rendering_is_golden",)
DEMO_FORCED = (TM + "a_demonstration_is_the_row_the_sampler_makes_when_its_turns_are_forced",)
TL, E = "envs/calculator.py", "tests/test_envs.py::test_"
TU, TT = "nanorl/turns.py", "tests/test_turns.py::test_"
PASS_K = ("tests/test_losses.py::test_pass_k_advantages_by_hand_and_by_every_subset",)
VINE = (TT + "branches_of_a_deterministic_policy_reproduce_each_episodes_return_to_go",
        TT + "each_prefix_gets_k_continuations_from_its_replayed_state")
STEP = (TT + "gigpo_advantage_of_three_turn_episodes_by_hand", TT + "gigpo_keys_each_turn_on_the_state_it_starts_from")
GAME = (E + "the_game_by_hand", E + "every_output_gets_an_answer_and_counts_a_turn",
        E + "process_reward_is_the_share_of_the_interval_ruled_out")
BOUNDS = (E + "observations_are_cut_to_max_obs_and_episodes_end_after_max_turns",)
SECRETS = (E + "rows_of_one_text_split_when_their_secrets_answer_differently",)
REPLAY = (E + "every_demonstration_replays_through_the_environment",)
ENV_SAMPLER = (E + "sampler_runs_a_state_per_row_and_matches_the_trainer",)
ROLLOUT_TURNS = (E + "rollout_puts_the_turns_rewards_in_the_return",)
TOKEN_TURNS = (E + "token_rows_see_every_turns_reward_at_its_position_across_the_gaps",)
SPLIT = (T + "the_reward_reads_the_text_after_the_environments_last_token",)
EVAL_KL = (T + "eval_kl_and_length_count_only_the_policys_tokens_by_hand",)
RG = "tests/test_rg.py::"
RG_SPLITS = (RG + "test_splits_are_disjoint_and_deduplicated_on_a_real_generator",)
RG_SCORE = (RG + "test_the_generators_score_is_the_reward_partial_credit_included",)
JSONL = ("tests/test_task.py::test_a_jsonl_task_through_sft_rl_and_sample",
         "tests/test_task.py::test_a_bad_jsonl_line_is_one_error_naming_file_and_line")
TOKEN_MEAN = (T + "the_token_mean_divides_by_the_policys_tokens_by_hand",)
TK, RE, DOC = "tests/test_task.py::test_", "tests/test_reliability.py::test_", "tests/test_docs.py::test_"
GOLDS = (TK + "a_gold_answer_the_verifier_cannot_accept_stops_the_load",)
RL_GOLDS = (TK + "rl_checks_the_gold_answers_of_files_changed_after_sft",)
SPACES = (TK + "an_answer_keeps_its_surrounding_spaces",)
NEAR = (TK + "val_and_test_prompts_that_reorder_a_train_prompt_get_one_warning",)
SEPARATORS = (TK + "a_raw_line_separator_inside_a_json_string_is_valid_jsonl",)
EMPTY = (TK + "a_bad_jsonl_line_is_one_error_naming_file_and_line",)
TWINS = (RG + "test_no_held_out_question_is_a_train_question_in_another_order_or_wording",)
NO_GOLD = (RG + "test_a_generator_without_gold_answers_is_refused_in_one_line",)
RESUME = (RE + "resume_refuses_settings_that_change_what_is_trained",
          E + "resume_without_the_runs_env_args_is_refused")
EVAL_RESUME = (RE + "resume_at_an_eval_step_evaluates_it_once",)
BEST = (RE + "best_pt_holds_the_first_eval_of_the_best_val_accuracy",)
ROWS_REPLAY = (E + "every_row_replays_through_its_own_groups_secret",)
RETURN = (E + "episode_return_is_the_score_plus_the_turns_rewards_by_hand",)
SAMPLE_ANSWER = (E + "sample_plays_the_game_of_a_given_secret", DOC + "every_command_runs_on_tiny_settings")
SELECTION = (R + "prompt_selection_skips_the_groups_dynamic_sampling_found_flat",)
CONTRACT = (E + "an_environment_that_breaks_the_contract_stops_the_load_in_one_line",)
DYNAMIC = (R + "dynamic_sampling_is_decided_once_in_check",)
VW, VB = "nanorl/view.py", "tests/test_view_browser.py::test_"
HOSTILE_PAGE = (VB + "hostile_prompts_reach_the_page_as_text_and_every_group_is_drawn",)
STOP = (A + "a_stop_signal_to_the_group_saves_the_step_and_exits_0",)
FITS = (LG + "replay_refuses_a_log_that_does_not_fit_in_one_line",)
RANKS_LOG = (LG + "torchrun_logs_every_ranks_rows_and_replays_each_rank_its_own",)
OWN_STATS = (A + "an_async_runs_log_holds_each_rollouts_own_sampling_stats",)
MUTANTS = [  # (file, old, new, what it breaks, the tests that should catch it)
    # reductions, log-probs, entropy
    (LP, "x = torch.where(mask.bool(), x, 0.0)", "x = x * mask",
     "masked_sum multiplies padding by 0", LOSS),
    (LP, "masked_sum(x, mask, dim) / count.clamp_min(1)", "masked_sum(x, mask, dim) / count",
     "masked_mean: empty selection gives NaN", LOSS),
    (LP, "else mask.bool().sum(dim)", "else torch.tensor(float(mask.shape[-1]))",
     "masked_mean along dim divides by T, not the masked count", LOSS),
    (MD, "labels = torch.where(mask.bool(), labels, 0)", "labels = labels",
     "token_logps gathers padding ids", LOSS),
    (MD, "torch.float32)) / temperature", "torch.float32)) * temperature",
     "token_logps: temperature multiplies", LOSS),
    (MD, "- z.logsumexp(-1)", "- z.max(-1).values", "token_logps: unnormalised log-softmax", LOSS),
    (LP, "return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)",
     "return (p * torch.where(p > 0, logp, 0.0)).sum(-1)", "token_entropy: sign", LOSS),
    (LP, "F.log_softmax(logits.float() / temperature, dim=-1)",
     "F.log_softmax(logits.float(), dim=-1)", "token_entropy ignores the temperature", LOSS),
    (MD, "(z / temperature if logits else None)", "(z if logits else None)",
     "logprobs: logits (gkd, PPO's entropy) not tempered", OFF),
    # group_advantages
    (LP, "adv = centred / (rewards.std(-1, correction=0, keepdim=True) + eps)",
     "adv = centred / (rewards.std(-1, correction=1, keepdim=True) + eps)",
     "group_advantages: sample std", LOSS_TESTS),
    (LP, "adv = centred * G / (G - 1)", "adv = centred * (G - 1) / G",
     "group_advantages: rloo factor inverted", LOSS_TESTS),
    (LP, "centred = rewards - mean  # (P, G)", "centred = rewards - rewards.mean()  # (P, G)",
     "group_advantages: batch mean, not group mean", LOSS_TESTS),
    (LP, "same = (rewards == rewards[..., :1]).all(-1, keepdim=True)",
     "same = (rewards == rewards[..., :1]).any(-1, keepdim=True)",
     "group_advantages: zeroes every group", LOSS_TESTS),
    (LP, "        adv = centred\n    elif", "        adv = rewards\n    elif",
     "group_advantages: mean kind without baseline", LOSS_TESTS),
    (LP, "adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)",
     "adv = torch.where(mean > 0, centred, 0.0)",
     "maxrl advantage: not divided by the pass rate", LOSS_TESTS),
    (LP, "adv = torch.where(mean > 0, centred / torch.where(mean > 0, mean, 1.0), 0.0)",
     "adv = centred / torch.where(mean > 0, mean, 1.0)",
     "maxrl advantage: mean <= 0 not zeroed", LOSS_TESTS),
    # gae, kl
    (LP, "delta = rewards[:, t] + gamma * next_value - values[:, t]",
     "delta = rewards[:, t] + next_value - values[:, t]", "gae: undiscounted bootstrap",
     LOSS_TESTS),
    (LP, "delta + gamma * lam * next_adv", "delta + lam * next_adv",
     "gae: gamma dropped from the trace", LOSS_TESTS),
    (LP, "next_value = torch.where(m[:, t], values[:, t], next_value)",
     "next_value = values[:, t]", "gae: bootstraps from padding values", LOSS_TESTS + GAP),
    (LP, "next_value = torch.where(m[:, t], values[:, t], next_value)",
     "next_value = torch.where(m[:, t], values[:, t], 0.0)",
     "gae: an environment span resets the next value to 0", GAP + LOSS_TESTS),
    (LP, "delta + gamma * lam * next_adv, next_adv)", "delta + gamma * lam * next_adv, 0.0)",
     "gae: an environment span resets the advantage trace", GAP + LOSS_TESTS),
    (LP, "torch.where(m, adv + values, 0.0)", "torch.where(m, adv, 0.0)",
     "gae: value targets without V", LOSS_TESTS),
    (LP, "x = (ref_logp - logp).clamp(-20.0, 20.0)", "x = ref_logp - logp",
     "kl_estimate: log-ratio not clamped", LOSS),
    (LP, '"k1": -x,', '"k1": x,', "kl_estimate: k1 sign", LOSS),
    (LP, '"k2": 0.5 * x * x', '"k2": x * x', "kl_estimate: k2 without 1/2", LOSS),
    (LP, '"k3": torch.expm1(x) - x', '"k3": torch.expm1(x) + x', "kl_estimate: k3 sign of x",
     LOSS),
    (LP, '-beta * kl_estimate(logp, ref_logp, "k1")', '-beta * kl_estimate(logp, ref_logp, "k3")',
     "kl_in_reward: k3, not k1", LOSS_TESTS),
    (LP, '-beta * kl_estimate(logp, ref_logp, "k1")', 'beta * kl_estimate(logp, ref_logp, "k1")',
     "kl_in_reward: KL rewarded", LOSS_TESTS),
    (LP, "return mask.shape[1] - 1 - mask.flip(1).int().argmax(1)",
     "return mask.shape[1] - 2 - mask.flip(1).int().argmax(1)",
     "last_token (kl_in_reward): score on the wrong token", LOSS_TESTS),
    (LP, "return mask.shape[1] - 1 - mask.flip(1).int().argmax(1)",
     "return (mask.sum(1) - 1).clamp_min(0)",
     "last_token (kl_in_reward): score at the action count, not the last action (tools)", LAST + LOSS_TESTS),
    (LP, "torch.exp(F.pad(logp, (1, 0))[:, :-1].cumsum(1))", "torch.exp(logp.cumsum(1))",
     "prefix_prob includes the current token", LOSS),
    # whiten, explained variance, adaptive KL, cliff
    (LP, "return masked_mean((x - masked_mean(x, mask)) ** 2, mask)",
     "return masked_mean(x ** 2, mask)", "masked_var: uncentred", LOSS),
    (LP, "(x - mean) * torch.rsqrt(var + eps)", "(x - mean) / (var + eps)",
     "whiten: divides by the variance", LOSS_TESTS),
    (LP, "torch.where(m, (x - mean) * torch.rsqrt", "torch.where(m, x * torch.rsqrt",
     "whiten: not centred", LOSS_TESTS),
    (LP, "var = masked_var(x, m) if var is None", "var = masked_var(x, m) * 2 if var is None",
     "whiten: wrong batch variance", LOSS),
    (RL, "/ losses.masked_var(targets, mask).clamp_min(1e-8)",
     "/ losses.masked_var(values, mask).clamp_min(1e-8)", "explained_variance: wrong denominator",
     LOSS),
    (LP, "return beta * (1 + min(", "return beta * (1 - min(", "adaptive_beta: sign", LOSS),
    (LP, "0.2) * n / horizon)", "0.2))", "adaptive_beta: ignores n / horizon", LOSS),
    (LP, "sd = rewards.std(-1, correction=0, keepdim=True)",
     "sd = rewards.std(-1, correction=1, keepdim=True)", "cliff_advantages: sample std",
     LOSS_TESTS),
    (LP, "(-mu / sd)[..., None]", "(mu / sd)[..., None]", "cliff_advantages: a_bad sign",
     LOSS_TESTS),
    (LP, "before = t < first_wrong", "before = t <= first_wrong",
     "cliff_advantages: first wrong token off by one", LOSS_TESTS),
    (LP, "torch.where(before, lam * a_good, a_bad)", "torch.where(before, a_good, a_bad)",
     "cliff_advantages: ignores lam", LOSS_TESTS),
    (LP, "adv = adv - masked_mean(adv.expand(m.shape), m, dim=(1, 2))[:, None, None]",
     "adv = adv - adv.expand(m.shape).mean((1, 2))[:, None, None]",
     "cliff_advantages: centred over padding", LOSS_TESTS),
    # clip, sequence ratios
    (LP, "ratio.clamp(min=1 - eps_low).clamp(max=1 + eps_high)",
     "ratio.clamp(min=1 - eps_high).clamp(max=1 + eps_low)",
     "clip_objective: eps_low / eps_high swapped", LOSS),
    (LP, "obj = torch.minimum(ratio * adv, clipped * adv)",
     "obj = torch.maximum(ratio * adv, clipped * adv)", "clip_objective: max, not min", LOSS),
    (LP, "low = (adv < 0) & (ratio < 1 - eps_low)", "low = (adv > 0) & (ratio < 1 - eps_low)",
     "clip_objective: low flag on the wrong side", LOSS),
    (LP, "dual = (adv < 0) & (obj < clip_c * adv)", "dual = (adv < 0) & (obj > clip_c * adv)",
     "clip_objective: dual clip inverted", LOSS),
    (LP, 'hp.get("clip_c"))\n    return obj, _stats(ratio, m, low, high)',
     'None)\n    return obj, _stats(ratio, m, low, high)', "clip: drops clip_c", LOSS),
    (LP, "s = torch.exp(masked_mean(logp - old_logp, m, dim=1))",
     "s = torch.exp(masked_sum(logp - old_logp, m, dim=1))",
     "gspo: sequence ratio a product, not a geometric mean", LOSS),
    (LP, 'clip_objective(s, adv, hp["eps_low"], hp["eps_high"]',
     'clip_objective(s, adv, hp["eps_low"], hp["eps_low"]', "gspo/gapo: eps_low as eps_high",
     LOSS),
    # loss(): padding, constants, the in-loss KL
    (LP, "torch.where(m, logp, 0.0), torch.where(m, old_logp",
     "logp * m, torch.where(m, old_logp", "loss multiplies padding logp by 0", LOSS),
    (LP, "torch.where(m, old_logp.detach(), 0.0)", "torch.where(m, old_logp, 0.0)",
     "loss: old_logp not detached", LOSS),
    (LP, "torch.where(m, ref_logp.detach(), 0.0)", "torch.where(m, ref_logp, 0.0)",
     "loss: ref_logp not detached", LOSS),
    (LP, "adv.detach(), m, hp, **inputs)", "adv, m, hp, **inputs)", "loss: advantages not detached",
     LOSS),
    (LP, '0.0), hp["kl_estimator"])', '0.0), "k3")', "loss: in-loss KL ignores kl_estimator",
     LOSS),
    (LP, 'kl = kl_estimate(logp, torch.where(m, ref_logp.detach(), 0.0), hp["kl_estimator"])',
     'kl = kl_estimate(torch.where(m, ref_logp.detach(), 0.0), logp, hp["kl_estimator"])',
     "loss: in-loss KL(ref || pi), arguments swapped", LOSS),
    (LP, 'out = out + hp["beta"] * aggregate(', 'out = out - hp["beta"] * aggregate(',
     "loss: in-loss KL sign", LOSS),
    (LP, 'hp["beta"] * aggregate(kl, m, algo.agg, **counts)',
     'hp["beta"] * aggregate(kl, m, SUM, **counts)',
     "loss: in-loss KL summed over tokens, not the row's aggregation", LOSS),
    # aggregate
    (LP, "n_seqs = n_seqs or mask.shape[0]", "n_seqs = mask.shape[0]",
     "aggregate: ignores the global n_seqs", LOSS),
    (LP, "masked_mean(x, mask, dim=1)).sum() / n_seqs",
     "masked_sum(x, mask, dim=1)).sum() / n_seqs",
     "aggregate SEQ: token sum, not the per-sequence mean", LOSS),
    (LP, "masked_sum(x, mask) / (n_tokens or mask.bool().sum().clamp_min(1))",
     "masked_sum(x, mask) / mask.bool().sum().clamp_min(1)",
     "aggregate TOK: ignores the global n_tokens", LOSS),
    (LP, "(n_seqs * (max_len or mask.shape[1]))", "(n_seqs * mask.shape[1])",
     "aggregate NORM: batch width, not max_new_tokens (dr_grpo)", LOSS),
    # the objectives
    (LP, 'obj = obj + hp["ent_coef"] * entropy', 'obj = obj - hp["ent_coef"] * entropy',
     "ppo: entropy bonus sign", LOSS),
    (LP, "err = torch.maximum(err, (v_clip - targets) ** 2)",
     "err = torch.minimum(err, (v_clip - targets) ** 2)",
     "ppo: value clip takes the smaller error", LOSS),
    (LP, '.clamp(-hp["vf_clip"], hp["vf_clip"])', '.clamp(-2 * hp["vf_clip"], 2 * hp["vf_clip"])',
     "ppo: value clip range doubled", LOSS),
    (LP, 'obj = obj - hp["vf_coef"] * 0.5 * err', 'obj = obj - hp["vf_coef"] * err',
     "ppo: value loss without 1/2", LOSS),
    (LP, "old_values.detach(), value_targets.detach()", "old_values.detach(), value_targets",
     "ppo: value targets not detached", LOSS),
    (LP, 'obj = obj - hp["vf_coef"] * 0.5 * err', 'obj = obj - hp["vf_clip"] * 0.5 * err',
     "ppo: vf_clip used as vf_coef", LOSS),
    (LP, "adv = torch.where((c > 0) & (c < G), adv, 0.0)", "adv = torch.where(c > 0, adv, 0.0)",
     "gapo: all-correct groups keep their advantage", LOSS),
    (LP, "* (G - c) / (G - 1)", "* (G - c) / G", "gapo: eps_high bound divides by G", LOSS),
    (LP, 'hp["eps_low"]) * (G - c)', 'hp["eps_low"]) * c', "gapo: bound reversed in c", LOSS),
    (LP, "dict(hp, eps_high=eps_high))", "hp)", "gapo: calls gspo without its own eps_high",
     LOSS),
    (LP, 'tau = torch.where(A > 0, hp["tau_pos"], hp["tau_neg"])',
     'tau = torch.where(A > 0, hp["tau_neg"], hp["tau_pos"])', "sapo: tau_pos / tau_neg swapped",
     LOSS),
    (LP, "return 4 / tau * torch.sigmoid", "return 2 / tau * torch.sigmoid",
     "sapo: gate scale 2/tau", LOSS),
    (LP, 'obj = ratio.clamp(max=hp["eps_max"]).detach() * _tok(adv, m) * logp',
     'obj = ratio.clamp(max=hp["eps_max"]) * _tok(adv, m) * logp',
     "cispo: weight not detached", LOSS),
    (LP, 'obj = ratio.clamp(max=hp["eps_max"]).detach() * _tok(adv, m) * logp',
     "obj = ratio.detach() * _tok(adv, m) * logp", "cispo: weight not capped", LOSS),
    (LP, "w = torch.exp(d.cumsum(1) / t)", "w = torch.exp(d.cumsum(1))",
     "pnpo: prefix ratio a product", LOSS),
    (LP, "h = torch.sqrt(m.sum(1, keepdim=True) / t)", "h = torch.sqrt(t / m.sum(1, keepdim=True))",
     "pnpo: length weight inverted", LOSS),
    (LP, 'low, high = w < 1 - hp["eps_low"] * h, w > 1 + hp["eps_high"] * h',
     'low, high = w < 1 - hp["eps_high"] * h, w > 1 + hp["eps_low"] * h',
     "pnpo: eps_low / eps_high swapped", LOSS),
    (LP, "torch.where(low | high, 0.0, w *", "torch.where(high, 0.0, w *",
     "pnpo: no lower gate", LOSS),
    (LP, "d = (logp - old_logp).detach()", "d = logp - old_logp",
     "pnpo: prefix weight not detached", LOSS),
    (LP, "t = m.cumsum(1).clamp_min(1)", "t = m.cumsum(1) + 1", "pnpo: t counted from 2", LOSS),
    (LP, "t = m.cumsum(1).clamp_min(1)", "t = torch.arange(1, m.shape[1] + 1, device=m.device)",
     "pnpo: t counts the environment's tokens too", PNPO_GAP + LOSS),
    (LP, "ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))",
     "ell = torch.where(A > 0, torch.maximum(d, lim), torch.minimum(d, lim))",
     "gmpo: clip sides swapped", LOSS),
    (LP, "ell = torch.where(A > 0, torch.minimum(d, lim), torch.maximum(d, lim))", "ell = lim",
     "gmpo: every token clamped (no sign-aware min/max)", LOSS),
    (LP, "torch.exp(masked_mean(ell, m, dim=1)) * adv, 0.0)",
     "torch.exp(masked_sum(ell, m, dim=1)) * adv, 0.0)", "gmpo: product, not geometric mean",
     LOSS),
    (LP, 'low, high = (A <= 0) & (d < -hp["eps_low"]), (A > 0) & (d > hp["eps_high"])',
     'low, high = (A <= 0) & (d < -hp["eps_high"]), (A > 0) & (d > hp["eps_low"])',
     "gmpo: clip fractions with swapped eps", LOSS),
    (LP, "dp = (logp.exp() - old_logp.exp()).detach()", "dp = (logp - old_logp).detach()",
     "dppo: log-ratio instead of probability change", LOSS),
    (LP, 'low, high = (A <= 0) & (dp < -hp["delta"]), (A > 0) & (dp > hp["delta"])',
     'low, high = (A <= 0) & (dp > hp["delta"]), (A > 0) & (dp < -hp["delta"])',
     "dppo: trust region on the wrong sides", LOSS),
    (LP, 'ratio.clamp(max=hp["is_cap"]).detach() * A * logp', "ratio.detach() * A * logp",
     "dppo: weight not capped", LOSS),
    (LP, 'ratio.clamp(max=hp["is_cap"]).detach() * A * logp',
     'ratio.clamp(max=hp["is_cap"]) * A * logp', "dppo: weight not detached", LOSS),
    (LP, "torch.where(cov_mask.bool(), 0.0, obj)", "obj", "clip_cov: chosen tokens keep their loss",
     LOSS),
    (LP, 'hp["cov_kl_coef"] * (logp - old_logp).abs()', 'hp["cov_kl_coef"] * (logp - old_logp)',
     "kl_cov: signed, not absolute, log-ratio penalty", LOSS),
    (LP, 'hp["cov_kl_coef"] * (logp - old_logp).abs()',
     'hp["cov_kl_coef"] * (logp - old_logp).abs().detach()', "kl_cov: penalty without gradient",
     LOSS),
    (LP, "return ratio * _tok(adv, m), _stats(ratio, m)",
     "return _tok(adv, m) * logp, _stats(ratio, m)", "opd (ratio_pg): A logp, not rA", OFF),
    (LP, "div = kl(lp, lq) if b == 1 else kl(lq, lp)", "div = kl(lq, lp) if b == 1 else kl(lp, lq)",
     "gkd: gkd_beta 1 takes the forward KL", OFF),
    (LP, "div = b * kl(lq, lm) + (1 - b) * kl(lp, lm)",
     "div = (1 - b) * kl(lq, lm) + b * kl(lp, lm)", "gkd: JSD weights swapped", OFF),
    # cov selection
    (LP, "cov = (adv - masked_mean(adv, m)) * (logp - masked_mean(logp, m))",
     "cov = adv * logp", "cov_select: covariance not centred", LOSS),
    (LP, "ok = m & ~low & ~high & (cov", "ok = m & (cov",
     "cov_select: clip_cov takes tokens the clip already cut", LOSS),
    (LP, 'n = max(int(hp["cov_ratio"] * int(m.sum())), 1)',
     'n = int(hp["cov_ratio"] * int(m.sum()))', "cov_select: no minimum of one token", LOSS),
    # the ALGOS rows: advantage and aggregation columns
    (LP, '"grpo": Algo(objective=clip, advantage="std"', '"grpo": Algo(objective=clip, advantage="mean"',
     "ALGOS: grpo gets the mean advantage", ADV),
    (LP, '"rloo": Algo(objective=pg, advantage="rloo"', '"rloo": Algo(objective=pg, advantage="mean"',
     "ALGOS: rloo gets the mean advantage", ADV),
    (LP, '"dr_grpo": Algo(objective=clip, advantage="mean"', '"dr_grpo": Algo(objective=clip, advantage="std"',
     "ALGOS: dr_grpo gets the std advantage", ADV),
    (LP, '"gapo": Algo(objective=gapo, advantage="mean"', '"gapo": Algo(objective=gapo, advantage="std"',
     "ALGOS: gapo gets the std advantage", ADV),
    (LP, '"reinforce_pp": Algo(objective=clip, advantage="rpp"', '"reinforce_pp": Algo(objective=clip, advantage="std"',
     "ALGOS: reinforce_pp gets GRPO's advantage", ADV),
    (LP, '"reinforce_pp": Algo(objective=clip, advantage="rpp"', '"reinforce_pp": Algo(objective=pg, advantage="rpp"',
     "ALGOS: reinforce_pp without its clip", LOSS),
    (LP, '"dapo": Algo(objective=clip, advantage="std", kl="loss", agg=TOK, overlong=2,',
     '"dapo": Algo(objective=clip, advantage="std", kl="loss", agg=TOK, overlong=0,',
     "ALGOS: dapo without overlong shaping", ADV),
    (LP, '"reinforce": Algo(objective=pg, advantage="mean", kl="reward", agg=SUM',
     '"reinforce": Algo(objective=pg, advantage="mean", kl="reward", agg=TOK',
     "ALGOS: reinforce divides by tokens", LOSS),
    (LP, '"grpo": Algo(objective=clip, advantage="std", kl="loss", agg=SEQ', '"grpo": Algo(objective=clip, advantage="std", kl="loss", agg=SUM',
     "ALGOS: grpo sums tokens, no per-sequence mean", LOSS),
    (LP, '"dapo": Algo(objective=clip, advantage="std", kl="loss", agg=TOK', '"dapo": Algo(objective=clip, advantage="std", kl="loss", agg=SUM',
     "ALGOS: dapo divides by sequences, not tokens", LOSS),
    (LP, '"ppo": Algo(objective=ppo, advantage="gae", kl="reward", agg=TOK', '"ppo": Algo(objective=ppo, advantage="gae", kl="reward", agg=SUM',
     "ALGOS: ppo divides by sequences", LOSS),
    (LP, '"sapo": Algo(objective=sapo, advantage="std", kl="loss", agg=SEQ', '"sapo": Algo(objective=sapo, advantage="std", kl="loss", agg=TOK',
     "ALGOS: sapo a token mean over the batch", LOSS),
    (LP, '"dppo": Algo(objective=dppo, advantage="std", kl="loss", agg=TOK', '"dppo": Algo(objective=dppo, advantage="std", kl="loss", agg=SUM',
     "ALGOS: dppo divides by sequences, not tokens", LOSS),
    (LP, '"maxrl": Algo(objective=pg, advantage="maxrl", kl=None, agg=SEQ', '"maxrl": Algo(objective=pg, advantage="maxrl", kl=None, agg=SUM',
     "ALGOS: maxrl token sum, not the per-sequence mean", LOSS),
    (LP, '"remax": Algo(objective=pg, advantage="greedy", kl="reward", agg=TOK', '"remax": Algo(objective=pg, advantage="greedy", kl="reward", agg=SUM',
     "ALGOS: remax divides by sequences, not tokens", LOSS),
    # rl.py's advantage kinds and the stage around them
    (RL, 'R = losses.group_advantages(R.view(-1, G), "mean").flatten()',
     'R = losses.group_advantages(R.view(-1, G), "std").flatten()',
     "token_kind: reinforce_pp_baseline divides by the group std", ADV),
    (RL, "if gae else (1.0, 1.0)\n", "if gae else (1.0, 0.0)\n",
     "token_kind: reinforce_pp one-step rewards, not returns to go", ADV),
    (RL, "return batch.reward - batch.baseline, {}",
     "return batch.reward, {}", "greedy_kind: remax without its greedy baseline",
     ADV),
    (RL, "ref = batch.ref_logp if beta else batch.old_logp", "ref = batch.ref_logp",
     "token_kind: ppo needs a reference at beta 0", ADV),
    (RL, '(run.hp["gamma"], run.hp["lam"])', '(run.hp["lam"], run.hp["gamma"])', "token_kind: gamma / lam swapped",
     ADV),
    (RL, "adv = losses.whiten(adv, m, s / n, s2 / n - (s / n) ** 2)", "adv = adv",
     "token_kind: ppo not whitened", ADV),
    (RL, "dict(old_values=v, value_targets=targets)", "dict(old_values=v, value_targets=adv)",
     "token_kind: ppo value targets are the advantages", ADV),
    (RL, 'if algo.kl == "reward" and hp["beta"] and', 'if algo.kl == "reward" and hp["beta"] < 0 and',
     "advantages_of: reinforce KL in reward skipped", ADV),
    (RL, 'run.hp["beta"]).sum(1)  # (N,)', 'run.hp["beta"]).mean(1)  # (N,)',
     "kl_in_the_reward: KL in reward averaged over T", ADV),
    (RL, "batch.ref_logp,\n                                     batch.mask, run.hp",
     "batch.ref_logp,\n                                     torch.ones_like(batch.mask), run.hp",
     "kl_in_the_reward: KL counts padding", ADV),
    (RL, ".sum(1).repeat_interleave(G)", ".sum(1).repeat(G)", "group_kind: gapo counts misaligned",
     ADV),
    (RL, 'algo.advantage not in (*TOKEN_KINDS, "signed")', "algo.advantage not in TOKEN_KINDS",
     "advantages_of: signed kinds take the KL twice (in the reward, then per token)",
     ("tests/test_explore.py::test_signed_rows_take_the_kl_once_and_per_token_by_hand",)),
    (RL, "batch.mask,\n                                  cfg.temperature, max_rows",
     "batch.mask,\n                                  1.0, max_rows",
     "reference_first: the reference at temperature 1, not the sampling temperature",
     ("tests/test_rl.py::test_the_reference_reads_the_rollout_at_the_sampling_temperature",)),
    (RL, 'rollout_metrics(batch, inputs.get("value_targets"), run.hp.get("beta"))',
     'rollout_metrics(batch, None, run.hp.get("beta"))',
     "after_step: PPO's value fit not logged", ("tests/test_ppo_rm.py",)),
    (RL, "if rollout_log.due(run.state.step, cfg, batch):",
     "if rollout_log.due(run.state.step + 1, cfg, batch):",
     "after_step: the rollout log one step off", (LG + "by_default_two_groups_of_the_first_step_and_every_log_every_steps",)),
    (RL, "offpolicy.Lab(pg_step, collect) if offpolicy.on(cfg) else pg_step", "pg_step",
     "train_step: --staleness and the lab's flags never open the lab", OFF),
    # rl.rollout, rl.scored, rl.pg_step
    (RL, 'out["action_mask"][:, P:]', 'out["action_mask"][:, P - 1:-1]',
     "scored: action mask off by one", TOOL_ROLLOUT + MISMATCH),
    (RL, 'length=out["response_mask"][:, P:].sum(1)', 'length=out["action_mask"][:, P:].sum(1)',
     "scored: a response's length without the environment's tokens", TOOL_ROLLOUT),
    (RL, "key = (r // G, *ids)", "key = tuple(ids)",
     "scored: grading key without the prompt index", GRADE),
    (RL, "lp, part.old_logp, adv[ub]", "lp, part.mu, adv[ub]",
     "pg_step: the ratio anchored at mu, not the recomputed pi_old", OFF),
    (RL, "sampler_gap(lp.detach(), logits.detach(), part.mu, part.mask)", "sampler_gap(lp.detach(), logits.detach(), part.old_logp, part.mask)",
     "pg_step: logp_mismatch against pi_old, not mu", OFF),
    (RL, "d = (lp - mu).abs() * m", "d = (lp - mu).abs()",
     "sampler_gap: logp_mismatch counts tokens off the action mask", OFF_MASK),
    (OP, "if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:", "if cfg.staleness or cfg.bf16:",
     "Lab: a bf16 sampler's pi_old not recomputed", OFF),
    (OP, "if cfg.staleness or cfg.sampler_bf16 or cfg.bf16:",
     "if cfg.staleness or cfg.sampler_bf16:", "Lab: a bf16 run's pi_old not recomputed",
     ("tests/test_offpolicy.py::test_a_bf16_run_trains_from_the_trainers_pi_old",)),
    # off-policy, distillation
    (OP, "return queue.popleft() if len(queue) > staleness",
     "return queue.pop() if len(queue) > staleness",
     "stale: trains on this step's rollout, not k steps earlier", OFF),
    (OP, "batch.mask, cfg.temperature,\n                              max_rows=cfg.micro_batch_size)[0]",
     "batch.mask, 1.0,\n                              max_rows=cfg.micro_batch_size)[0]",
     "recompute: pi_old at temperature 1, not the sampling temperature", AT_TEMPERATURE + OFF),
    (OP, "gap = losses.masked_sum(batch.old_logp - batch.mu, batch.mask, 1).abs()",
     "gap = losses.masked_mean(batch.old_logp - batch.mu, batch.mask, 1).abs()",
     "recompute: the pi_old / mu gap a token mean, not the sequence sum", OFF),
    (LP, "x = torch.where(m, old_logp - mu_logp, 0.0)",
     "x = torch.where(m, mu_logp - old_logp, 0.0)",
     "rollout_weights: rho = mu / pi_old", OFF),
    (LP, 'x.sum(1, keepdim=True) if kind == "seq_tis"',
     'x.mean(1, keepdim=True) if kind == "seq_tis"',
     "rollout_weights: seq_tis a geometric mean, not the product", OFF),
    (LP, "cut, w = rho > cap, rho.clamp(max=cap)", "cut, w = rho > cap, rho",
     "rollout_weights: tis not capped", OFF),
    (LP, "cut = (rho > high) | (rho < low) if", "cut = (rho > high) if",
     "rollout_weights: icepop keeps the low ratios", OFF),
    (OP, "return adv * w[:, 0], inputs  # (N,)", "return adv, inputs  # (N,)",
     "weighed: a sequence-ratio algorithm left unweighted", OFF),
    (LP, "-(old_logp - teacher_lp).clamp(-bound, bound)", "(old_logp - teacher_lp).clamp(-bound, bound)",
     "distill: teacher advantage sign", OFF),
    (DI, "losses.teacher_advantages(batch.old_logp, lp", "losses.teacher_advantages(batch.mu, lp",
     "distill: advantage from mu, not the recomputed pi_old", OFF),
    (LP, "-(old_logp - teacher_lp).clamp(-bound, bound)", "-(old_logp - teacher_lp)",
     "distill: teacher advantage not clamped", OFF),
    (DI, "batch.ids, batch.offsets, batch.mask, cfg.temperature,\n                             logits", "batch.ids, batch.offsets, batch.mask, 1.0,\n                             logits",
     "distill: the teacher at temperature 1, not the sampling temperature", OFF),
    # preference losses (nanorl/pref.py), log1mexp, rm
    (LP, "(-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c)",
     "(-F.logsigmoid(m + gamma_beta_ratio * beta) - rpo_alpha * a_c)",
     "simpo: target margin added", PREF),
    (LP, "(-F.logsigmoid(m - gamma_beta_ratio * beta) - rpo_alpha * a_c)",
     "(-F.logsigmoid(m - gamma_beta_ratio * beta) + rpo_alpha * a_c)", "simpo: rpo NLL sign",
     PREF),
    (LP, "a_c, a_r = pi_chosen / chosen_len, pi_rejected / rejected_len  # (B,) each\n",
     "a_c, a_r = pi_chosen, pi_rejected\n", "simpo: sequence sums, not length-normalised", PREF),
    (LP, "return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats",
     "return (a_c - lam * F.logsigmoid(log_odds)).mean(), stats", "orpo: NLL sign", PREF),
    (LP, "log_odds = (a_c - a_r) - (log1mexp(a_c) - log1mexp(a_r))", "log_odds = a_c - a_r",
     "orpo: log-probability ratio, not log-odds ratio", PREF),
    (LP, "return (-a_c - lam * F.logsigmoid(log_odds)).mean(), stats",
     "return (-a_c - F.logsigmoid(log_odds)).mean(), stats", "orpo: lambda ignored", PREF),
    (LP, "torch.where(a > -0.6931, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))",
     "torch.where(a > -0.6931, torch.log1p(-torch.exp(a)), torch.log(-torch.expm1(a)))",
     "log1mexp: its two branches swapped", LOSS),
    (LP, "a = a.clamp(max=-1e-6)", "a = a", "log1mexp: a = 0 not clamped (orpo's -inf)",
     PREF + LOSS),
    (LP, "- label_smoothing * F.logsigmoid(-beta * m)",
     "+ label_smoothing * F.logsigmoid(-beta * m)",
     "dpo: label smoothing sign", PREF),
    (LP, "-(1 - label_smoothing) * F.logsigmoid(beta * m)", "-F.logsigmoid(beta * m)",
     "dpo: no (1 - eps) weight", PREF),
    (LP, "per_pair = (m - 1 / (2 * beta)) ** 2", "per_pair = (m - 1 / beta) ** 2",
     "ipo: target margin 1/beta", PREF),
    (LP, "per_pair = per_pair - rpo_alpha * pi_chosen / chosen_len",
     "per_pair = per_pair + rpo_alpha * pi_chosen / chosen_len", "dpo: rpo NLL sign", PREF),
    (LP, "m = chosen - rejected", "m = rejected - chosen", "dpo: margin sign", PREF),
    (LP, "chosen, rejected = pi_chosen - ref_chosen, pi_rejected - ref_rejected",
     "chosen, rejected = pi_chosen - ref_rejected, pi_rejected - ref_chosen",
     "dpo: references swapped (stats)", PREF),
    (LP, "lambda_d * (1 - torch.sigmoid(beta * (r - z))),\n                      lambda_u * (1",
     "lambda_u * (1 - torch.sigmoid(beta * (r - z))),\n                      lambda_d * (1",
     "kto: lambda_d / lambda_u swapped", PREF),
    (LP, ".mean().clamp_min(0).detach()", ".mean().detach()", "kto: z not clamped at 0", PREF),
    (LP, ".mean().clamp_min(0).detach()", ".mean().clamp_min(0)", "kto: z not detached", PREF),
    (LP, "lambda_u * (1 - torch.sigmoid(beta * (z - r)))",
     "lambda_u * (1 - torch.sigmoid(beta * (r - z)))", "kto: undesirable sign", PREF),
    (LP, "rpo_alpha * torch.where(d, pi_logp / length, 0.0)", "rpo_alpha * pi_logp / length",
     "kto: rpo NLL on undesirable answers too", PREF),
    (LP, "return per.mean(), {", "return per.sum(), {", "kto: sum, not mean over answers", PREF),
    (LP, "(n_tokens or m.sum().clamp_min(1))", "(n_tokens or m.shape[0])",
     "nll_loss: divides by sequences", LOSS),
    (LP, "-F.logsigmoid(d).mean()",
     "-torch.nn.functional.logsigmoid(-d).mean()", "bt_loss: sign", LOSS),
    # the sampler's prefix key, response_forward's grouping key
    (MD, "key = torch.where(done, -1, node * V + tok)", "key = torch.where(done, -1, tok)",
     "generate: live rows keyed by their token, not (prefix, token)", MODEL),
    (MD, "key = torch.where(done, -1, node * V + tok)", "key = node * V + tok",
     "generate: finished rows keep a live prefix", MODEL),
    (MD, "parent, node = live // V, node - (len(uniq) - len(live))",
     "parent, node = live // V, node",
     "generate: row -> prefix index not shifted past the finished key", MODEL),
    (MD, "rows = torch.cat([offsets[:, None], ids], 1)",
     "rows = torch.cat([0 * offsets[:, None], ids], 1)",
     "response_forward: row key without the padding offset", MODEL),
    (MD, "unique_consecutive(uniq[:, :1 + P]", "unique_consecutive(uniq[:, 1:1 + P]",
     "response_forward: prompt key without the padding offset", MODEL),
    # issue 65: the exact GELU, the heads only where read, one sampler call
    (MD, "approximate=self.approximate)", 'approximate="tanh")', "MLP: tanh GELU whatever the config",
     (M + "the_gelu_is_tanh_unless_asked_and_older_checkpoints_keep_it",)),
    (MD, 'gelu: str = "tanh"', 'gelu: str = "erf"', "GPTConfig: erf by default, older checkpoints too",
     (M + "the_gelu_is_tanh_unless_asked_and_older_checkpoints_keep_it",)),
    (MD, '"gelu_pytorch_tanh": "tanh", "gelu": "erf"}', '"gelu_pytorch_tanh": "tanh", "gelu": "tanh"}',
     "from_pretrained: HF's exact gelu loads as tanh", ("tests/test_hf.py",)),
    (MD, "index_add_(0, inv, used[:, 1:].to(uniq))", "index_add_(0, inv, used[:, :-1].to(uniq))",
     "response_forward: the heads one position off", (M + "the_heads_run_only_where_read",)),
    (MD, "index_add_(0, inv, used[:, 1:].to(uniq))",
     "index_add_(0, inv, used[:, :1].expand_as(used[:, 1:]).to(uniq))",
     "response_forward: the heads where the first token is read", (M + "the_heads_run_only_where_read",)),
    (MD, "LAST = (slice(None), -1)", "LAST = (slice(None), 0)",
     "generate, response_forward: the prompt's head at its first position", MODEL),
    (RL, "if cfg.sample_batch_size else len(idx)", "if cfg.sample_batch_size else G",
     "rollout: 0 samples G rows a call", (R + "sampler_calls_hold_at_most_sample_batch_size_rows",)),
    (EV, "if batch_size else n", "if batch_size else 1", "evaluate: 0 samples a prompt a call",
     (R + "sampler_calls_hold_at_most_sample_batch_size_rows",)),
    # tool use: the sampler's forced tokens, the calculator, action masks
    (MD, "logps.append(torch.where(act,", "logps.append(torch.where(~done,",
     "generate: a forced token gets the policy's log-prob, not 0", FORCED),
    (EP, "for q in self.queue.values()]).to(tok), False",
     "for q in self.queue.values()]).to(tok), True",
     "generate: forced tokens marked as the policy's actions", FORCED),
    (TL, r'_MUL = re.compile(rf"([0-9]{{1,{MAX_DIGITS}}})', r'_MUL = re.compile(rf"([0-9]+)',
     "calculator: a product's number of any length", CALC),
    (TL, r'_SUM = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}(', r'_SUM = re.compile(rf"[0-9]+(',
     "calculator: a sum's first number of any length", CALC),
    (TL, "{{1,{MAX_TERMS - 1}}}", "{{1,{MAX_TERMS}}}",
     "calculator: a sum of up to MAX_TERMS + 1 numbers", CALC),
    (TL, "self.calls <= MAX_CALLS", "self.calls <= MAX_CALLS + 1",
     "calculator: one call past MAX_CALLS", CALC),
    (TL, 'turn.rpartition("[")', 'turn.partition("[")',
     "calculator: the call from the first open, not the last", CALC),
    (TL, "return [f\"[{a}*{d}\" for d in reversed(b)]", "return [f\"[{a}*{d}\" for d in b]",
     "calculator's demo: the digits of b from the highest", TOOLS),
    # environments: turns, observations, their masks and rewards, the group's secret
    (TP, "if tok.special_ids.intersection(body):", "if False:",
     "read_turn: a special token inside a turn decoded away", CALC),
    (TP, 'return text[:hit[0]], "stop"', 'return text[:hit[1]], "stop"',
     "read_turn: the stop handed to the environment", GAME + STOPS),
    (EP, "turn = ids[self.start[r]:]", "turn = ids",
     "episodes: a turn from the response's start, earlier turns too", GAME),
    (EP, "self.template.turn(flip_numbers(text, self.reverse))), how  # normal order",
     "self.template.turn(text)), how  # normal order", "episodes: a reversed turn not turned back", CALC),
    (EP, "cut = tok.decode(tok.encode(flip_numbers(obs, reverse))[:env.max_obs])",
     "cut = tok.decode(tok.encode(flip_numbers(obs, reverse)))",
     "episodes: an observation longer than max_obs", BOUNDS),
    (EP, "obs = bridge(self.tok, self.template, env, obs, done or self.turns[r] >= env.max_turns,",
     "obs = bridge(self.tok, self.template, env, obs, done,", "episodes: no bound on the turns", BOUNDS),
    (EP, "return tok.encode(flip_numbers(text, reverse)) + ([tok.eos_id] if done else [])",
     "return tok.encode(flip_numbers(text, reverse))", "episodes: a finished episode not ended", GAME),
    (EP, "for row in problems for _ in range(G)]", "for _ in range(G) for row in problems]",
     "episodes: a group's rows play other problems' secrets", ROWS_REPLAY + SECRETS),
    (EP, "mask + [1] * len(policy) + [0] * len(obs)", "mask + [1] * (len(policy) + len(obs))",
     "play_demo: a demonstration's observations and EOS are SFT targets", REPLAY),
    (EP, "return float(self.envs[r].score(None if final is None else",
     "return float(self.envs[r].score(\"\" if final is None else",
     "episodes: an unfinished episode scored as if it ended",
     (E + "an_unfinished_episode_is_scored_with_none",) + GAME),
    (EP, "obs, self.rewards[r, t] = self.step(r, ids, *ended)", "obs, self.rewards[r, t - 1] = self.step(r, ids, *ended)",
     "generate: a turn's reward a token early", ENV_SAMPLER),
    (RL, "batch.reward = batch.reward + batch.turn_rewards.sum(1)", "batch.reward = batch.reward",
     "scored: the turns' rewards left out of the return", ROLLOUT_TURNS),
    (RL, "        R = R - turn_rewards.sum(1)", "        R = R",
     "token_advantages: the turns' rewards counted twice", TOKEN_TURNS),
    (RL, "rewards = rewards + turn_rewards", "rewards = rewards",
     "token_advantages: the turns' rewards at the last token", TOKEN_TURNS),
    (RL, "if algo.binary and ((batch.reward != 0) & (batch.reward != 1)).any():", "if False:",
     "scored: a binary row takes rewards paid every turn", ROLLOUT_TURNS),
    ("envs/guess.py", "self.inconsistent += not self.lo <= guess <= self.hi",
     "self.inconsistent += not self.lo < guess <= self.hi", "guess: the interval's low end", GAME),
    ("envs/guess.py", "self.lo, obs = max(self.lo, guess + 1), \">\"",
     "self.lo, obs = max(self.lo, guess), \">\"", "guess: a wrong guess stays possible", GAME),
    ("envs/guess.py", "turn == str(int(turn))", "True", "guess: leading zeros taken", GAME),
    ("envs/guess.py", "guess = rng.randint(lo, hi)", "guess = rng.randint(LO, HI)",
     "guess's demo: the random player, not the consistent one", REPLAY),
    ("envs/guess.py", "shrink = math.log2(before / (self.hi - self.lo + 1)) / math.log2(HI - LO + 1)",
     "shrink = (before - (self.hi - self.lo + 1)) / (HI - LO + 1)",
     "guess: the process reward in counts, not bits", GAME),
    ("tokenizer.py", "start = max((i + 1 for i, a in enumerate((act or ())[:len(ids)]) if not a), default=0)",
     "start = min((i + 1 for i, a in enumerate((act or ())[:len(ids)]) if not a), default=0)",
     "final_text: the answer after the environment's first token, not its last", SPLIT),
    ("tokenizer.py", "start = max((i + 1 for i, a in enumerate((act or ())[:len(ids)]) if not a), default=0)",
     "start = 0", "final_text: the whole response, the environment's results too", SPLIT),
    # correctness III: eval KL mask, token-mean count, the empty online step, the DDP scale
    (EV, 'mask = out["action_mask"][:, out["prompt_len"]:]  # (n, L)',
     'mask = out["response_mask"][:, out["prompt_len"]:]  # (n, L)',
     "sample_kl: KL and length over the environment's tokens too", EVAL_KL),
    (RL, "run.ranks.reduce([batch.mask[mb].sum(), len(mb)])",
     "run.ranks.reduce([batch.length[mb].sum(), len(mb)])",
     "pg_step: the token mean counts the environment's tokens", TOKEN_MEAN),
    (PF, "rollout_rows(batch, algo, cfg.group_size) if batch else ([], None)",
     "rollout_rows(batch, algo, cfg.group_size)", "pref.step: an online step without pairs crashes",
     (R + "an_online_pairs_step_without_a_mixed_group_updates_nothing",)),
    (PF, "    if offline(cfg, algo):\n        n = cfg.pairs_per_step",
     "    if batch is None:\n        n = cfg.pairs_per_step",
     "pref.step: no online pairs read as the offline files", 
     (R + "an_online_pairs_step_without_a_mixed_group_updates_nothing",)),
    ("nanorl/ddp.py", "p.grad = g.view_as(p)", "p.grad = 2 * g.view_as(p)",
     "sync_grads: the summed gradient doubled", (DDP + "ranks_with_any_share_of_the_groups_equal_one_"
                                                 "process_on_the_whole_batch",)),
    (RL, 'metrics = rollout_metrics(batch) if out and batch else {}',
     'metrics = rollout_metrics(batch) if batch else {}',
     "pref_step: ranks log different keys when one had no pairs",
     (DDP + "an_online_pairs_step_with_no_pair_on_one_rank_skips_the_update_on_both",)),
    (RL, 'n_tok += greedy.length.sum().item()', 'n_tok += 0',
     "collect: ReMax's greedy tokens not counted in rollout tok/s",
     (R + "rollout_tok_s_counts_every_token_sampled",)),
    (RL, "n_tok, n_cut = n_tok + batch.length.sum().item(), n_cut + int((~batch.finished).sum())",
     "n_tok, n_cut = n_tok + batch.length[:0].sum().item(), n_cut + int((~batch.finished).sum())",
     "collect: sampled tokens not counted", (R + "rollout_tok_s_counts_every_token_sampled",)),
    (PF, "size = max(1, (max_rows or len(rows)) // (2 if pairs else 1))",
     "size = max(1, len(rows) // (2 if pairs else 1))", "rows_loss: micro_batch_size ignored",
     (R + "micro_batch_size_bounds_preference_and_sft_forwards",)),
    (PF, "return loss * k / total, stats", "return loss / total, stats",
     "unit_loss: a micro-batch's mean not weighted by its share",
     (R + "micro_batch_size_bounds_preference_and_sft_forwards",)),
    ("sft.py", "[1] * len(p) + (m[0] if m else [1] * len(r))", "[1] * (len(p) + len(r))",
     "encode_split: loss_on=all trains on the tool's results", TOOLS),
    ("nanorl/rows.py", "torch.tensor(m[0] if m else [1] * len(r))", "1",
     "rows.pack: the action mask ignored", TOOLS),
    (MD, "out.ids.size(1) - out.mask.size(1), out.length",
     "out.ids.size(1) - out.mask.size(1), out.mask.sum(1)",
     "responses: a rollout's responses cut at its action count", TOOLS),
    (PF, "resp[r],\n             batch.mask[r, :len(resp[r])].tolist())", "resp[r])",
     "pref.rollout_rows: rows without their action mask", TOOLS),
    # the field's tasks (issue 37): reasoning-gym's splits and scorer, JSONL
    ("nanorl/rg.py", "if q in entries:\n            continue", "if False:\n            continue",
     "rg.splits: a repeated question kept (no dedup)", RG_SPLITS),
    ("nanorl/rg.py", "if split == \"train\" or len(out[split]) < HELD_OUT[split]:",
     "if True:", "rg.splits: val and test past their caps", RG_SPLITS),
    ("nanorl/rg.py", "return float(dataset.score_answer(answer, entries[question]))",
     "return float(answer == entries[question][\"answer\"])",
     "rg score: exact match, not the generator's score_answer", RG_SCORE),
    (EV, "else scorer(problem[0], parse_answer(text, reverse))",
     "else scorer(problem[0], text)", "grade_rg: the model's digit order scored", RG_SCORE),
    (EV, "self.grade = partial(grade_rg, self.scorer, self.reverse) if self.scorer else",
     "self.grade = partial(grade_rg, self.scorer, self.reverse) if False else",
     "Task.grade: an rg task graded by the exact verifier", RG_SCORE),
    ("data/tasks.py", 'rec.get(k, rec.get("ground_truth") if k == "answer" else None)', "rec.get(k)",
     "read_jsonl: ground_truth not read as the answer", JSONL),
    ("data/tasks.py", "if not isinstance(rec[k], typ):", "if rec[k] is None:",
     "read_jsonl: a non-string value taken", JSONL),
    # correctness V (issue 42): gold answers, resume, splits, empty and raw-separator JSONL, the
    # prompt sampler, the game's bounds, sample.py's answer; and the test gaps it closed
    (EV, "(prompt, gold)) < 1:", "(prompt, gold)) < 0:",
     "check_data: a gold answer the verifier rejects taken", GOLDS),
    (EV, "        task.check_data()\n", "        pass\n",
     "Task.of: rl.py takes files changed after SFT unchecked", RL_GOLDS),
    (EV, "if problem_key(p) in train]", "if p in train]", "check_data: only exact duplicates warned",
     NEAR),
    ("data/tasks.py", 'return " ".join(sorted(re.findall(', 'return " ".join((re.findall(',
     "problem_key: the words in their order", TWINS + NEAR),
    ("nanorl/rg.py", 'problem_key(str(entry.get("metadata", {}).get("expression", q)))',
     "problem_key(q)", "rg.splits: keyed by the question (rewordings leak)", TWINS),
    ("nanorl/rg.py", 'hashlib.sha256(key.encode())', 'hashlib.sha256(q.encode())',
     "rg.splits: split by the question's text", TWINS),
    ("nanorl/rg.py", 'if not isinstance(dataset[0]["answer"], str):', "if False:",
     "rg.splits: a generator without gold answers taken", NO_GOLD),
    ("data/tasks.py", "if typ is str and not rec[k]:", "if False:",
     "read_jsonl: an empty prompt or answer taken", EMPTY),
    ("data/tasks.py", 'enumerate(text.split("\\n"), 1)', "enumerate(text.splitlines(), 1)",
     "read_lines: U+2028 in a JSON string splits its line", SEPARATORS),
    ("data/tasks.py", 'return [Row(r["prompt"], r["answer"], {', 'return [Row(r["prompt"], r["answer"].strip(), {',
     "load_split: JSONL answers stripped of their spaces", SPACES),
    ("nanorl/loop.py", "if k not in MAY_CHANGE}", 'if k in ("loss", "staleness", "ranks")}',
     "resume: only loss and staleness compared (before)", RESUME),
    ("nanorl/loop.py", "evaluate = s != self.resumed and (full or val)", "evaluate = full or val",
     "Clock: a resumed run evaluates its checkpoint's step again", EVAL_RESUME),
    ("nanorl/loop.py", "best = metrics[metric] > self.state.best_val",
     "best = metrics[metric] >= self.state.best_val", "Clock.new_best: best.pt moves on a tie", BEST),
    ("nanorl/loop.py", "best = metrics[metric] > self.state.best_val", "best = True",
     "Clock.new_best: best.pt at every eval", BEST),
    (RL, "run.prompts.record(idx, flat)",
     "run.prompts.record(idx, batch.score.view(-1, G).std(1) == 0)",
     "collect: selection records the final score, not the return", SELECTION),
    ("verify.py", "return score if turn_rewards is None else score + turn_rewards.sum(1)",
     "return score", "episode_return: without the turns' rewards", RETURN + SELECTION),
    ("envs/guess.py", "len(turn) <= len(str(HI)) and ", "",
     "guess: a turn of 5,000 digits reaches int()", GAME),
    ("envs/guess.py", "turn.isascii() and turn.isdigit() \\\n            and turn == str(int(turn))",
     "turn.strip().isascii() and turn.strip().isdigit() \\\n            and turn.strip() == str(int(turn))",
     "guess: a guess with spaces taken", GAME),
    ("sample.py", "lines = [(cfg.prompt, cfg.answer)] if cfg.prompt", 'lines = [(cfg.prompt, "")] if cfg.prompt',
     "sample: --answer ignored", SAMPLE_ANSWER),
    # issue 43: the environment contract, dynamic sampling decided in check
    (EP, 'missing = [k for k in [*Env.__annotations__, "step", "score"] if not hasattr(env, k)]',
     "missing = []", "check_env: an Env without a member of the contract taken", CONTRACT),
    (RL, "return replace(cfg, dynamic_sampling=pairs or dynamic), algo, hp",
     "return replace(cfg, dynamic_sampling=dynamic), algo, hp",
     "check: online pairs without dynamic sampling", DYNAMIC),
    (RL, 'dynamic = cfg.dynamic_sampling and algo.family == "pg" and not algo.flat_teaches',
     'dynamic = cfg.dynamic_sampling and algo.family == "pg"',
     "check: a teacher's rows drop their flat groups", DYNAMIC),
    (LP, "SIGNED = dict(ON, flat_teaches=True)", "SIGNED = dict(ON)",
     "nsr: dynamic sampling drops the groups that lost every game", ORACLE),
    # issue 44: the async sampler's pacing, weight copy and versions
    (AS, "source.wait_for(s - 1)  # pacing", "source.wait_for(s - 2)  # pacing",
     "serve: the sampler samples ahead with an older version", ASYNC_SAME),
    (AS, "        self.model.load_state_dict(weights)\n", "        pass\n",
     "Weights.load: a published version never reaches the sampler's model", ASYNC_SAME),
    (AS, "            self.source.poll()\n        orphaned(self.source.parent)\n        self.log.append(self.source.version)",
     "            pass\n        orphaned(self.source.parent)\n        self.log.append(self.source.version)\n"
     "        self.source.poll() if self.inflight else None",
     "InFlight: a token's version recorded before the newer weights are loaded", ASYNC_INFLIGHT),
    (AS, "(version - batch.version)[batch.mask.bool()]", "(version - 1 - batch.version)[batch.mask.bool()]",
     "version_lag: one version short", ASYNC_SAME),
    # issue 45: the rollout log and replay
    (LOG, '"role": "policy" if masks[r][t] else "env"', '"role": "env" if masks[r][t] else "policy"',
     "records: a token's role flipped", LOG_FIELDS),
    (LOG, '"ref": None, **{k: v[r][t] for k, v in lists.items()}}',
     '"ref": None, **{k: v[r][max(t - 1, 0)] if k == "adv" else v[r][t] for k, v in lists.items()}}',
     "records: each token shows the advantage of the token before", LOG_FIELDS),
    (RL, "step = rollout_log.replay(cfg, algo, run, world, rank, step)",
     "step = pg_step",
     "main: --replay samples afresh instead of reading the log", LOG_REPLAY),
    # issue 46: credit per turn
    (TU, "full = {key: prompts[key[0]] + list(key[1]) for key in wanted}",
     "full = {key: prompts[key[0]] + list(key[1][:-1]) for key in wanted}",
     "branch: a branch value from the wrong prefix (its observation's last token missing)", VINE),
    (TU, "episodes.retake(row, list(prefix), acts[r][:len(prefix)])",
     "episodes.retake(row, list(prefix[:-4]), acts[r][:len(prefix) - 4])",
     "branch: a branch's environment replayed to an earlier turn than its prefix", VINE),
    (TU, "[[value[r, s] for s, _ in row] for r, row in enumerate(turns)]",
     "[[value[r, s] for s, _ in row[:1] + row[2:] + row[1:2]] for r, row in enumerate(turns)]",
     "credit: a turn takes the value of another turn's prefix", VINE),
    (TU, "value[r, s] = (sum(ret) - own + sum(extra)) / (len(rs) - 1 + len(extra))",
     "value[r, s] = (sum(ret) + sum(extra)) / (len(rs) + len(extra))",
     "credit: a row's own future enters its value", VINE),
    (TU, "[[names.setdefault((r // G, s), len(names)) for _, s in row]",
     "[[names.setdefault((r // G, s), len(names)) for _, s in row[1:] + row[:1]]",
     "credit: a step group keyed on the wrong state (the next turn's)", STEP),
    (LP, 'state = per_turn(states, turn, "same")[:, :-1]', 'state = per_turn(states, turn, "same")[:, 1:]',
     "step_advantages: each turn grouped by the next turn's state", STEP),
    (LP, "a = r[:, :-1] + v[:, 1:] - v[:, :-1]", "a = r[:, :-1] + v[:, :-1] - v[:, :-1]",
     "vine_advantages: V(s_k) in place of V(s_k+1)", (TT + "vine_advantage_of_a_three_turn_episode_by_hand",)),
    # issue 51: data
    (PF, "picked = (batch.score == 1).nonzero().flatten().tolist()",
     "picked = batch.score.nonzero().flatten().tolist()",
     "rollout_rows: rft keeps partial credit (a 0.5) as verified-correct",
     ("tests/test_pref.py::test_rft_keeps_only_the_samples_that_score_1",)),
    ("sft.py", "cfg = replace(cfg, reverse=cfg.task in TASKS)", "cfg = replace(cfg, reverse=True)",
     "main: --reverse defaults to true for every task (a folder's answers trained reversed)",
     ("tests/test_sft.py::test_reverse_defaults_to_the_tasks_and_the_checkpoint_stores_it",)),
    # issue 51: the viewer
    (VW, "el.textContent = JSON.stringify(t.text)", "el.innerHTML = JSON.stringify(t.text)",
     "view: the hover tip built with innerHTML (a token's <img onerror> runs)",
     (VB + "a_hovered_token_of_markup_shows_as_text_and_runs_nothing",)),
    (VW, "data = json.dumps(logs).translate(SCRIPT_SAFE)", 'data = json.dumps(logs).replace("</", "<\\\\/")',
     "view: the page's data escapes only </ (a prompt <!--<script> stops its script)", HOSTILE_PAGE),
    (VW, "by = table();", "by = {};",
     "view: moves() keys prompts in a plain object (a prompt __proto__ pollutes the page)", HOSTILE_PAGE),
    (VW, 'return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)',
     'return text.replace("\\n", "\\\\n")', "view: printable() escapes only newlines (ESC, BEL reach the terminal)",
     (VB + "the_terminal_shows_control_characters_as_escapes", VB + "hostile_prompts_reach_the_terminal_as_text")),
    (VW, 'gap = abs(tok["old"] - tok["mu"])', 'gap = tok["old"] - tok["mu"]',
     "view: surprising() reads pi_old / mu beyond e one way only",
     (VB + "a_token_is_surprising_where_mu_is_below_5_percent_or_pi_old_over_mu_beyond_e",)),
    (VW, "line += printable(f\" ({r['response_normal']!r})\")", "line += printable(f\" ({r['response']!r})\")",
     "view: a reversed response in brackets in the model's order, not a person's",
     (VB + "the_terminal_gives_the_normal_digit_order_of_a_reversed_task",)),
    (VW, "except BrokenPipeError:", "except ConnectionResetError:",
     "view: `| head` ends in a BrokenPipeError traceback (the handler catches another error)",
     (VB + "a_reader_that_has_gone_ends_the_viewer_quietly",)),
    # issue 51: async's edges, the rollout log and replay (the six planted defects the suite let
    # survive first)
    (AS, "        policy.log.clear()\n", "",
     "InFlight: the per-forward version record never cleared (it grows with the run)", ASYNC_INFLIGHT),
    (AS, "            self.source.poll()\n        orphaned(self.source.parent)",
     "            self.source.poll()",
     "InFlight: no orphan check before a forward (a sampler outlives its trainer a rollout)",
     (A + "an_orphaned_sampler_exits_before_its_next_forward",)),
    (AS, "for sig in (signal.SIGINT, signal.SIGTERM):", "for sig in (signal.SIGTERM,):",
     "serve: the sampler no longer ignores SIGINT (Ctrl-C kills it mid-rollout)", STOP),
    (LOG, '"mu": batch.mu, "old": batch.old_logp', '"mu": batch.old_logp, "old": batch.old_logp',
     "records: pi_old written into the log's mu field", LOG_FIELDS),
    # (the hover tip built with innerHTML: the viewer's block above)
    (TU, "if not (f and cfg.dynamic_sampling)]", "if not f]",
     "credit: flat groups' problems dropped with --dynamic_sampling=false (rows get others')",
     (TT + "gigpo_keys_each_turn_on_the_state_it_starts_from",)),
    # issue 51: the rest
    (AS, "for sig in (signal.SIGINT, signal.SIGTERM):", "for sig in (signal.SIGINT,):",
     "serve: the sampler dies of SIGTERM (timeout, kill -TERM -PGID): the run is lost", STOP),
    (AS, "    except OSError:  # \"got end of file during message\"\n        raise EOFError from None\n",
     "    except EOFError:\n        raise\n",
     "recv: a message cut short by a dead sender is an OSError's traceback, not the end",
     (A + "a_message_cut_short_by_a_dead_sender_reads_as_its_end",)),
    (AS, "    buf = io.BytesIO()\n    torch.save(obj, buf)\n    conn.send_bytes(buf.getbuffer())",
     "    conn.send(obj)",
     "send: tensors through torch.multiprocessing (a reader killed mid-fetch: a traceback)",
     (A + "a_sampler_killed_while_it_reads_a_version_costs_the_trainer_no_traceback",)),
    (AS, "self.receive(run.state.step, \"its start\")  #", "#",
     "Pipeline: the sampler's start-up timed as its first rollout's (--async_timeout)",
     (A + "a_hung_sampler_stops_the_trainer_within_the_timeout_and_is_killed",)),
    (OP, "queue.append((batch, stats))", "queue.append((batch, {}))",
     "stale: a queued rollout loses its sampling stats (the log's are empty)", OWN_STATS),
    (LOG, "ranks = gather_objects(mine)  # every rank's, in rank order",
     "ranks = [mine]  # every rank's, in rank order",
     "write: under torchrun each rank writes its own rows over the others'", RANKS_LOG),
    (LOG, '"group": (rec["row"] + offset) // G} for rec in kept]', '"group": rec["group"]} for rec in kept]',
     "write: groups numbered within each rank (two ranks' groups share a number)", RANKS_LOG),
    (LOG, "mine, dev = d[\"ranks\"][self.rank], next(", "mine, dev = d[\"ranks\"][0], next(",
     "Replay: every rank trains on rank 0's rows", RANKS_LOG),
    (LOG, "            if d[\"facts\"].get(key) != want:", "            if key == \"ranks\" and d[\"facts\"].get(key) != want:",
     "Replay: a log of another group size, task, tokenizer or model trains without a word", FITS),
    (LOG, "if algo.advantage in SAMPLED and logged != algo.advantage:", "if False:",
     "Replay: vineppo, gigpo, cliff, remax on a log without their columns (a traceback)", FITS),
    (LOG, "        if not os.path.exists(file):\n            raise",
     "        if not os.path.exists(file):\n            return None, {}\n            raise",
     "Replay: a missing step reads as no update (a log of every 2 steps makes half the updates)", FITS),
    ("nanorl/loop.py", "if time.time() - self.signal_t >= 1.0:", "if True:",
     "Clock.handle: one stop sent twice (timeout: the run, then its group) stops at once",
     (RE + "one_stop_sent_twice_is_one_and_another_a_second_later_stops_at_once",)),
    (LOG, "return batch is not None or cfg.log_rollouts < 0 and cfg.log_every == 1",
     "return batch is not None",
     "due: a step without an update leaves no file (its replay is refused as missing)", LOG_REPLAY),
    # issue 53: the game's oracle, the eval's losing states, NSR / W-REINFORCE, the count bonus
    ("envs/guess.py", "m = 2 ** (t - 1) - 1", "m = 2 ** t - 1", "guess: winning moves fit t turns, not t - 1",
     ORACLE),
    ("envs/guess.py", "max(0, min(self.hi, self.lo + m) - max(self.lo, self.hi - m) + 1)",
     "max(0, min(self.hi, self.lo + m) - max(self.lo, self.hi - m))", "guess: winning moves one short", ORACLE),
    ("envs/guess.py", "if self.won:\n            return 1", "if self.won:\n            return 0",
     "guess: a won game counts as lost", ORACLE),
    ("envs/guess.py", "return 1.0 if self.winning_moves() > 0 else -1.0",
     "return 1.0 if self.winning_moves() >= 0 else -1.0", "guess: the oracle never pays -1", ORACLE),
    ("envs/guess.py", "if not self.oracle_reward or not could_win:", "if not self.oracle_reward:",
     "guess: the oracle pays -1 after the game is lost", ORACLE),
    (EP, "state, before = env.state() if hasattr(env, \"state\") else None, oracle()",
     "state, before = env.state() if hasattr(env, \"state\") else None, None",
     "episodes: a visit without the oracle's verdict before", VISITS),
    (EP, "self.visits.append(Visit(r, self.start[r], len(ids) - 1, state, text, before, oracle(),",
     "self.visits.append(Visit(r, self.start[r], len(ids), state, text, before, oracle(),",
     "episodes: a visit ends a token late", VISITS),
    (EP, "return self.before is not None and self.before > 0 and self.after == 0",
     "return self.before is not None and self.after == 0", "episodes: a lost state's moves count as losing",
     LOSING),
    (EV, "for v in episodes.visits if v.before is not None and 1 <= v.before <= most]",
     "for v in episodes.visits if v.before is not None and v.before <= most]",
     "evaluate: lost states count as critical", LOSING),
    (EV, "nll = [-out[\"logps\"][v.row, v.start:v.end + 1].sum().item()",
     "nll = [-out[\"logps\"][v.row, v.start:v.end].sum().item()",
     "evaluate: a move's entropy without its last token", LOSING),
    (LP, "return torch.where(m, pos_weight * c.clamp_min(0) + c.clamp_max(0), 0.0)",
     "return torch.where(m, c.clamp_min(0) + c.clamp_max(0), 0.0)", "signed: positives at full weight", SIGNED),
    (LP, "c = (2 * outcome.float() - 1)[:, None].expand(m.shape)",
     "c = outcome.float()[:, None].expand(m.shape)", "signed: a wrong answer is 0, not -1", SIGNED),
    (LP, "c = c + per_turn(turn_rewards.float(), turn).gather(1, turn.clamp_min(0))",
     "c = c + turn_rewards.float()", "signed: a turn's reward only on its last token", SIGNED),
    (LP, "defaults=dict(beta=0.0, pos_weight=0.1)),  # the paper's lambda",
     "defaults=dict(beta=0.0, pos_weight=1.0)),  # the paper's lambda",
     "w_reinforce: lambda 1, not the paper's 0.1", SIGNED),
    (RL, "outcome = R if turn_rewards is None else R - turn_rewards.sum(1)", "outcome = R",
     "signed_kind: the outcome counts the turns' rewards", SIGNED),
    (RL, "n_lost, n_won = n_lost + int((hi <= 0).sum()), n_won + int((lo >= 1).sum())",
     "n_lost, n_won = n_lost + int((lo <= 0).sum()), n_won + int((lo >= 1).sum())",
     "collect: a mixed group counts as all lost", (R + "dynamic_sampling_keeps_groups_by_accuracy_not_by_shaped_reward",)),
    ("nanorl/explore.py", "extra = cfg.count_bonus / math.sqrt(1 + counts[key])",
     "extra = cfg.count_bonus / math.sqrt(2 + counts[key])", "explore: the bonus of a first visit below c", BONUS),
    ("nanorl/explore.py", "extra -= cfg.repeat_penalty * (in_group[row // G, key] - 1) / (G - 1)",
     "extra -= cfg.repeat_penalty * in_group[row // G, key] / (G - 1)", "explore: a turn penalised for itself",
     BONUS),
    ("nanorl/explore.py", "in_group = Counter((row // G, key) for (row, _), key in turns)",
     "in_group = Counter(key for (row, _), key in turns)", "explore: repeats counted across groups", BONUS),
    ("nanorl/explore.py", "counts.update(key for _, key in turns)", "counts.update([])",
     "explore: N(s, a) never grows", BONUS),
    ("nanorl/explore.py", "        batch.reward[row] += extra\n", "",
     "explore: the bonus misses the reward", BONUS),
    ("nanorl/explore.py", "return replace(cfg, temperature=hot + (cfg.temperature - hot) * frac,",
     "return replace(cfg, temperature=hot,", "explore: the temperature never anneals", BONUS),
    ("nanorl/explore.py", "count_bonus=cfg.count_bonus * (1 - frac),", "count_bonus=cfg.count_bonus,",
     "explore: the bonus never anneals", BONUS),
    ("nanorl/explore.py", "cfg = scheduled(cfg, run.state.step)", "cfg = scheduled(cfg, 0)",
     "explore: every step at the schedule's start", BONUS),
    (RL, "        if cfg.count_bonus or cfg.repeat_penalty:  # exploration: nanorl/explore.py\n",
     "        if False:\n", "scored: the count bonus never reaches the rollout", BONUS),
    (RL, "run.counts = Counter(dict(rank_state[\"counts\"]))", "run.counts = Counter()",
     "resume: the count bonus's N(s, a) start again at 0",
     ("tests/test_envs.py::test_a_resumed_game_run_is_exact_with_its_queued_episodes",)),
    (LP, "adv = torch.where(rewards > 0, 1 - mean, wrong) / ((mean * (1 - mean)).sqrt() + eps)",
     "adv = torch.where(rewards > 0, 1 - mean, -mean) / ((mean * (1 - mean)).sqrt() + eps)",
     "pass_k: a wrong sample charged as GRPO charges it", PASS_K),
    (LP, "alone = torch.tensor([math.comb(i - 1, k - 1) / math.comb(G - 1, k - 1) if i else 0.0",
     "alone = torch.tensor([math.comb(i - 1, k - 1) / math.comb(G, k - 1) if i else 0.0",
     "pass_k: the other k - 1 drawn from G, not G - 1", PASS_K),
    (LP, "miss = torch.tensor([math.comb(i, k) / math.comb(G, k) for i in range(G + 1)])",
     "miss = torch.tensor([math.comb(i, k - 1) / math.comb(G, k - 1) for i in range(G + 1)])",
     "pass_k: the group's mean of best-of-(k - 1)", PASS_K),
    (LP, "    if not 1 <= k < G:  # k = G", "    if not 1 <= k <= G:  # k = G",
     "pass_k: k = G accepted (no signal)", PASS_K),
    (RL, 'return losses.pass_k_advantages(batch.reward.view(-1, G), run.hp["pass_k"]).flatten(), {}',
     'return losses.pass_k_advantages(batch.reward.view(-1, G), 1).flatten(), {}',
     "pass_k: the row trains GRPO's pass@1", (R + "pass_at_k_row_takes_its_k",)),
    (TU, "table[state] = n + 1, v + max(1 / (n + 1), rate) * (ret - v)",
     "table[state] = n + 1, v + rate * (ret - v)", "value table: a first visit moves V by the rate, not to G",
     (TT + "value_table_is_a_running_mean_that_forgets_at_its_rate",)),
    (TU, "table[state] = n + 1, v + max(1 / (n + 1), rate) * (ret - v)",
     "table[state] = n + 1, v + 1 / (n + 1) * (ret - v)", "value table: never forgets (no least step)",
     (TT + "value_table_is_a_running_mean_that_forgets_at_its_rate",)),
    (TU, "return [[table[state][1] for _, state in row] for row in turns]",
     "return [[0.0 for _, state in row] for row in turns]", "value table: every V(s) 0",
     (TT + "value_table_is_a_running_mean_that_forgets_at_its_rate", TT + "value_table_gives_each_turn_the_mean_return_from_its_state")),
    (TU, "returns = [[togo(r, s) for s, _ in row] for r, row in enumerate(turns)]",
     "returns = [[batch.reward[r].item() for s, _ in row] for r, row in enumerate(turns)]",
     "value table: a turn's return counts the turn rewards before it", (TT + "value_table_gives_each_turn_the_mean_return_from_its_state",)),
    (TU, "    if cfg.dynamic_sampling:\n", "    if False:\n",
     "value table: learns only from the groups dynamic sampling keeps", (TT + "what_the_turns_credit_cannot_read_is_refused_in_one_line",)),
    (RL, "run.values = dict(rank_state[\"values\"])", "run.values = {}",
     "resume: the value table starts empty again",
     ("tests/test_envs.py::test_a_resumed_game_run_is_exact_with_its_queued_episodes",)),
    # issue 54: stop strings, templates, BPE turns, the Env built from the task row
    (TP, "if any(s in t for t in others) or tails and", "if tails and",
     "stop_ids: a stop inside a longer token matched by id", STOPS),
    (TP, "or tails and any(t.startswith(tails) for t in others):", ":",
     "stop_ids: a stop written across tokens matched by id", SPLIT_STOP),
    (TP, "turn = talk[k - 1][1] + template.stop if", "turn = talk[k - 1][1] if",
     "check_prefixes: an answer followed by more than the stop passes", REWRITES),
    (TP, 'answer = f"<think>{k} steps</think>{50 - k}" if k % 2 else str(50 - k)',
     "answer = str(50 - k)", "check_prefixes: no think block probed (R1-style passes)", REWRITES),
    (TP, "for k in range(12):  # every other answer thinks first", "for k in range(2):",
     "check_prefixes: fewer turns than a window keeps", REWRITES),
    (TP, "return min(hits)[::-1] if hits else None", "return max(hits)[::-1] if hits else None",
     "find_stop: the stop completed last", MALFORMED),
    (TP, "if eos or find_stop(text[hit[1]:], stops):", "if find_stop(text[hit[1]:], stops):",
     "read_turn: a stop then EOS read as a stop", MALFORMED),
    (TP, "if eos or find_stop(text[hit[1]:], stops):", "if eos:",
     "read_turn: two stops in one token read as one", MALFORMED),
    (TP, "return text.strip()", "return text", "role_colon: the turn's leading space handed over",
     DEMO_FORCED),
    (TP, 'return f" {text}" + ("" if done else "\\n\\nAssistant:")', 'return f" {text}\\n\\nAssistant:"',
     "role_colon: a header after the last answer", GOLDEN),
    (TP, "return full.split(self.MARK + self.stop, 1)[1]", "return full.split(self.MARK, 1)[1]",
     "chat: the stop written twice", GOLDEN),
    (BP, 'return codecs.getincrementaldecoder("utf-8")("replace").decode(self.enc.decode_bytes(ids))',
     'return self.enc.decode_bytes(ids).decode("utf-8", "replace")',
     "text_so_far: a UTF-8 character's first byte read as U+FFFD",
     (TM + "a_stop_that_splits_a_utf8_character_waits_for_its_last_byte",)),
    (BP, "a, b = min(pairs, key=lambda p: (-pairs[p], p))", "a, b = min(pairs, key=lambda p: (pairs[p], p))",
     "learn: the rarest pair merged first", (TM + "bpe_learns_the_most_frequent_pair_first_by_hand",)),
    (EP, "if read is None and self.cap and len(turn) >= self.cap:", "if False:",
     "episodes: a turn past its cap runs on", (TM + "a_turn_cut_by_the_cap_is_reported_as_length",)),
    (EP, "if self.fast and not self.cap:  # only a stop's id can end a turn", "if self.fast:",
     "end_turns: the id fast path skips the cap", (TM + "a_turn_cut_by_the_cap_is_reported_as_length",)),
    (EP, 'kw = {**args, **getattr(row, "fields", {})}', "kw = dict(args)",
     "make_env: a JSONL row's settings dropped", (TM + "a_jsonl_row_carries_its_environments_settings",)),
    (EP, 'kw["prompt"] = getattr(row, "source", prompt)', 'kw["prompt"] = prompt',
     "make_env: the prompt as the template wrote it", (TM + "a_jsonl_row_carries_its_environments_settings",)),
    # issue 63: the edges of any-tokenizer environments and exploration
    ("nanorl/explore.py", "if cfg.temperature_start and cfg.staleness:", "if False:",
     "explore: a stale rollout trained at another step's temperature", EXPLORE_REFUSED),
    ("nanorl/explore.py", "if counted and algo.binary:", "if False:",
     "explore: a count bonus reaches a 0/1-reward row", EXPLORE_REFUSED),
    ("nanorl/explore.py", "if G > 1:  # ReMax's greedy answer", "if True:  # ReMax's greedy answer",
     "explore: a group of one divides the repeat penalty by 0", (X + "a_group_of_one_earns_the_count_bonus_and_no_repeat_penalty",)),
    (RL, 'if not 1 <= hp.get("pass_k", 1) < cfg.group_size:', 'if not 1 <= hp.get("pass_k", 1) <= cfg.group_size:',
     "check: pass@k with k = G passes", (X + "pass_at_k_with_a_group_no_larger_than_k_is_refused_at_the_check",)),
    (LOG, '"temperature": cfg.temperature, "task": run.task.settings(),', '"task": run.task.settings(),',
     "replay: a log replayed at another temperature", (LG + "replay_refuses_a_log_that_does_not_fit_in_one_line",)),
    (RL, 'algo.advantage not in (*TOKEN_KINDS, "signed"):', "algo.advantage not in TOKEN_KINDS:",
     "signed: the in-reward KL taken twice, once a sequence", (X + "signed_rows_take_the_kl_once_and_per_token_by_hand",)),
    (RL, "adv = adv + losses.gae(kl, torch.zeros_like(kl), m, 1.0, 1.0)[0]  # (N, L)", "adv = adv + kl",
     "signed: the KL its own token's, not its return-to-go", (X + "signed_rows_take_the_kl_once_and_per_token_by_hand",)),
    ("envs/guess.py", "        if self.won:\n            return 1\n", "",
     "guess: a game won on its last turn counts as lost", (X + "a_slack_state_is_not_critical_and_a_win_on_the_last_turn_is_kept",)),
    ("envs/guess.py", "return inside + (HI - LO + 1 - left if left <= m else 0)", "return inside",
     "guess: a slack state's outside guesses not counted", (X + "a_slack_state_is_not_critical_and_a_win_on_the_last_turn_is_kept",
                                                            X + "winning_moves_are_the_moves_exhaustive_search_allows")),
    ("tests/conftest.py", "if (marked or pid in ours) and not tracker:", "if marked and not tracker:",
     "guard: a child forked without exec goes unseen", ("tests/test_guard.py",)),
    ("tests/conftest.py", "(pgrp == group or descends(pid))", "descends(pid)",
     "guard: an orphan in the session's process group goes unseen", ("tests/test_guard.py",)),
    (LP, "    obj = torch.where(m.any(1), obj, 0.0)  # a row with no policy token", "    # a row with no policy token",
     "gspo: a row without a policy token adds -A / B", ("tests/test_losses.py::test_a_sequence_ratio_row_without_a_policy_token_adds_nothing",)),
    (LP, "obj = torch.where(m.any(1), torch.exp(masked_mean(ell, m, dim=1)) * adv, 0.0)",
     "obj = torch.exp(masked_mean(ell, m, dim=1)) * adv",
     "gmpo: a row without a policy token adds -A / B", ("tests/test_losses.py::test_a_sequence_ratio_row_without_a_policy_token_adds_nothing",)),
    (LOG, "step != 1 and step % cfg.log_every:", "step % cfg.log_every:",
     "rollout log: a debug run shorter than log_every logs nothing", (LG + "by_default_two_groups_of_the_first_step_and_every_log_every_steps",)),
    (PF, "ret = episode_return(batch.score, batch.turn_rewards).view(-1, G).cpu()", "ret = batch.score.view(-1, G).cpu()",
     "online pairs: ranked by score, not the return dynamic sampling keeps", (PREF[0] + "::test_online_pairs_rank_by_the_return_dynamic_sampling_tests",)),
    (EV, "        if not problems:\n", "        if False:\n",
     "task_splits: an empty split reaches the eval's division", (E + "an_environment_with_an_empty_split_is_one_line",)),
    (RL, '"eval/" + pass_k_name(cfg.eval_samples)', 'f"eval/pass@{min(8, cfg.eval_samples)}"',
     "rl: the summary's pass@k name built by hand", ("tests/test_names.py::test_only_evaluate_names_the_pass_at_k_metric",)),
]


def copy_repo(dst):
    """What the tests need, into dst, as a git repository: top-level .py files, pytest.ini,
    README.md and FOLDERS."""
    for name in os.listdir(ROOT):
        if name.endswith(".py") or name in ("pytest.ini", "README.md"):
            shutil.copy2(os.path.join(ROOT, name), dst)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for folder in FOLDERS:
        if os.path.isdir(os.path.join(ROOT, folder)):
            shutil.copytree(os.path.join(ROOT, folder), os.path.join(dst, folder), ignore=skip)
    # the tests that read the code walk what git tracks (tests/test_names.py): the copy is a repo
    subprocess.run("git init -q && git add -A", shell=True, cwd=dst, check=True)


def run_tests(dst, tests):
    """Run pytest on tests (files or node ids) in dst -> (passed, first failure or "timeout",
    seconds)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")  # no stale .pyc
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "--hypothesis-seed=0", f"--basetemp={os.path.join(dst, '.pytest_tmp')}", *tests]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, cwd=dst, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return False, "timeout", time.time() - t0
    lines = out.stdout.splitlines()
    failed = [l.split(" - ")[0].split(" ", 1)[1] for l in lines
              if l.startswith(("FAILED", "ERROR"))]
    why = failed[0] if failed else ((out.stdout + out.stderr).strip().splitlines() or ["?"])[-1]
    return out.returncode == 0, why, time.time() - t0


def check(mutants):
    """-> the source of every mutated file; fails unless each mutant applies exactly once, is
    unique and names tests that exist."""
    sources, seen = {}, set()
    for path, old, new, what, tests in mutants:
        text = sources.setdefault(path, open(os.path.join(ROOT, path)).read())
        n = text.count(old)
        assert n == 1, f"{path}: {what}: the text to mutate occurs {n} times, not once: {old!r}"
        assert old != new and (path, old, new) not in seen, f"{path}: {what}: no-op or duplicate"
        seen.add((path, old, new))
        assert tests, f"{what}: no tests"
        for t in tests:
            assert os.path.isfile(os.path.join(ROOT, t.split("::")[0])), f"{what}: no {t}"
    return sources


def main(argv):
    usage = __doc__.split("\n\n")[1]  # the three commands at the top
    if "-h" in argv or "--help" in argv:
        print(__doc__.splitlines()[0] + "\n\nusage:\n" + usage)
        return 0
    unknown = [a for a in argv if a.startswith("-") and a != "--check"]
    if unknown:
        print(f"unknown option {unknown[0]}; usage:\n{usage}")
        return 2
    sources = check(MUTANTS)
    if "--check" in argv:
        print(f"all {len(MUTANTS)} mutants apply")
        return 0
    words = [w for w in argv if not w.startswith("--")]
    todo = [m for m in MUTANTS if not words or any(w in m[3] or w in m[2] for w in words)]
    union = list(dict.fromkeys(t for m in todo for t in m[4]))  # in order, once each
    with tempfile.TemporaryDirectory(prefix="nanorl-mutate-") as dst:
        copy_repo(dst)
        ok, why, secs = run_tests(dst, union)
        if not ok:
            print(f"the unmutated copy fails its tests ({why}); fix that first")
            return 1
        print(f"unmutated: {len(union)} test files / ids pass ({secs:.0f} s); {len(todo)} mutants")
        print(f"{'':6} {'file':18} {'mutant':50} {'s':>4}  first failing test")
        missed, t0 = [], time.time()
        for path, old, new, what, tests in todo:
            target = os.path.join(dst, path)
            with open(target, "w") as f:
                f.write(sources[path].replace(old, new))
            try:
                ok, why, secs = run_tests(dst, tests)
            finally:
                with open(target, "w") as f:
                    f.write(sources[path])
            if ok:
                missed.append(what)
            verdict = "MISSED" if ok else "caught"
            print(f"{verdict:6} {path:18} {what[:50]:50} {secs:4.0f}  {'' if ok else why}",
                  flush=True)
    print(f"caught {len(todo) - len(missed)} of {len(todo)} in {time.time() - t0:.0f} s")
    for what in missed:
        print(f"  missed: {what}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
