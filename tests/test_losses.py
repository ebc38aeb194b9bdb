"""Hand-computed reference numbers and equivalences for losses.py."""
import math

import pytest
import torch

from by_name import LOSSES
from losses import (ALGOS, DEFAULTS, adaptive_beta, bt_loss, cliff_advantages, clip_objective, cov_select,
                    gae, group_advantages, kl_estimate,
                    kl_in_reward, log1mexp, masked_mean, nll_loss, masked_sum, prefix_prob, resolve_hparams,
                    token_entropy, whiten)
from model import token_logps
from rl import explained_variance

# the reference batch: two right-padded responses of lengths 3 and 2
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]
OLD = torch.tensor([[-1.1, -0.4, -2.1], [-0.5, -1.0, 0.0]])
REF = torch.tensor([[-1.2, -0.6, -1.9], [-0.4, -1.1, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -1.0])
DAPO_GRAD = [[-0.221034, -0.180967, -0.221034], [0.244281, 0.163746, 0]]
INPUTS = {"ref_logp", "n_tokens", "n_seqs", "values", "old_values", "value_targets", "entropy", "group_correct",
          "group_size", "cov_mask"}
ON_LOGP = sorted(set(LOSSES) - {"gkd"})  # gkd's gradient flows through logits (B, T, V): test_offpolicy.py


def call_loss(name, *args, **kw):
    """LOSSES[name] as rl.py calls it: the hyperparameters among kw resolved over the loss's defaults."""
    hp = resolve_hparams(name, **{k: v for k, v in kw.items() if k not in INPUTS})
    return LOSSES[name](*args, **{k: v for k, v in kw.items() if k in INPUTS}, **hp)

REFERENCE = [  # (name, hparams, loss, d loss / d logp)
    ("grpo", dict(beta=0.0), -0.009163, [[-0.184195, -0.150806, -0.184195], [0.305351, 0.204683, 0]]),
    ("grpo", dict(beta=0.04), -0.008871, [[-0.182987, -0.150172, -0.184896], [0.306302, 0.203631, 0]]),
    ("dapo", dict(), -0.215009, DAPO_GRAD),
    ("dr_grpo", dict(max_new_tokens=3), -0.179174,
     [[-0.184195, -0.150806, -0.184195], [0.203567, 0.136455, 0]]),
    ("sapo", dict(), -0.056874, [[-0.183687, -0.150465, -0.183687], [0.301262, 0.202840, 0]]),
    ("cispo", dict(), 0.483807, DAPO_GRAD),
    ("pnpo", dict(), -0.216667, [[0, -0.166667, 0], [0, 0.25, 0]]),
    ("gspo", dict(), -0.000200, [[0, 0, 0], [0.25, 0.25, 0]]),
    ("reinforce", dict(), 1.0, [[-0.5, -0.5, -0.5], [0.5, 0.5, 0]]),
]


def _extra(name, B, T, rows=slice(None)):
    """Keyword inputs some losses need beyond hparams, for the rows of a batch of B."""
    if name == "dr_grpo":
        return dict(max_new_tokens=T)
    if name == "gapo":
        return dict(group_correct=torch.tensor([1, 2] * (B // 2))[rows], group_size=4)
    if name == "ppo":  # a zero value error: the policy part alone is compared
        return dict(values=torch.zeros(B, T)[rows], old_values=torch.zeros(B, T)[rows], value_targets=torch.zeros(B, T)[rows])
    if name in ("clip_cov", "kl_cov"):  # the first token of rows 0, 3, ... singled out
        return dict(cov_mask=((torch.arange(B)[:, None] % 3 == 0) & (torch.arange(T) == 0))[rows])
    return {}


@pytest.mark.parametrize("name,hp,loss,grad", REFERENCE, ids=[f"{r[0]}-{r[1]}" for r in REFERENCE])
def test_reference_table(name, hp, loss, grad):
    logp = torch.tensor(LOGP, requires_grad=True)
    out, stats = call_loss(name, logp, OLD, ADV, MASK, ref_logp=REF, **hp)
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-5)
    assert torch.allclose(logp.grad, torch.tensor(grad), atol=1e-5)
    assert {"clipfrac_low", "clipfrac_high", "ratio_mean", "ratio_max"} <= set(stats)
    assert float(stats["ratio_max"]) == pytest.approx(math.exp(0.2), abs=1e-6)


def test_clip_fractions_in_stats():
    logp = torch.tensor(LOGP)
    assert float(call_loss("grpo", logp, OLD, ADV, MASK, beta=0.0)[1]["clipfrac_high"]) == 0
    assert float(call_loss("gspo", logp, OLD, ADV, MASK)[1]["clipfrac_high"]) == pytest.approx(0.6)  # seq 0
    assert float(call_loss("pnpo", logp, OLD, ADV, MASK)[1]["clipfrac_high"]) == pytest.approx(0.6)
    logp = torch.tensor([[math.log(1.25)], [math.log(0.7)]])
    stats = call_loss("grpo", logp, torch.zeros(2, 1), ADV, torch.ones(2, 1), beta=0.0)[1]
    assert float(stats["clipfrac_low"]) == 0.5 and float(stats["clipfrac_high"]) == 0.5


@pytest.mark.parametrize("name,weights", [
    ("grpo", [0.0833, -0.125, -0.125, 0.0833]),
    ("dapo", [0.1, -0.1, -0.1, 0.1]),
    ("dr_grpo", [0.0417, -0.0417, -0.0417, 0.0417]),
])
def test_token_weights_at_ratio_one(name, weights):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]])
    adv = group_advantages(torch.tensor([[1.0, 0, 0, 1]]), "mean" if name == "dr_grpo" else "std")[0]
    logp = torch.randn(4, 3).requires_grad_(True)
    loss, _ = call_loss(name, logp, logp.detach(), adv, mask, beta=0.0, **_extra(name, 4, 3))
    loss.backward()
    expected = torch.tensor(weights)[:, None].expand(4, 3) * mask
    assert torch.allclose(-logp.grad, expected, atol=5e-5)


def test_rloo_advantage_under_grpo_normaliser():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]])
    logp = torch.zeros(4, 3, requires_grad=True)
    adv = group_advantages(torch.tensor([[1.0, 0, 0, 1]]), "rloo")[0]
    call_loss("grpo", logp, logp.detach(), adv, mask, beta=0.0)[0].backward()
    assert torch.allclose(-logp.grad[:, 0], torch.tensor([0.0556, -0.0833, -0.0833, 0.0556]), atol=5e-5)


def test_sequence_ratio():
    """GSPO's s_i = exp(mean of d_t over the |y_i| response tokens): a geometric mean, not a product, and the
    padding (junk 7.0 here) is not counted: exp(0.07/3) and exp(0.2/2). With A = 1 and no clip the loss is
    -(s_0 + s_1) / 2."""
    d = torch.tensor([[0.10, -0.05, 0.02], [0.3, -0.1, 7.0]])
    loss, _ = LOSSES["gspo"](d + 0.5, torch.full((2, 3), 0.5), torch.ones(2), torch.tensor([[1, 1, 1], [1, 1, 0]]),
                             eps_low=10.0, eps_high=10.0)
    assert loss.item() == pytest.approx(-(1.023607 + 1.105171) / 2, abs=1e-6)


@pytest.mark.parametrize("r,A,obj,grad,clip_c", [
    (1.4, 0.9, 1.08, 0.0, None), (0.6, -0.5, -0.4, 0.0, None), (1.1, 0.9, 0.99, 0.99, None),
    (0.6, 0.5, 0.3, 0.3, None), (1.5, -1.0, -1.5, -1.5, None),
    (4.0, -1.0, -3.0, 0.0, 3.0),  # dual-clip: for A < 0 the objective is at least clip_c*A
])
def test_clip_term(r, A, obj, grad, clip_c):
    logr = torch.tensor(math.log(r), requires_grad=True)  # d/d logp = d/d log r
    out, low, high = clip_objective(logr.exp(), torch.tensor(A), 0.2, 0.2, clip_c)
    out.backward()
    assert out.item() == pytest.approx(obj, abs=1e-6)
    assert logr.grad.item() == pytest.approx(grad, abs=1e-6)
    assert bool(low | high) == (grad == 0)  # flagged exactly where the gradient is cut


