"""rl.advantages_of on small hand-made batches, against loops written from the papers' formulas: each loss's
group advantage kind, CLIFF's token advantages, GAPO's group counts, REINFORCE/RLOO's KL in the reward and
PPO's token rewards -> GAE -> whitened advantages and returns."""
import math

import pytest
import torch

import losses as L
import rl
from tests.test_rl import lone

P, T = 2, 4  # prompt length (response_mask spans prompt + response; the losses see [:, P:]), response length


def _batch(reward, lengths, logps=None, **kw):
    """A rollout as rl.collect returns it, with only the fields the advantages read."""
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])  # (N, T) the response tokens
    lp = torch.zeros(mask.shape) if logps is None else logps
    return rl.rows.Rollout(torch.zeros(len(lengths), P + T, dtype=torch.long), torch.zeros(len(lengths)), mask, lp,
                      reward=torch.tensor(reward), old_logp=lp, **kw)


def advantages(loss, G, batch, hp, ref_logp):
    """rl.advantages_of the algorithm, on a batch with the reference's log-probs given."""
    batch.ref_logp, algo = ref_logp, L.ALGOS[loss]
    return rl.advantages_of(algo, hp)(rl.Config(loss=loss, group_size=G), algo, lone(hp), batch)


def _pad(rows, junk):
    return torch.tensor([row + [junk] * (T - len(row)) for row in rows])


def _by_kind(rewards, G, kind):
    """Group advantages: "std" (R - mean) / (population std + 1e-6) (GRPO), "mean" R - mean (Dr. GRPO),
    "rloo" R_i - the mean of the other G - 1 rewards (RLOO)."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g:g + G]
        mu = sum(group) / G
        sd = math.sqrt(sum((r - mu) ** 2 for r in group) / G)
        for i, r in enumerate(group):
            others = (sum(group) - r) / (G - 1)
            out.append({"std": (r - mu) / (sd + 1e-6), "mean": r - mu, "rloo": r - others}[kind])
    return out


REWARDS = [1.0, 0.0, -0.5, 0.2, 1.0, 1.0, 0.3, 0.3, 0.3]  # three groups of 3, the last all equal
KINDS = [("grpo", "std", [1.336306, -0.267261, -1.069045]), ("dapo", "std", None), ("gspo", "std", None),
         ("sapo", "std", None), ("cispo", "std", None), ("pnpo", "std", None),
         ("dr_grpo", "mean", [0.833333, -0.166667, -0.666667]), ("reinforce", "mean", None),
         ("gapo", "mean", None), ("rloo", "rloo", [1.25, -0.25, -1.0])]


@pytest.mark.parametrize("loss,kind,first_group", KINDS, ids=[k[0] for k in KINDS])
def test_group_advantage_kind_of_each_loss(loss, kind, first_group):
    """Each loss gets its paper's advantage, per group of G = 3 (not over the batch); an all-equal group
    gets exactly 0. GAPO also gets each row's group count of correct answers and G."""
    correct = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 0])
    batch = _batch(REWARDS, [4, 2, 3] * 3, score=correct)
    adv, extra = advantages(loss, 3, batch, L.resolve_hparams(loss), None)
    assert adv.shape == (9,)
    assert adv.tolist() == pytest.approx(_by_kind(REWARDS, 3, kind), abs=1e-5)
    assert adv[6:].tolist() == [0.0, 0.0, 0.0]
    if first_group:
        assert adv[:3].tolist() == pytest.approx(first_group, abs=1e-5)
    if loss == "gapo":
        assert extra["group_correct"].tolist() == [1, 1, 1, 2, 2, 2, 0, 0, 0] and extra["group_size"] == 3
    else:
        assert extra == {}


