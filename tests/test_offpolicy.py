"""The off-policy lab: rollout-correction weights and the distillation losses by hand."""
import math

import pytest
import torch

import losses as L

# ----------------------------------------------------------------------------- weights by hand
# rho = exp(old - mu): row 0 [3, 0.4, 1.5]; row 1 [6, 0.8] and padding holding a junk 100 (5 tokens)
MU = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
RHO = torch.tensor([[3.0, 0.4, 1.5], [6.0, 0.8, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("kind, want, frac", [
    ("tis", [[2, 0.4, 1.5], [2, 0.8]], 2 / 5),  # min(rho, 2): 3 and 6 capped
    ("seq_tis", [[1.8, 1.8, 1.8], [2, 2]], 2 / 5),  # 3 * 0.4 * 1.5 = 1.8; 6 * 0.8 = 4.8 -> 2 (padding left out)
    ("icepop", [[3, 0, 1.5], [0, 0.8]], 2 / 5),  # outside [0.5, 5]: 0.4 and 6 masked
    ("decoupled", [[3, 0.4, 1.5], [0, 0.8]], 1 / 5),  # above 5: 6 masked
])
def test_rollout_weights_by_hand(kind, want, frac):
    w, cut = L.rollout_weights(MU + RHO.log(), MU, MASK, kind)
    got = [w[0].tolist(), w[1, :2].tolist()]
    assert got == [pytest.approx(r, abs=1e-5) for r in want] and cut.item() == pytest.approx(frac)
    assert not w.requires_grad


def test_rollout_weights_refuse_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown rollout correction 'is'"):
        L.rollout_weights(MU, MU, MASK, "is")


def test_teacher_advantage_and_opd_by_hand():
    """A_t = -clamp(log mu - log pi_T, +-10): mu - teacher = [0.5, -12, 3] -> A = [-0.5, 10, -3]; at ratio 1
    opd's loss is -sum_t A_t / n_tokens and its gradient -A_t / n_tokens."""
    mu = torch.tensor([[-1.0, -13.0, -0.5], [-2.0, -0.1, 0.0]])
    teacher = torch.tensor([[-1.5, -1.0, -3.5], [-2.0, -0.3, -5.0]])
    adv = L.teacher_advantages(mu, teacher, MASK)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 10.0, -3.0], [0.0, -0.2, 0.0]]))
    logp = mu.clone().requires_grad_(True)
    loss, stats = L.opd(logp, mu, adv, MASK, n_tokens=10)
    loss.backward()
    assert loss.item() == pytest.approx(-6.3 / 10) and float(stats["ratio_max"]) == 1
    torch.testing.assert_close(logp.grad, -adv / 10)
    logp = torch.tensor([[-1.0 + math.log(2), -13.0, -0.5], [-2.0, -0.1, 0.0]])  # ratio 2 on token 0
    assert L.opd(logp, mu, adv, MASK)[0].item() == pytest.approx(-(2 * -0.5 + 10 - 3 - 0.2) / 5)
    zero = L.teacher_advantages(mu, mu, MASK)  # the teacher is the sampler: no credit anywhere
    logp = mu.clone().requires_grad_(True)
    loss, _ = L.opd(logp, mu, zero, MASK)
    loss.backward()
    assert loss.item() == 0 and torch.equal(zero, torch.zeros(2, 3)) and not logp.grad.any()

# ----------------------------------------------------------------------------- gkd by hand
# student p = [0.7, 0.2, 0.1], teacher q = [0.2, 0.5, 0.3]:
# KL(p||q) = 0.7 ln 3.5 + 0.2 ln 0.4 + 0.1 ln(1/3) = 0.583815; KL(q||p) = 0.2 ln(2/7) + 0.5 ln 2.5 + 0.3 ln 3
# = 0.537176; b = 0.5: M = [0.45, 0.35, 0.2], KL(q||M) = 0.137791, KL(p||M) = 0.128045, JSD 0.132918.
# d KL(p||q)/dz_j = p_j (ln(p_j/q_j) - KL); d KL(q||p)/dz = p - q.
P, Q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.2, 0.5, 0.3])


@pytest.mark.parametrize("beta, want, grad", [
    (1.0, 0.583815, [0.7 * (math.log(3.5) - 0.583815), 0.2 * (math.log(0.4) - 0.583815),
                     0.1 * (math.log(1 / 3) - 0.583815)]),
    (0.0, 0.537176, [0.5, -0.3, -0.2]),
    (0.5, 0.132918, None),
])
def test_gkd_by_hand(beta, want, grad):
    """Position 0 holds the pair; position 1 is padding with other logits (left out); n_tokens 4 divides."""
    z = torch.stack([P.log(), torch.tensor([5.0, -5.0, 0.0])])[None].requires_grad_(True)  # (1, 2, 3)
    zt = torch.stack([Q.log(), torch.tensor([-5.0, 5.0, 0.0])])[None]
    mask, lp = torch.tensor([[1, 0]]), torch.zeros(1, 2)
    loss, _ = L.gkd(lp, lp, torch.zeros(1), mask, logits=z, teacher_logits=zt, gkd_beta=beta)
    assert loss.item() == pytest.approx(want, abs=1e-5)
    assert L.gkd(lp, lp, torch.zeros(1), mask, n_tokens=4, logits=z, teacher_logits=zt,
                 gkd_beta=beta)[0].item() == pytest.approx(want / 4, abs=1e-5)
    loss.backward()
    if grad is not None:
        torch.testing.assert_close(z.grad[0, 0], torch.tensor(grad), atol=1e-5, rtol=0)
    assert not z.grad[0, 1].any()  # padding: no gradient


@pytest.mark.parametrize("beta", [1.0, 0.0, 0.5])
def test_gkd_against_itself_is_zero_with_zero_gradient(beta):
    torch.manual_seed(0)
    z = torch.randn(2, 3, 16, requires_grad=True)
    loss, _ = L.gkd(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), MASK, logits=z, teacher_logits=z.detach(),
                    gkd_beta=beta)
    loss.backward()
    assert abs(loss.item()) < 1e-6 and z.grad.abs().max() < 1e-6