@pytest.mark.parametrize("eps_high,grad", [(0.2, 0.0), (0.28, 1.25)])
def test_clip_higher(eps_high, grad):
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)
    loss, _ = call_loss("dapo", logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), eps_high=eps_high)
    loss.backward()
    assert -logp.grad.item() == pytest.approx(grad, abs=1e-6)


def test_cispo_caps_the_weight_but_keeps_the_gradient():
    logp = torch.tensor([[math.log(6.0)]], requires_grad=True)
    loss, stats = call_loss("cispo", logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    loss.backward()
    assert -logp.grad.item() == pytest.approx(5.0) and float(stats["clipfrac_high"]) == 1


def _ppo_epochs(eps, epochs):
    """Two-logit policy, fixed batch [(right, A=+1), (left, A=-1)], SGD ascent lr 0.2 -> P(right) per epoch."""
    z = torch.zeros(2, requires_grad=True)  # logits [left, right]
    opt = torch.optim.SGD([z], lr=0.2)
    old, adv, mask = torch.full((2, 1), math.log(0.5)), torch.tensor([1.0, -1.0]), torch.ones(2, 1)
    probs = []
    for _ in range(epochs):
        lp = torch.log_softmax(z, 0)
        probs.append(lp[1].exp().item())
        logp = torch.stack([lp[1], lp[0]])[:, None]  # (2, 1) log-probs of the two samples
        loss, _ = call_loss("grpo", logp, old, adv, mask, eps_low=eps, eps_high=eps, beta=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return probs + [torch.softmax(z, 0)[1].item()]


def test_ppo_epochs_reference():
    assert _ppo_epochs(0.2, 6) == pytest.approx([0.5, 0.55, 0.598, 0.643, 0.643, 0.643, 0.643], abs=5e-4)
    assert _ppo_epochs(float("inf"), 20)[-1] == pytest.approx(0.921, abs=5e-4)


@pytest.mark.parametrize("c, bound", [(1, 0.005), (4, 0.0041429), (7, 0.0032857)])
def test_gapo_bound(c, bound):
    """GAPO's upper clip for c of G = 8 correct: eps_low + (eps_high - eps_low)(G - c)/(G - 1), 0.003 .. 0.005:
    a ratio just inside it keeps its gradient, one just outside loses it."""
    logp = torch.log(torch.tensor([[1 + bound - 2e-5], [1 + bound + 2e-5]])).requires_grad_(True)
    loss, _ = LOSSES["gapo"](logp, torch.zeros(2, 1), torch.ones(2), torch.ones(2, 1),
                             group_correct=torch.tensor([c, c]), group_size=8)
    loss.backward()
    assert logp.grad[0].item() < 0 and logp.grad[1].item() == 0


def test_gapo_group_dependent_clip_and_refusals():
    logp = torch.full((2, 1), math.log(1.0045), requires_grad=True)  # inside c=1's bound, outside c=7's
    loss, _ = call_loss("gapo", logp, torch.zeros(2, 1), torch.ones(2), torch.ones(2, 1),
                        group_correct=torch.tensor([1, 7]), group_size=8)
    loss.backward()
    assert logp.grad[0].item() < 0 and logp.grad[1].item() == 0
    logp = torch.zeros(2, 1, requires_grad=True)
    call_loss("gapo", logp, logp.detach(), torch.ones(2), torch.ones(2, 1), group_correct=[0, 8],
              group_size=8)[0].backward()
    assert torch.equal(logp.grad, torch.zeros(2, 1))  # c in {0, G}: no signal
    for bad in ([9, 1], [-1, 1], [0.5, 1]):
        with pytest.raises(ValueError, match="group_correct"):
            call_loss("gapo", logp, logp, torch.ones(2), torch.ones(2, 1), group_correct=bad, group_size=8)


@pytest.mark.parametrize("lam,expected", [
    (0.0, [[0.75] * 3, [-0.25, -0.25, -1.25, -1.25], [-0.25, -1.25], [0.75] * 3]),
    (0.5, [[0.625] * 3, [0.125, 0.125, -1.375, -1.375], [0.125, -1.375], [0.625] * 3]),
])
def test_cliff_advantages(lam, expected):
    lengths = [3, 4, 2, 3]
    mask = (torch.arange(4) < torch.tensor(lengths)[:, None])[None]  # (1, 4, 4)
    adv = cliff_advantages(torch.tensor([[1.0, 0, 0, 1]]), torch.tensor([[-1, 2, 1, -1]]), mask, lam=lam)
    padded = torch.tensor([row + [0.0] * (4 - len(row)) for row in expected])
    assert torch.allclose(adv[0], padded, atol=1e-6)


def test_cliff_advantages_refuse_non_binary_and_zero_all_equal():
    mask = torch.ones(1, 2, 3)
    with pytest.raises(ValueError, match="binary"):
        cliff_advantages(torch.tensor([[0.5, 1.0]]), torch.tensor([[-1, -1]]), mask)
    for r in ([0.0, 0.0], [1.0, 1.0]):
        adv = cliff_advantages(torch.tensor([r]), torch.tensor([[1, 0]]), mask, lam=0.5)
        assert torch.equal(adv, torch.zeros(1, 2, 3))

# ----------------------------------------------------------------------------- advantages and KL

@pytest.mark.parametrize("kind,rewards,expected", [
    ("std", [1, 0, 0, 1], [1, -1, -1, 1]),
    ("std", [1, 0, 0, 0], [1.732, -0.577, -0.577, -0.577]),
    ("std", [1, 1, 1, 1], [0, 0, 0, 0]),
    ("mean", [1, 0, 0, 1], [0.5, -0.5, -0.5, 0.5]),
    ("rloo", [1, 0, 0, 1], [0.667, -0.667, -0.667, 0.667]),
    ("maxrl", [1, 0, 0, 1], [1, -1, -1, 1]),  # (R - p) / p, p = 0.5
    ("maxrl", [1, 0, 0, 0], [3, -1, -1, -1]),  # p = 0.25: the hard prompt's right answer counts 3x
    ("maxrl", [0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0]),  # mean <= 0: no advantage
    ("maxrl", [2, 0, 1, 1], [1, -1, 0, 0]),
])
def test_group_advantages(kind, rewards, expected):
    adv = group_advantages(torch.tensor([rewards], dtype=torch.float32), kind)
    assert torch.allclose(adv[0], torch.tensor(expected, dtype=torch.float32), atol=5e-4)


def test_group_advantages_all_equal_exactly_zero_and_unknown_kind():
    for kind in ("std", "mean", "rloo", "maxrl"):
        adv = group_advantages(torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]]), kind)
        assert torch.equal(adv, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="std.*mean.*rloo.*maxrl"):
        group_advantages(torch.zeros(1, 4), "median")