@pytest.mark.parametrize("loss,kind", [("reinforce", "mean"), ("rloo", "rloo")])
def test_kl_in_the_reward_of_reinforce_and_rloo(loss, kind):
    """beta 0.1: each sequence's reward becomes R - beta * sum_t (logp_t - ref_logp_t) over its own response
    tokens (the k1 estimate, padding excluded) before the group advantage."""
    lengths = [3, 1, 4, 2, 4, 3]
    lp = [[-0.5, -1.0, -0.2], [-2.0], [-0.1, -0.3, -0.6, -0.9], [-1.2, -0.4], [-0.7] * 4, [-0.3, -0.2, -1.1]]
    ref = [[-0.6, -0.7, -0.2], [-1.0], [-0.4, -0.3, -0.5, -1.4], [-1.0, -0.9], [-0.2] * 4, [-0.3, -0.6, -1.0]]
    reward, beta = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], 0.1
    shaped = [r - beta * sum(a - b for a, b in zip(x, y)) for r, x, y in zip(reward, lp, ref)]
    batch = _batch(reward, lengths, logps=_pad(lp, 5.0))
    hp = L.resolve_hparams(loss, beta=beta)
    adv, _ = advantages(loss, 3, batch, hp, _pad(ref, -3.0))
    assert adv.tolist() == pytest.approx(_by_kind(shaped, 3, kind), abs=1e-5)
    assert shaped[:3] == pytest.approx([1.02, 0.1, -0.07])  # 1 - 0.1 * -0.2, 0 - 0.1 * -1.0, 0 - 0.1 * 0.7


