"""ReMax's greedy baseline (Li et al. 2023, arXiv 2310.10505), opened by the algorithms that need
"greedy": each prompt's greedy answer, sampled in the same step and rewarded like the samples,
is the baseline of its G rows: A_i = R_i - R(greedy)."""
import torch


def baseline(batch, greedy, R, rm, normalize, stats):
    """Set batch.baseline from the greedy rollout (one row per prompt) -> the group rewards with
    the greedy reward as one more member (P, G+1) for dynamic sampling, and the summed
    rl/greedy_reward. A reward model scores the greedy answers on the samples' scale: its
    running statistics are the samples', which these rows leave alone."""
    if rm:
        rm.score(greedy, normalize, update=False)
    batch.baseline = greedy.reward.repeat_interleave(R.size(1))  # (N,) each of a prompt's G rows
    total = stats.get("rl/greedy_reward", 0.0) + greedy.reward.sum().item()
    return torch.cat([R, greedy.reward[:, None]], 1), {"rl/greedy_reward": total}