def test_pass_k_advantages_by_hand_and_by_every_subset():
    """G = 4, k = 2, one right: of the 6 pairs 3 hold it (each worth 1), so the mean is 1/2 and
    the std 1/2; the right sample's pairs average 1 (A = (1 - 1/2) / (1/2) = 1), a wrong one's
    1/3 (A = (1/3 - 1/2) / (1/2) = -1/3). Then every group of 6 against its 15 pairs counted one
    by one; k = 1 is GRPO's; all-equal groups 0; k outside [1, G) refused."""
    import itertools
    import math
    from losses import pass_k_advantages
    r = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0]])
    torch.testing.assert_close(pass_k_advantages(r, 2), torch.tensor(
        [[1, -1 / 3, -1 / 3, -1 / 3], [1 / 5 ** 0.5, 1 / 5 ** 0.5, -1 / 5 ** 0.5, -1 / 5 ** 0.5]]), atol=1e-5, rtol=0)
    for right in range(1, 6):
        for k in (2, 3, 4):
            g = torch.tensor([[1.0] * right + [0.0] * (6 - right)])
            pairs = list(itertools.combinations(range(6), k))
            best = {c: max(g[0, list(c)]).item() for c in pairs}
            mean = sum(best.values()) / len(pairs)
            std = math.sqrt(sum((b - mean) ** 2 for b in best.values()) / len(pairs))
            want = [(sum(best[c] for c in pairs if i in c) / math.comb(5, k - 1) - mean) / std if std else 0.0
                    for i in range(6)]  # every subset right (5 of 6, k > 1): no signal
            torch.testing.assert_close(pass_k_advantages(g, k)[0], torch.tensor(want), atol=1e-4, rtol=0)
    g = torch.tensor([[1.0, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    torch.testing.assert_close(pass_k_advantages(g, 1), group_advantages(g, "std"), atol=1e-5, rtol=0)
    assert torch.equal(pass_k_advantages(g, 3)[1:], torch.zeros(2, 5))
    for k in (0, 5):
        with pytest.raises(ValueError, match=r"pass_k must be in \[1, group_size - 1 = 4\], got " + str(k)):
            pass_k_advantages(g, k)


@pytest.mark.parametrize("lam,expected", [
    (1.0, [0.729, 1.31, 0.9, 0.5]), (0.0, [-0.45, 0.5, 0.45, 0.5]), (0.5, [-0.0883125, 0.80375, 0.675, 0.5]),
])
def test_gae(lam, expected):
    rewards = torch.tensor([[0.0, 0, 0, 1], [0, 0, 0, 1]])
    values = torch.tensor([[0.0, -0.5, 0, 0.5], [0.0, -0.5, 0, 0.5]])
    rewards, values = torch.cat([rewards, torch.ones(2, 2)], 1), torch.cat([values, torch.ones(2, 2)], 1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]] * 2)  # right padding holding junk rewards and values
    adv, returns = gae(rewards, values, mask, gamma=0.9, lam=lam)
    assert torch.allclose(adv[0, :4], torch.tensor(expected), atol=1e-6)
    assert torch.equal(adv[:, 4:], torch.zeros(2, 2))
    assert torch.allclose(returns[0, :4], adv[0, :4] + values[0, :4])


def test_prefix_prob_is_the_probability_of_the_tokens_before_each_position():
    logp = torch.log(torch.tensor([[0.5, 0.2, 1.0, 0.9], [0.25, 1.0, 1.0, 1.0]]))
    assert torch.allclose(prefix_prob(logp), torch.tensor([[1.0, 0.5, 0.1, 0.1], [1.0, 0.25, 0.25, 0.25]]))


def test_kl_estimators():
    logp, ref = torch.tensor([0.0]), torch.tensor([math.log(0.5)])  # x = -ln 2
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.240227, abs=1e-6)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(logp, ref, "k4")


def test_kl_estimate_clamps_the_log_ratio():
    """x = ref_logp - logp is clamped to [-20, 20] first: k3 at x = 100 is e^20 - 21 (finite, where exp(100)
    would be inf in fp32) with no gradient; inside the clamp, at x = -0.5, k3 and its gradient are exact."""
    logp = torch.tensor([0.0, 0.0, -1.0], requires_grad=True)
    ref = torch.tensor([100.0, -100.0, -1.5])
    k3 = kl_estimate(logp, ref, "k3")
    want = [math.exp(20) - 21, math.exp(-20) + 19, math.exp(-0.5) - 0.5]  # k3 = e^x - x - 1
    assert k3.tolist() == pytest.approx(want, rel=1e-6)
    k3.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 1 - math.exp(-0.5)], abs=1e-7)
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([-20.0, 20.0, 0.5])


def test_k3_past_verls_value_clamp_is_trls_and_the_docstring_says_so():
    """verl clamps k3 itself to [-10, 10]; nanorl, as TRL, does not: at logp -30, ref -27 (x = 3)
    k3 = e^3 - 4 = 16.086, and its gradient 1 - e^3 flows. The docstring names the difference."""
    logp = torch.tensor([-30.0], requires_grad=True)
    k3 = kl_estimate(logp, torch.tensor([-27.0]), "k3")
    assert k3.item() == pytest.approx(math.exp(3) - 4, rel=1e-6)
    k3.backward()
    assert logp.grad.item() == pytest.approx(1 - math.exp(3), rel=1e-6)
    doc = " ".join(kl_estimate.__doc__.split())
    assert "not clamped, as TRL's" in doc and "clamped to [-10, 10]" in doc and "16.086" in doc


def test_kl_in_reward():
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, float("-inf")]])
    ref = torch.tensor([[-1.2, -0.6, -1.9], [-0.4, -1.1, float("-inf")]])
    rewards = kl_in_reward(torch.tensor([1.0, 0.0]), logp, ref, MASK, beta=0.5)
    assert torch.allclose(rewards, torch.tensor([[-0.1, -0.05, 1.05], [-0.05, 0.05, 0.0]]), atol=1e-6)

# ----------------------------------------------------------------------------- log-probs, reductions

def test_masked_reductions():
    x = torch.tensor([[1.0, 2.0, float("-inf")], [5.0, float("nan"), 7.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_sum(x, m).item() == 3.0
    assert torch.equal(masked_mean(x, m, dim=1), torch.tensor([1.5, 0.0]))  # empty row: 0, not NaN
    assert masked_mean(x, m.bool()).item() == 1.5


def test_token_logps_and_temperature():
    logits = torch.zeros(1, 2, 2)
    logits[0, 1] = torch.tensor([0.0, math.log(3.0)])  # p = [0.25, 0.75]
    ids, mask = torch.tensor([[1, 1]]), torch.tensor([[1, 1]])
    logp = token_logps(logits, ids, mask)
    assert torch.allclose(logp, torch.tensor([[math.log(0.5), math.log(0.75)]]))
    logp = token_logps(logits, ids, mask, temperature=2.0)
    assert logp[0, 1].item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))), abs=1e-6)
    assert token_entropy(logits)[0, 1].item() == pytest.approx(0.562335, abs=1e-6)
    assert token_entropy(torch.zeros(1, 1, 5), temperature=0.7).item() == pytest.approx(math.log(5), abs=1e-6)


def test_padding_with_inf_logits_gives_no_nan():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    logits[1, 2:, :4] = float("-inf")  # e.g. top-k filtered rows after EOS, label 0 among them
    logits.requires_grad_(True)
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 0, -1]])  # -1: an invalid id at padding
    rmask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    logp = token_logps(logits[:, :-1], ids[:, 1:], rmask[:, 1:])
    assert torch.equal(logp[1, 2:], torch.zeros(1)) and torch.isfinite(logp).all()
    ent = token_entropy(logits)
    (logp.sum() + masked_mean(ent, rmask)).backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(ent).all()

# ----------------------------------------------------------------------------- every loss

def _batch(B=6, T=5, seed=0, per_token=False):
    torch.manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,))
    mask = torch.arange(T) < lengths[:, None]  # (B, T)
    logp = -torch.rand(B, T) * 2
    old = logp + 0.1 * torch.randn(B, T)
    ref = logp + 0.1 * torch.randn(B, T)
    adv = torch.randn(B, T) if per_token else torch.randn(B)
    return logp, old, ref, adv, mask