def _cliff_by_hand(rewards, first_wrong, lengths, G):
    """a_good = (1 - mu)/sd on every token of a right answer; a wrong one gets 0 (lam 0) before its first
    wrong token and a_bad = -mu/sd from there (everywhere if it has none, -1); then each group minus its
    mean over its response tokens."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g:g + G]
        mu = sum(group) / G
        sd = math.sqrt(sum((r - mu) ** 2 for r in group) / G)
        rows = [[(1 - mu) / sd] * n if r == 1 else [0.0 if t < fw else -mu / sd for t in range(n)]
                for r, fw, n in zip(group, first_wrong[g:g + G], lengths[g:g + G])]
        centre = sum(map(sum, rows)) / sum(lengths[g:g + G])
        out += [[a - centre for a in row] for row in rows]
    return out


def test_cliff_token_advantages():
    """CLIFF's (N, T) token advantages from the binary rewards, each wrong answer's first wrong token and the
    response mask (the slice after the prompt): zero at padding."""
    rewards, first_wrong, lengths = [1, 0, 0, 0, 0, 1], [-1, 1, 0, 2, -1, -1], [3, 4, 2, 4, 1, 2]
    batch = _batch([float(r) for r in rewards], lengths, score=torch.tensor(rewards),
                   first_wrong=torch.tensor(first_wrong))
    adv, extra = advantages("cliff", 3, batch, L.resolve_hparams("cliff"), None)
    want = _cliff_by_hand(rewards, first_wrong, lengths, 3)
    assert adv.shape == (6, T) and extra == {}
    torch.testing.assert_close(adv, _pad(want, 0.0), atol=1e-5, rtol=0)
    a_good, a_bad, centre = math.sqrt(2), -math.sqrt(2) / 2, (3 * math.sqrt(2) - 5 * math.sqrt(2) / 2) / 9
    assert adv[1].tolist() == pytest.approx([-centre] + [a_bad - centre] * 3, abs=1e-5)  # first wrong: t = 1
    assert adv[0, 0].item() == pytest.approx(a_good - centre, abs=1e-5)


@pytest.mark.parametrize("beta,gamma,lam,with_ref", [(0.05, 0.9, 0.8, True), (0.0, 1.0, 0.95, False)])
def test_ppo_token_rewards_gae_and_whitening(beta, gamma, lam, with_ref):
    """PPO (InstructGPT): token rewards -beta * (logp - ref_logp), plus the score on the last response token;
    GAE delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, nothing after the last token;
    returns A + V; advantages whitened over the 8 response tokens (population variance). Without a KL term
    (beta 0) no reference is needed."""
    lengths, score = [3, 1, 4], [1.0, -0.5, 0.3]
    lp = [[-0.5, -1.0, -0.2], [-2.0], [-0.1, -0.3, -0.6, -0.9]]
    ref = [[-0.6, -0.7, -0.2], [-1.0], [-0.4, -0.3, -0.5, -1.4]]
    V = [[0.2, 0.5, 0.9], [-0.3], [0.1, 0.0, 0.4, 0.2]]
    adv, ret = [], []
    for s, lp_row, ref_row, v_row in zip(score, lp, ref, V):
        n = len(lp_row)
        r = [-beta * (a - b) + (s if t == n - 1 else 0.0) for t, (a, b) in enumerate(zip(lp_row, ref_row))]
        a_row, next_a, next_v = [0.0] * n, 0.0, 0.0
        for t in reversed(range(n)):
            next_a = r[t] + gamma * next_v - v_row[t] + gamma * lam * next_a
            a_row[t], next_v = next_a, v_row[t]
        adv.append(a_row)
        ret.append([a + v for a, v in zip(a_row, v_row)])
    flat = [a for row in adv for a in row]
    mu = sum(flat) / len(flat)
    sd = math.sqrt(sum((a - mu) ** 2 for a in flat) / len(flat) + 1e-8)
    white = [[(a - mu) / sd for a in row] for row in adv]
    batch = _batch(score, lengths, logps=_pad(lp, 5.0), values=_pad(V, 2.0))
    hp = L.resolve_hparams("ppo", beta=beta, gamma=gamma, lam=lam)
    ref_logp = _pad(ref, -3.0) if with_ref else None
    got, extra = advantages("ppo", 3, batch, hp, ref_logp)
    torch.testing.assert_close(got, _pad(white, 0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(extra["value_targets"], _pad(ret, 0.0), atol=1e-6, rtol=0)
    assert extra["old_values"] is batch.values


def test_only_dapo_shapes_overlong_answers_by_default():
    """DAPO's overlong window (2 tokens) is the only rollout default that differs by loss; the flag
    overrides it either way."""
    def window(**kw):  # rl.check fills the row's default in
        return rl.check(rl.Config(teacher_ckpt="t.pt", **kw))[0].overlong_window
    windows = {name: window(loss=name) for name in L.ALGOS}
    assert windows.pop("dapo") == 2 and set(windows.values()) == {0}
    assert window(loss="dapo", overlong_window=0) == 0 and window(loss="grpo", overlong_window=3) == 3


@pytest.mark.parametrize("loss,whitened", [
    # token rewards -0.5 * k1, R on the last token; returns to go [[1.1, 1.2], [-0.3], [0.5, 0.5, 0.6], [1.8, 2.0]]
    # (mean 0.925, population variance 0.499375 over the 8 tokens)
    ("reinforce_pp", [[0.247642, 0.389152], [-1.733495], [-0.601417, -0.601417, -0.459907],
                      [1.238211, 1.521231]]),
    # R minus its group's mean first (groups [1, 0], [0.5, 2]): returns [[0.6, 0.7], [-0.8], [-0.75, -0.75, -0.65],
    # [0.55, 0.75]]; centring by group changes the whitened result, as a global shift would not
    ("reinforce_pp_baseline", [[0.923516, 1.066975], [-1.084907], [-1.013178, -1.013178, -0.869719],
                               [0.851787, 1.138704]]),
])
def test_reinforce_pp_token_returns_whitened_over_the_batch(loss, whitened):
    """REINFORCE++: rewards R - beta * k1(old, ref) per token (beta 0.5 here), return-to-go with gamma 1, whitened
    over every valid token of the batch; padding stays 0 and no value or return goes to the loss."""
    lengths = [2, 1, 3, 2]
    lp = [[-0.5, -1.0], [-0.2], [-1.0, -0.3, -0.6], [-0.4, -0.9]]
    ref = [[-0.7, -0.6], [-0.8], [-1.0, -0.5, -0.4], [-0.8, -0.9]]  # k1 = lp - ref = [[0.2, -0.4], [0.6], ...]
    batch = _batch([1.0, 0.0, 0.5, 2.0], lengths, logps=_pad(lp, 5.0))
    adv, extra = advantages(loss, 2, batch, L.resolve_hparams(loss, beta=0.5),
                               _pad(ref, -3.0))
    assert extra == {} and adv.shape == (4, T)
    torch.testing.assert_close(adv, _pad(whitened, 0.0), atol=1e-5, rtol=0)


def test_remax_advantage_is_the_reward_minus_the_greedy_reward():
    batch = _batch([1.0, 0.0, 0.0, 1.0], [2, 1, 3, 2], baseline=torch.tensor([1.0, 1.0, 0.0, 0.0]))
    adv, extra = advantages("remax", 2, batch, L.resolve_hparams("remax"), None)
    assert adv.tolist() == [0.0, -1.0, 0.0, 1.0] and extra == {}