IN_REWARD = ("reinforce", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline")  # beta: KL in the reward


def _hp(name):
    """An in-loss KL term for every loss that has one (reinforce/rloo put KL into the reward)."""
    return {} if name in IN_REWARD or "beta" not in DEFAULTS[name] else dict(beta=0.1)


@pytest.mark.parametrize("name", ON_LOGP)
def test_micro_batches_with_global_counts_equal_the_full_batch(name):
    B, T = 6, 5
    logp, old, ref, adv, mask = _batch(B, T, per_token=name == "cliff")
    counts = dict(n_tokens=mask.sum(), n_seqs=B)
    full = logp.clone().requires_grad_(True)
    loss, _ = call_loss(name, full, old, adv, mask, ref, **_hp(name), **_extra(name, B, T))
    loss.backward()
    micro, total = logp.clone().requires_grad_(True), 0.0
    for rows in (slice(0, 2), slice(2, B)):
        part, _ = call_loss(name, micro[rows], old[rows], adv[rows], mask[rows], ref[rows], **counts,
                            **_hp(name), **_extra(name, B, T, rows))
        part.backward()
        total = total + part.item()
    assert total == pytest.approx(loss.item(), abs=1e-6)
    assert torch.allclose(micro.grad, full.grad, atol=1e-7)


MICRO_NORMS = [  # (loss, per-sequence token mean first?, global count it divides by: n_tokens 10, n_seqs 4)
    ("reinforce", False, 4), ("rloo", False, 4), ("grpo", True, 4), ("cliff", True, 4), ("sapo", True, 4),
    ("pnpo", True, 4), ("gspo", True, 4), ("gapo", True, 4), ("dr_grpo", False, 4 * 4), ("dapo", False, 10),
    ("cispo", False, 10), ("ppo", False, 10), ("gmpo", True, 4), ("dppo", False, 10), ("maxrl", True, 4), ("pass_at_k", True, 4),
    ("clip_cov", False, 10), ("kl_cov", False, 10), ("reinforce_pp", False, 10), ("reinforce_pp_baseline", False, 10),
    ("remax", False, 10), ("opd", False, 10),
]


@pytest.mark.parametrize("name,per_seq,count", MICRO_NORMS, ids=[r[0] for r in MICRO_NORMS])
def test_micro_batch_divides_by_the_global_count(name, per_seq, count):
    """Rows 0-1 (lengths 3, 1; 4 tokens) of a batch of lengths 3, 1, 2, 4 (10 tokens, 4 sequences) at ratio 1,
    beta 0: with the global counts passed, token t of row i weighs A_i / (|y_i| if the loss averages per
    sequence) / count, count = n_seqs (dr_grpo: n_seqs * max_new_tokens) or n_tokens. A loss that averaged per
    micro-batch (its own 2 sequences or 4 tokens) would weigh each token 2x or 2.5x more."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    logp = torch.tensor([[-0.3, -1.1, -0.2, 0.0], [-0.8, 0.0, 0.0, 0.0]], requires_grad=True)
    zeros = torch.zeros(2, 4)
    extra = {"ppo": dict(values=zeros, old_values=zeros, value_targets=zeros), "dr_grpo": dict(max_new_tokens=4),
             "gapo": dict(group_correct=[1, 2], group_size=4), "clip_cov": dict(cov_mask=zeros.bool()),
             "kl_cov": dict(cov_mask=zeros.bool())}.get(name, {})
    a = adv[:, None].expand(2, 4).clone() if name == "cliff" else adv
    hp = dict(beta=0.0) if "beta" in DEFAULTS[name] else {}
    loss, _ = call_loss(name, logp, logp.detach(), a, mask, n_tokens=10, n_seqs=4, **hp, **extra)
    loss.backward()
    lengths = torch.tensor([[3.0], [1.0]]) if per_seq else torch.ones(2, 1)
    torch.testing.assert_close(-logp.grad, adv[:, None] / lengths / count * mask, atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", ON_LOGP)
def test_padding_with_inf_logps_gives_no_nan(name):
    B, T = 6, 5
    logp, old, ref, adv, mask = _batch(B, T, per_token=name == "cliff")
    inf = torch.tensor(float("-inf"))
    logp = torch.where(mask, logp, inf).requires_grad_(True)
    old, ref = torch.where(mask, old, inf), torch.where(mask, ref, inf)
    loss, stats = call_loss(name, logp, old, adv, mask.float(), ref, **_hp(name), **_extra(name, B, T))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[~mask], torch.zeros((~mask).sum()))
    assert all(math.isfinite(float(v)) for v in stats.values())


@pytest.mark.parametrize("name", ON_LOGP)
def test_all_equal_groups_give_zero_advantage_and_zero_gradient(name):
    B, T = 8, 5
    logp, old, _, _, mask = _batch(B, T)
    rewards = torch.tensor([[1.0] * 4, [0.0] * 4])
    if name == "cliff":
        adv = cliff_advantages(rewards, torch.full((2, 4), 1), mask.view(2, 4, T)).view(B, T)
    else:
        kind = ALGOS[name].advantage
        adv = group_advantages(rewards, kind if kind in ("rloo", "maxrl") else "std").view(B)
    assert torch.equal(adv, torch.zeros_like(adv))
    extra = dict(group_correct=[4] * 4 + [0] * 4, group_size=4) if name == "gapo" else _extra(name, B, T)
    if name == "kl_cov":  # its penalty pulls its tokens back to old_logp at any advantage: none chosen here
        extra["cov_mask"] = torch.zeros(B, T, dtype=torch.bool)
    logp.requires_grad_(True)
    loss, _ = call_loss(name, logp, old, adv, mask, **({"beta": 0.0} if "beta" in DEFAULTS[name] else {}),
                        **extra)
    loss.backward()
    assert loss.item() == 0 and torch.equal(logp.grad, torch.zeros(B, T))


def test_on_policy_grpo_gradient_equals_reinforce():
    torch.manual_seed(0)
    G, T = 4, 5
    mask = torch.arange(T) < torch.tensor([5, 2, 3, 4])[:, None]
    adv = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]]), "std")[0]
    a = torch.randn(G, T).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    call_loss("grpo", a, a.detach(), adv, mask, beta=0.0)[0].backward()
    lengths = mask.sum(1)
    call_loss("reinforce", b, b.detach(), adv / lengths, mask)[0].backward()  # weight A_i/(G*|y_i|)
    assert torch.allclose(a.grad, b.grad, atol=1e-7)
    assert torch.allclose(-a.grad, (adv / (G * lengths))[:, None] * mask, atol=1e-7)


@pytest.mark.parametrize("name", ["gspo", "gmpo", "gapo"])
def test_a_sequence_ratio_row_without_a_policy_token_adds_nothing(name):
    """Row 1 has no policy token: its ratio exp(mean of nothing) = 1 would add -A / B = -0.5 to the
    loss (TRL's gives 0.0); the gradient was never touched."""
    logp = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
    kw = dict(group_correct=torch.tensor([1.0, 1.0]), group_size=2) if name == "gapo" else {}
    loss, _ = call_loss(name, logp, logp.detach(), torch.tensor([0.0, 1.0]), torch.tensor([[1], [0]]), **kw)
    assert loss.item() == 0.0
    loss.backward()
    assert logp.grad.abs().sum() == 0


def test_gspo_with_one_token_responses_equals_token_clipping():
    torch.manual_seed(0)
    B, T = 16, 3
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 0] = True
    old = -torch.rand(B, T)
    logp0 = old + 0.3 * torch.randn(B, T)  # ratios on both sides of the clip range
    adv = torch.randn(B)
    a, b = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    la, _ = call_loss("gspo", a, old, adv, mask, eps_low=0.2, eps_high=0.28)
    lb, _ = call_loss("grpo", b, old, adv, mask, eps_low=0.2, eps_high=0.28, beta=0.0)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-6) and torch.allclose(a.grad, b.grad, atol=1e-7)
    assert (a.grad == 0).any() and (a.grad != 0).any()  # some clipped, some not

# ----------------------------------------------------------------------------- hparams, errors

def test_resolve_hparams():
    assert resolve_hparams("grpo") == dict(eps_low=0.2, eps_high=0.2, beta=0.04, kl_estimator="k3", clip_c=None)
    assert resolve_hparams("dapo", eps_high=0.3, beta=None)["eps_high"] == 0.3
    assert resolve_hparams("dapo", beta=None)["beta"] == 0.0
    assert resolve_hparams("reinforce", eps_low=None) == dict(beta=0.0)  # None for a knob it lacks: ignored
    assert (resolve_hparams("sapo")["tau_neg"], resolve_hparams("cispo")["eps_max"]) == (1.05, 5.0)
    assert resolve_hparams("cliff") == resolve_hparams("grpo")
    assert set(LOSSES) == {n for n, a in ALGOS.items() if a.family == "pg"} and set(ALGOS) == set(DEFAULTS)
    assert {a.family for a in ALGOS.values()} == {"pg", "pref", "sft"}
    with pytest.raises(ValueError, match="eps_lo\\b.*eps_low"):
        resolve_hparams("grpo", eps_lo=0.1)
    with pytest.raises(ValueError, match="'ppo2'.*grpo.*dapo"):
        resolve_hparams("ppo2")


def test_a_loss_takes_any_subset_of_its_hyperparameters():
    """LOSSES[name] is a pure function: the hyperparameters not given take the row's defaults, and an
    unknown one is an error naming it and the valid ones."""
    logp, got = torch.tensor(LOGP), {}
    full = LOSSES["grpo"](logp, OLD, ADV, MASK, REF, **resolve_hparams("grpo", beta=0.1))[0]
    for kw in (dict(beta=0.1), dict(beta=0.1, eps_low=0.2, eps_high=0.2), dict(beta=0.1, kl_estimator="k3")):
        got[str(kw)] = LOSSES["grpo"](logp, OLD, ADV, MASK, REF, **kw)[0].item()
    assert list(got.values()) == [pytest.approx(full.item(), abs=1e-7)] * 3
    assert LOSSES["dapo"](logp, OLD, ADV, MASK)[0].item() == pytest.approx(-0.215009, abs=1e-5)
    with pytest.raises(ValueError, match="loss 'grpo' has no hyperparameter 'eps'; it takes .*eps_low"):
        LOSSES["grpo"](logp, OLD, ADV, MASK, REF, eps=0.1)


@pytest.mark.parametrize("x", [-1e-6, -1e-4, -0.1, -0.69, -0.7, -5.0, -40.0])
def test_log1mexp_is_accurate_on_both_sides_of_minus_log_2(x):
    """log(1 - e^x) in float32: log(-expm1(x)) near 0, log1p(-exp(x)) far from it; the wrong branch is
    off by 0.013 at x = -1e-6 (1 - exp(x) loses its digits)."""
    assert log1mexp(torch.tensor(x)).item() == pytest.approx(math.log(-math.expm1(x)), abs=2e-6, rel=1e-6)


def test_loss_errors():
    logp = torch.tensor(LOGP)
    with pytest.raises(ValueError, match="eps"):
        call_loss("grpo", logp, OLD, ADV, MASK, eps=0.1)
    with pytest.raises(ValueError, match="ref_logp"):
        call_loss("grpo", logp, OLD, ADV, MASK)  # default beta 0.04 needs a reference
    # Dr. GRPO's constant defaults to the batch's padded length (rl.py passes max_new_tokens)
    assert call_loss("dr_grpo", logp, OLD, ADV, MASK)[0] == call_loss("dr_grpo", logp, OLD, ADV, MASK,
                                                                      max_new_tokens=3)[0]
    with pytest.raises(ValueError, match="per-sequence"):
        call_loss("gspo", logp, OLD, torch.ones(2, 3), MASK)

# ----------------------------------------------------------------------------- learning: KL-regularised optimum

@pytest.mark.parametrize("p0,target", [(0.16, 0.585), (0.24, 0.700)])
def test_kl_in_reward_reinforce_converges_to_the_regularised_optimum(p0, target):
    """max E[R] - beta*KL(pi||ref) over 4 answers (answer 0 correct): pi* ∝ ref*exp(R/beta)."""
    beta = 0.5
    assert p0 * math.exp(1 / beta) / (p0 * math.exp(1 / beta) + 1 - p0) == pytest.approx(target, abs=5e-4)
    ref = torch.log(torch.tensor([p0] + [(1 - p0) / 3] * 3))
    z = ref.clone().requires_grad_(True)  # tabular softmax policy, starts at the reference
    score, mask = torch.tensor([1.0, 0, 0, 0]), torch.ones(4, 1)
    opt = torch.optim.SGD([z], lr=1.0)
    for _ in range(300):
        logp = torch.log_softmax(z, 0)[:, None]  # (4, 1) every answer, one token each
        ret = kl_in_reward(score, logp.detach(), ref[:, None], mask, beta).sum(1)  # (4,)
        p = logp.detach().exp()[:, 0]
        adv = p * (ret - (p * ret).sum())  # exact expectation: each answer weighted by its probability
        loss, _ = call_loss("reinforce", logp, logp.detach(), adv, mask, n_seqs=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.softmax(z, 0)[0].item() == pytest.approx(target, abs=0.02)


def test_entropy_uses_the_tempered_distribution_once():
    """Entropy of softmax(logits / T), per token; the mean over response tokens divides once."""
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]])
    p = torch.softmax(logits / 0.7, -1)
    want = -(p * p.log()).sum(-1)  # (1, 2) by hand
    got = token_entropy(logits, temperature=0.7)
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, token_entropy(logits), atol=1e-3)  # temperature matters
    mask = torch.tensor([[1.0, 1.0]])
    assert masked_mean(got, mask).item() == pytest.approx(want.mean().item(), abs=1e-6)


def test_ppo_policy_part_is_token_mean_clipping():
    """With vf_coef 0 and no entropy bonus, PPO is the clipped surrogate averaged over all tokens of
    the batch: dapo's loss with symmetric eps 0.2 on the reference tensors."""
    a, b = torch.tensor(LOGP, requires_grad=True), torch.tensor(LOGP, requires_grad=True)
    zeros = torch.zeros(2, 3)
    la, sa = call_loss("ppo", a, OLD, ADV, MASK, vf_coef=0.0, values=zeros, old_values=zeros, value_targets=zeros + 5)
    lb, _ = call_loss("dapo", b, OLD, ADV, MASK, eps_high=0.2)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    torch.testing.assert_close(a.grad, b.grad)
    d = torch.tensor(LOGP) - OLD
    assert float(sa["approx_kl"]) == pytest.approx(float((0.5 * d[MASK.bool()] ** 2).mean()), abs=1e-7)


def test_ppo_value_loss_with_clipping():
    """V, V_old, returns per token: (1.0, 0.5, 0.0) -> clipped V 0.7, error max(1.0, 0.49) = 1.0;
    (0.2, 0.5, 1.0) -> clipped 0.3, max(0.64, 0.49) = 0.64; (0.9, 0.5, 1.0) -> clipped 0.7,
    max(0.01, 0.09) = 0.09 (the clipped branch: no gradient). value_loss = mean 0.5*err = 0.288333."""
    v = torch.tensor([[1.0, 0.2, 0.9]], requires_grad=True)
    old_v, ret = torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([[0.0, 1.0, 1.0]])
    logp = torch.zeros(1, 3)
    loss, st = call_loss("ppo", logp, logp, torch.zeros(1), torch.ones(1, 3), values=v, old_values=old_v, value_targets=ret,
                         vf_coef=1.0, vf_clip=0.2)
    assert float(st["value_loss"]) == pytest.approx(0.288333, abs=1e-6) and loss.item() == pytest.approx(0.288333, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(v.grad, torch.tensor([[1.0, -0.8, 0.0]]) / 3)
    v2 = v.detach().clone().requires_grad_(True)
    loss, st = call_loss("ppo", logp, logp, torch.zeros(1), torch.ones(1, 3), values=v2, old_values=old_v, value_targets=ret,
                         vf_coef=1.0, vf_clip=0)  # 0 = no value clipping
    assert float(st["value_loss"]) == pytest.approx((0.5 + 0.32 + 0.005) / 3, abs=1e-6)


def test_whiten_and_adaptive_kl():
    x, m = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]), torch.tensor([[1, 1, 0], [1, 1, 0]])
    w = whiten(x, m)
    assert w[m.bool()].mean().item() == pytest.approx(0, abs=1e-6)
    assert w[m.bool()].pow(2).mean().item() == pytest.approx(1, abs=1e-5) and (w[~m.bool()] == 0).all()
    assert adaptive_beta(0.1, 0.2, 0.1, 1000) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # KL 2x target: +clip
    assert adaptive_beta(0.1, 0.09, 0.1, 1000) == pytest.approx(0.1 * (1 - 0.1 * 0.1))
    # Var([0, 1] residual) / Var([0, 2] returns) = 0.25 / 1 over the two masked tokens; padding ignored
    v, ret, m2 = torch.tensor([[0.0, 1.0, 5.0]]), torch.tensor([[0.0, 2.0, -7.0]]), torch.tensor([[1, 1, 0]])
    assert explained_variance(v, ret, m2).item() == pytest.approx(0.75)
    assert explained_variance(ret, ret, m2).item() == pytest.approx(1.0)


def test_bradley_terry_one_sgd_step():
    """From zero scores, one SGD step at lr 1 on one pair -> s_chosen 0.5, s_rejected -0.5."""
    s = torch.zeros(2, requires_grad=True)
    loss, st = bt_loss(s[:1], s[1:])
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    with torch.no_grad():
        s -= 1.0 * s.grad
    assert s.tolist() == pytest.approx([0.5, -0.5])


def test_nll_baseline_is_the_token_mean_over_the_batch():
    """losses.nll_loss (rl.py --loss=sft / rft): -sum m*logp / (all response tokens of the batch)."""
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, float("-inf")]], requires_grad=True)
    loss, stats = nll_loss(logp, MASK)
    assert loss.item() == pytest.approx((1.0 + 0.5 + 2.0 + 0.3 + 1.2) / 5) and float(stats["nll"]) == loss.item()
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.2, -0.2], [-0.2, -0.2, 0.0]]))  # padding: 0, not NaN
    part, _ = nll_loss(logp[:1], MASK[:1], n_tokens=5)  # a micro-batch with the global token count
    assert part.item() == pytest.approx(3.5 / 5)
    assert ALGOS["sft"].objective is ALGOS["rft"].objective is nll_loss and DEFAULTS["sft"] == DEFAULTS["rft"] == {}

# ----------------------------------------------------------------------------- by hand: beta > 0, PNPO, PPO

# A ragged batch (lengths 4, 2, 3) whose ratios fall on both sides of eps 0.2 and whose reference differs from
# the policy; the padding holds junk that must not count.
D2 = [[0.25, -0.1, 0.05, -0.3], [-0.35, 0.15], [0.1, 0.3, -0.15]]  # d_t = logp_t - old_logp_t
X2 = [[0.2, -0.15, 0.1, 0.3], [-0.25, 0.05], [0.4, -0.1, 0.2]]  # x_t = ref_logp_t - logp_t
LP2 = [[-0.7, -1.3, -0.2, -2.1], [-1.6, -0.4], [-0.9, -0.05, -1.4]]  # logp_t
ADV2 = [0.8, -1.1, 0.4]
TADV2 = [[0.6, 0.6, -0.2, -0.2], [-1.0, -0.5], [0.3, 0.3, 0.3]]  # token advantages (cliff, ppo)


def _pad(rows, junk):
    return torch.tensor([row + [junk] * (4 - len(row)) for row in rows])


def _batch2():
    """(logp, old_logp, ref_logp, mask) of the ragged batch above, each (3, 4)."""
    old = [[lp - d for lp, d in zip(*row)] for row in zip(LP2, D2)]
    ref = [[lp + x for lp, x in zip(*row)] for row in zip(LP2, X2)]
    return _pad(LP2, 9.0), _pad(old, -9.0), _pad(ref, -9.0), _pad([[1] * len(row) for row in LP2], 0)


def _kl_by_hand(x, kind):
    """Schulman's KL estimate at x = ref_logp - logp, and its derivative in logp."""
    if kind == "k1":
        return -x, 1.0
    if kind == "k2":
        return x * x / 2, -x
    return math.exp(x) - x - 1, 1 - math.exp(x)


def _clip_by_hand(r, a, eps_low, eps_high, clip_c=None):
    """min(r*A, clip(r, 1-eps_low, 1+eps_high)*A), at least clip_c*A for A < 0, and its derivative in
    log r: r*A where the unclipped branch is taken, else 0."""
    clipped = min(max(r, 1 - eps_low), 1 + eps_high) * a
    obj, grad = (r * a, r * a) if r * a <= clipped else (clipped, 0.0)
    if clip_c is not None and a < 0 and obj < clip_c * a:
        return clip_c * a, 0.0
    return obj, grad


def _token_by_hand(name, hp, a, t, lp_row, d_row):
    """Token t's objective before the KL term, and its derivative in logp_t, from each paper."""
    r, lp, n = math.exp(d_row[t]), lp_row[t], len(d_row)
    if name == "sapo":  # (4/tau) sigmoid(tau (r - 1)) A
        tau = hp["tau_pos"] if a > 0 else hp["tau_neg"]
        sg = 1 / (1 + math.exp(-tau * (r - 1)))
        return 4 / tau * sg * a, 4 * sg * (1 - sg) * r * a
    if name == "cispo":  # sg(min(r, eps_max)) A logp
        w = min(r, hp["eps_max"])
        return w * a * lp, w * a
    if name == "pnpo":  # gate * sg(w) A logp, w the geometric mean of the ratios up to t
        w, h = math.exp(sum(d_row[:t + 1]) / (t + 1)), math.sqrt(n / (t + 1))
        gate = 1 - hp["eps_low"] * h <= w <= 1 + hp["eps_high"] * h
        return gate * w * a * lp, gate * w * a
    return _clip_by_hand(r, a, hp["eps_low"], hp["eps_high"], hp.get("clip_c"))


def _by_hand(name, hp, adv, group_correct=None, group_size=None):
    """(loss, d loss / d logp (3, 4)) of the ragged batch, as loops over sequences and tokens."""
    B, n_tokens = len(LP2), sum(map(len, LP2))
    loss, grad = 0.0, torch.zeros(B, 4)
    for i, (lp_row, d_row, x_row) in enumerate(zip(LP2, D2, X2)):
        n = len(lp_row)
        kl = [_kl_by_hand(x, hp["kl_estimator"]) for x in x_row]
        if name in ("gspo", "gapo"):  # one clipped sequence ratio, minus beta * the sequence's mean KL
            a, eps_high = adv[i], hp["eps_high"]
            if name == "gapo":
                c, G = group_correct[i], group_size
                a = a if 0 < c < G else 0.0
                eps_high = hp["eps_low"] + (hp["eps_high"] - hp["eps_low"]) * (G - c) / (G - 1)
            obj, d_obj = _clip_by_hand(math.exp(sum(d_row) / n), a, hp["eps_low"], eps_high)
            loss -= (obj - hp["beta"] * sum(k for k, _ in kl) / n) / B
            for t, (_, dk) in enumerate(kl):
                grad[i, t] = -(d_obj - hp["beta"] * dk) / n / B
            continue
        norm = dict(dapo=n_tokens, cispo=n_tokens, dr_grpo=B * hp.get("max_new_tokens", 0)).get(name, B * n)
        for t in range(n):
            obj, d_obj = _token_by_hand(name, hp, adv[i][t] if name == "cliff" else adv[i], t, lp_row, d_row)
            loss -= (obj - hp["beta"] * kl[t][0]) / norm
            grad[i, t] = -(d_obj - hp["beta"] * kl[t][1]) / norm
    return loss, grad


CLIP = dict(eps_low=0.2, eps_high=0.2)
BETA_TABLE = [  # (loss, every hyperparameter it uses): the in-loss KL term of each loss, beta > 0
    ("grpo", dict(beta=0.04, kl_estimator="k3", **CLIP)),
    ("grpo", dict(beta=0.1, kl_estimator="k1", clip_c=1.1, **CLIP)),  # dual clip active on row 1's 2nd token
    ("cliff", dict(beta=0.1, kl_estimator="k2", **CLIP)),
    ("dapo", dict(beta=0.1, kl_estimator="k3", eps_low=0.2, eps_high=0.28)),
    ("dr_grpo", dict(beta=0.1, kl_estimator="k3", max_new_tokens=5, **CLIP)),
    ("sapo", dict(beta=0.1, kl_estimator="k3", tau_pos=1.0, tau_neg=1.05)),
    ("sapo", dict(beta=0.1, kl_estimator="k2", tau_pos=0.5, tau_neg=2.0)),
    ("cispo", dict(beta=0.1, kl_estimator="k3", eps_max=1.2)),  # caps the ratios 1.28 and 1.35
    ("pnpo", dict(beta=0.1, kl_estimator="k3", eps_low=0.15, eps_high=0.15)),  # gates 2 of the 9 tokens
    ("gspo", dict(beta=0.1, kl_estimator="k3", eps_low=3e-4, eps_high=4e-4)),
    ("gapo", dict(beta=0.1, kl_estimator="k1", eps_low=0.003, eps_high=0.005)),
]


@pytest.mark.parametrize("name,hp", BETA_TABLE, ids=[f"{n}-{hp['kl_estimator']}-{i}" for i, (n, hp) in
                                                      enumerate(BETA_TABLE)])
def test_in_loss_kl_by_hand(name, hp):
    """Every loss with an in-loss KL, beta > 0, on ragged rows: loss and gradient equal the
    paper's formula written as a loop. Pins the estimator, the sign of the KL and its normaliser (GSPO and
    GAPO: the KL averaged over each sequence, not summed), clip bounds, SAPO's tau_pos/tau_neg, CISPO's
    cap."""
    logp, old, ref, mask = _batch2()
    logp.requires_grad_(True)
    adv = _pad(TADV2, 5.0) if name == "cliff" else torch.tensor(ADV2)
    extra = dict(group_correct=[1, 4, 2], group_size=4) if name == "gapo" else {}  # row 1: c = G, no signal
    loss, _ = call_loss(name, logp, old, adv, mask, ref_logp=ref, **hp, **extra)
    loss.backward()
    want, grad = _by_hand(name, hp, TADV2 if name == "cliff" else ADV2, **extra)
    assert loss.item() == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(logp.grad, grad, atol=1e-6, rtol=0)


def test_pnpo_gate_uses_the_length_weight_and_the_geometric_mean_prefix():
    """PNPO counts token t only if 1 - eps_low*h_t <= w_t <= 1 + eps_high*h_t, w_t = exp(cumsum(d)_t / t) the
    geometric mean of the ratios so far, h_t = sqrt(|y_i|/t). With eps 0.1/0.12 on rows of lengths 4, 1, 2 the
    gate is [[1, 1, 1, 1], [0], [1, 1]]: h inverted to sqrt(t/|y|) would shut tokens (0, 0), (0, 1), (2, 0); a
    product exp(cumsum(d)) would shut (0, 1), (2, 1); eps_low and eps_high swapped would open (1, 0)."""
    d = [[0.15, 0.05, -0.12, 0.02], [-0.12], [0.12, 0.03]]
    lp = [[-0.4, -1.1, -0.3, -2.0], [-0.8], [-1.5, -0.6]]
    adv, eps_low, eps_high = [0.9, -1.3, 0.5], 0.1, 0.12
    gate, want, grad = [], 0.0, torch.zeros(3, 4)
    for i, (d_row, lp_row) in enumerate(zip(d, lp)):
        n = len(d_row)
        for t in range(n):
            w, h = math.exp(sum(d_row[:t + 1]) / (t + 1)), math.sqrt(n / (t + 1))
            gate.append(1 - eps_low * h <= w <= 1 + eps_high * h)
            want -= gate[-1] * w * adv[i] * lp_row[t] / n / 3
            grad[i, t] = -gate[-1] * w * adv[i] / n / 3
    assert gate == [True] * 4 + [False] + [True] * 2
    logp = _pad(lp, -5.0).requires_grad_(True)
    old = _pad([[l - x for l, x in zip(*row)] for row in zip(lp, d)], 3.0)
    mask = _pad([[1] * len(row) for row in lp], 0)
    loss, stats = call_loss("pnpo", logp, old, torch.tensor(adv), mask, eps_low=eps_low, eps_high=eps_high)
    loss.backward()
    assert loss.item() == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(logp.grad, grad, atol=1e-6, rtol=0)
    assert (float(stats["clipfrac_low"]), float(stats["clipfrac_high"])) == pytest.approx((1 / 7, 0.0))


@pytest.mark.parametrize("vf_clip", [0.2, 0.0])
def test_ppo_every_term_by_hand(vf_clip):
    """PPO per token: clip_obj - vf_coef * 0.5 * err + ent_coef * H, summed over the 9 tokens, divided by 9,
    with an entropy bonus (ent_coef 0.05: raising H lowers the loss), value clipping on (err = the larger of
    (V - ret)^2 and (V_old + clip(V - V_old, +-0.2) - ret)^2; the clipped branch wins on 3 tokens) and off.
    Old values, returns and advantages get no gradient."""
    V = [[0.5, 0.1, -0.3, 0.9], [0.0, 0.7], [0.2, -0.6, 0.4]]
    V_OLD = [[0.2, 0.2, -0.2, 0.5], [0.1, 0.4], [0.35, -0.6, 0.1]]
    RET = [[1.0, -0.5, 0.0, 0.6], [-0.3, 1.2], [0.25, 0.0, 0.9]]
    H = [[1.2, 0.4, 0.9, 0.1], [2.0, 0.3], [0.5, 1.1, 0.7]]
    vf_coef, ent_coef = 0.1, 0.05
    want, g_logp, g_v = 0.0, torch.zeros(3, 4), torch.zeros(3, 4)
    for i, d_row in enumerate(D2):
        for t, d in enumerate(d_row):
            pg, d_pg = _clip_by_hand(math.exp(d), TADV2[i][t], 0.2, 0.2)
            v, v_old, ret = V[i][t], V_OLD[i][t], RET[i][t]
            err, d_err = (v - ret) ** 2, 2 * (v - ret)
            if vf_clip:
                v_clip = v_old + min(max(v - v_old, -vf_clip), vf_clip)
                if (v_clip - ret) ** 2 > err:  # the clipped branch: no gradient once the clip is active
                    err, d_err = (v_clip - ret) ** 2, 2 * (v_clip - ret) * (abs(v - v_old) < vf_clip)
            want -= (pg - vf_coef * 0.5 * err + ent_coef * H[i][t]) / 9
            g_logp[i, t], g_v[i, t] = -d_pg / 9, vf_coef * 0.5 * d_err / 9
    logp, old, _, mask = _batch2()
    logp.requires_grad_(True)
    values, entropy = _pad(V, 4.0).requires_grad_(True), _pad(H, 7.0).requires_grad_(True)
    adv, old_values, returns = (_pad(x, 3.0).requires_grad_(True) for x in (TADV2, V_OLD, RET))
    loss, stats = call_loss("ppo", logp, old, adv, mask, values=values, old_values=old_values, value_targets=returns,
                            entropy=entropy, vf_coef=vf_coef, vf_clip=vf_clip, ent_coef=ent_coef)
    loss.backward()
    assert loss.item() == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(logp.grad, g_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(values.grad, g_v, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.grad, -ent_coef / 9 * mask, atol=1e-7, rtol=0)
    assert adv.grad is None and old_values.grad is None and returns.grad is None


@pytest.mark.parametrize("name", ON_LOGP)
def test_old_logp_ref_logp_and_advantages_are_constants(name):
    """The gradient flows through logp only: old_logp, ref_logp and adv handed in with requires_grad (as
    they would be, computed from the same model) get none, and logp gets some."""
    B, T = 6, 5
    logp, old, ref, adv, mask = _batch(B, T, per_token=name == "cliff")
    logp.requires_grad_(True)
    old, ref, adv = (x.clone().requires_grad_(True) for x in (old, ref, adv))
    extra = _extra(name, B, T)
    if name == "ppo":
        extra["values"] = torch.randn(B, T, requires_grad=True)
    loss, _ = call_loss(name, logp, old, adv, mask, ref, **_hp(name), **extra)
    loss.backward()
    assert old.grad is None and ref.grad is None and adv.grad is None
    assert (logp.grad != 0).any()


# ----------------------------------------------------------------------------- gmpo, dppo, maxrl by hand
# The reference batch: d = logp - old = [[0.1, -0.1, 0.1], [0.2, -0.2, pad]], A = [1, -1].

@pytest.mark.parametrize("hp,loss,grad,low,high", [
    # no token clipped: w = exp(mean d) = [exp(1/30), exp(0)]; loss = -(1.0338951 - 1) / 2
    (dict(), -0.0169475, [[-0.1723159] * 3, [0.25, 0.25, 0]], 0, 0),
    # eps_high 0.05 cuts row 0's two +0.1 tokens (A > 0): l = [0.05, -0.1, 0.05], w0 = exp(0) = 1;
    # eps_low 0.15 cuts row 1's -0.2 (A <= 0 takes max(d, -0.15)): w1 = exp((0.2 - 0.15) / 2)
    (dict(eps_low=0.15, eps_high=0.05), 0.0126576, [[0, -1 / 6, 0], [0.2563288, 0, 0]], 0.2, 0.4),
])
def test_gmpo_by_hand(hp, loss, grad, low, high):
    logp = torch.tensor(LOGP, requires_grad=True)
    out, stats = call_loss("gmpo", logp, OLD, ADV, MASK, **hp)
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor(grad), atol=1e-6, rtol=0)
    assert float(stats["clipfrac_low"]) == pytest.approx(low) and float(stats["clipfrac_high"]) == pytest.approx(high)
    with pytest.raises(ValueError, match="per-sequence"):
        call_loss("gmpo", logp, OLD, ADV[:, None].expand(2, 3), MASK)


@pytest.mark.parametrize("hp,loss,grad", [
    # p - p_old = [[0.0350, -0.0638, 0.0129], [0.1343, -0.0667]]: delta 0.2 counts every token;
    # loss = -sum r*A*logp / 5 with r = exp(d), the gradient -r*A/5: CISPO's at these ratios
    (dict(), 0.4838068, DAPO_GRAD),
    # delta 0.05 drops row 1's second token (A <= 0, p fell by 0.0667); is_cap 1.1 caps r = 1.105, 1.221
    (dict(delta=0.05, is_cap=1.1), 0.6844837, [[-0.22, -0.1809675, -0.22], [0.22, 0, 0]]),
])
def test_dppo_by_hand(hp, loss, grad):
    logp = torch.tensor(LOGP, requires_grad=True)
    out, stats = call_loss("dppo", logp, OLD, ADV, MASK, **hp)
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor(grad), atol=1e-6, rtol=0)
    assert float(stats["clipfrac_low"]) == pytest.approx(0.2 if hp else 0.0)


def test_maxrl_by_hand():
    # per-sequence token means of A*logp: -7/6 and +0.75; loss = -(-7/6 + 0.75) / 2
    logp = torch.tensor(LOGP, requires_grad=True)
    out, _ = call_loss("maxrl", logp, OLD, ADV, MASK)
    out.backward()
    assert out.item() == pytest.approx(0.2083333, abs=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 6] * 3, [0.25, 0.25, 0]]), atol=1e-7, rtol=0)


# ----------------------------------------------------------------------------- clip_cov, kl_cov, reinforce_pp, remax
# On the reference batch: r = exp(d) = [[1.105171, 0.904837, 1.105171], [1.221403, 0.818731]], A = [1, -1], and
# cov_t = (A_t - mean A)(logp_t - mean logp) = (A_t - 0.2)(logp_t + 1) = [[0, 0.4, -0.8], [-0.84, 0.24]].
COV = torch.tensor([[0, 1, 0], [0, 0, 0]], dtype=torch.bool)  # token (0, 1) singled out


@pytest.mark.parametrize("hp,want", [
    (dict(cov_lb=0.1, cov_ub=0.5, cov_ratio=0.4), [[0, 1, 0], [0, 1, 0]]),  # n = 2: both candidates
    (dict(cov_lb=0.1, cov_ub=0.3, cov_ratio=0.4), [[0, 0, 0], [0, 1, 0]]),  # 0.4 is not below ub
    (dict(cov_lb=0.1, cov_ub=0.5, cov_ratio=0.4, eps_low=0.15), [[0, 1, 0], [0, 0, 0]]),  # r 0.819 clipped
    (dict(cov_ratio=0.4), [[0, 0, 0], [0, 0, 0]]),  # the default band 1 < cov < 5 holds none
])
def test_clip_cov_selection_by_hand(hp, want):
    sel = cov_select(torch.tensor(LOGP), OLD, ADV, MASK, torch.Generator().manual_seed(0),
                     kind="clip_cov", **resolve_hparams("clip_cov", **hp))
    assert torch.equal(sel, torch.tensor(want, dtype=torch.bool))


def test_clip_cov_draws_n_of_the_candidates_with_the_generator():
    """n = max(floor(2e-4 * 5), 1) = 1 of the two candidates (0, 1), (1, 1), the draw fixed by the seed."""
    hp = resolve_hparams("clip_cov", cov_lb=0.1, cov_ub=0.5)
    picks = {seed: cov_select(torch.tensor(LOGP), OLD, ADV, MASK, torch.Generator().manual_seed(seed),
                              kind="clip_cov", **hp) for seed in range(8)}
    for seed, sel in picks.items():
        assert int(sel.sum()) == 1 and (sel[0, 1] or sel[1, 1])
        again = cov_select(torch.tensor(LOGP), OLD, ADV, MASK, torch.Generator().manual_seed(seed), kind="clip_cov", **hp)
        assert torch.equal(sel, again)
    assert len({tuple(s.flatten().tolist()) for s in picks.values()}) == 2  # both get drawn


@pytest.mark.parametrize("ratio,want", [(0.002, [[0, 1, 0], [0, 0, 0]]), (0.4, [[0, 1, 0], [0, 1, 0]])])
def test_kl_cov_selection_is_the_top_covariance(ratio, want):
    sel = cov_select(torch.tensor(LOGP), OLD, ADV, MASK, kind="kl_cov", **resolve_hparams("kl_cov", cov_ratio=ratio))
    assert torch.equal(sel, torch.tensor(want, dtype=torch.bool))


def test_clip_cov_and_kl_cov_by_hand():
    """No token clipped at eps 0.2, so clip_cov = -sum r*A / 5 without token (0, 1): -(1.075046 - 0.904837) / 5,
    gradient -r*A/5 elsewhere (DAPO's here) and 0 there. kl_cov subtracts |d_01| = 0.1 instead: -(1.075046 -
    0.1) / 5, and token (0, 1) gets -(r*A - sign(d)) / 5 = -(0.904837 + 1) / 5."""
    for name, loss, g01 in (("clip_cov", -0.0340417, 0.0), ("kl_cov", -0.1950091, -0.3809675)):
        logp = torch.tensor(LOGP, requires_grad=True)
        out, stats = call_loss(name, logp, OLD, ADV, MASK, cov_mask=COV)
        out.backward()
        grad = torch.tensor(DAPO_GRAD)
        grad[0, 1] = g01
        assert out.item() == pytest.approx(loss, abs=1e-6)
        torch.testing.assert_close(logp.grad, grad, atol=1e-6, rtol=0)
        assert float(stats["cov_frac"]) == pytest.approx(0.2)


def test_reinforce_pp_by_hand():
    """Token advantages [[0.5, -1, 2], [-0.3, 0.8]] at eps_low 0.05, eps_high 0.1: r = 1.105 > 1.1 clips both A > 0
    tokens of row 0 (objective 1.1*A, no gradient), r = 0.905 < 0.95 clips the A < 0 one (0.95*A); the rest stay
    r*A. loss = -(0.55 - 0.95 + 2.2 - 0.366421 + 0.654985) / 5."""
    logp = torch.tensor(LOGP, requires_grad=True)
    adv = torch.tensor([[0.5, -1.0, 2.0], [-0.3, 0.8, 9.0]])
    out, stats = call_loss("reinforce_pp", logp, OLD, adv, MASK, eps_low=0.05, eps_high=0.1)
    out.backward()
    assert out.item() == pytest.approx(-0.4177128, abs=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor([[0, 0, 0], [0.0732842, -0.1309969, 0]]), atol=1e-6, rtol=0)
    assert float(stats["clipfrac_high"]) == pytest.approx(0.4) and float(stats["clipfrac_low"]) == pytest.approx(0.2)


def test_remax_by_hand():
    """Token sum of A*logp over all 5 tokens: -((-3.5) - (-1.5)) / 5; gradient -A/5."""
    logp = torch.tensor(LOGP, requires_grad=True)
    out, _ = call_loss("remax", logp, OLD, ADV, MASK)
    out.backward()
    assert out.item() == pytest.approx(0.4, abs=1e-7)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2] * 3, [0.2, 0.2, 0]]), atol=1e-7, rtol=0)
