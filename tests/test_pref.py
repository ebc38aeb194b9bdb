"""Preference losses: reference numbers, the DPO gradient at policy == reference, closed-form
optima on a tabular toy, KTO's reference point z, the pairs/KTO JSONL loader and rl.py end to end."""
import math

import pytest
import torch

import losses as L
import rl
from nanorl import pref
from verify import VERIFIERS
from data.tasks import DataError
from nanorl.pref import ensure_pairs, load_records

from test_rl import run

LOG = lambda *p: torch.log(torch.tensor(p))  # noqa: E731


def test_dpo_reference_numbers():
    loss, _ = L.dpo_loss(LOG(.5), LOG(.1), LOG(.25), LOG(.25), beta=1.0)
    assert loss.item() == pytest.approx(0.182322, abs=1e-6)  # -log 5/6
    m = torch.zeros(1, requires_grad=True)
    loss, stats = L.dpo_loss(m, torch.zeros(1), torch.zeros(1), torch.zeros(1), beta=0.1)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    loss.backward()
    assert -m.grad.item() == pytest.approx(0.05, abs=1e-7)  # -dL/dm = beta * sigmoid(0)
    assert float(stats["margin"]) == 0 and float(stats["pair_accuracy"]) == 0
    ipo, _ = L.dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), beta=0.1, kind="ipo")
    assert ipo.item() == pytest.approx(25.0)  # (0 - 1/(2*0.1))^2
    with pytest.raises(ValueError, match="unknown DPO kind"):
        L.dpo_loss(m, m, m, m, kind="hinge")


def test_kto_reference_numbers():
    args = (torch.tensor([-3.0, -5.0]), torch.tensor([-3.5, -4.0]), torch.tensor([1, 0]),
            torch.tensor([-6.0, -7.0]), torch.tensor([-6.5, -7.2]))
    loss, stats = L.kto_loss(*args, beta=0.1)
    assert loss.item() == pytest.approx(0.481276, abs=1e-6)
    assert float(stats["z"]) == pytest.approx(0.35)  # mean(0.5, 0.2), clamped at 0 from below
    assert L.kto_loss(*args, beta=1.0)[0].item() == pytest.approx(0.334220, abs=1e-6)



def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_kto_asymmetric_lambdas_by_hand():
    """KTO with lambda_d 1.3 != lambda_u 0.7, beta 0.5, three answers (desirable, undesirable, desirable):
    r = pi - ref = (0.5, -1.0, 0.6), z = mean(0.5, 0.2) = 0.35; desirable answers lose
    lambda_d * (1 - sigmoid(beta (r - z))), the undesirable one lambda_u * (1 - sigmoid(beta (z - r))).
    The gradient in pi is the same formulas' derivative; z is a detached constant (no gradient to the
    mismatched pairs)."""
    beta, lam_d, lam_u, r, z = 0.5, 1.3, 0.7, [0.5, -1.0, 0.6], 0.35
    s = [_sigmoid(beta * (r[0] - z)), _sigmoid(beta * (z - r[1])), _sigmoid(beta * (r[2] - z))]
    want = (lam_d * (1 - s[0]) + lam_u * (1 - s[1]) + lam_d * (1 - s[2])) / 3
    grad = [-lam_d * beta * s[0] * (1 - s[0]) / 3, lam_u * beta * s[1] * (1 - s[1]) / 3,
            -lam_d * beta * s[2] * (1 - s[2]) / 3]
    pi = torch.tensor([-3.0, -5.0, -4.0], requires_grad=True)
    pi_mis = torch.tensor([-6.0, -7.0], requires_grad=True)
    loss, stats = L.kto_loss(pi, torch.tensor([-3.5, -4.0, -4.6]), torch.tensor([1, 0, 1]), pi_mis,
                             torch.tensor([-6.5, -7.2]), beta=beta, lambda_d=lam_d, lambda_u=lam_u)
    loss.backward()
    assert loss.item() == pytest.approx(want, abs=1e-6)
    assert pi.grad.tolist() == pytest.approx(grad, abs=1e-6) and pi_mis.grad is None
    assert float(stats["z"]) == pytest.approx(z)
    assert float(stats["desirable_reward"]) == pytest.approx(beta * (0.5 + 0.6) / 2, abs=1e-6)
    assert float(stats["undesirable_reward"]) == pytest.approx(beta * -1.0, abs=1e-6)


def test_kto_reference_point_is_clamped_at_zero():
    """The mismatched pairs' mean log-ratio (-0.25 here) is negative: z = max(0, -0.25) = 0, and the losses
    are 1 - sigmoid(beta r) (desirable, r = 0.5) and 1 - sigmoid(-beta r) (undesirable, r = -1.0)."""
    loss, stats = L.kto_loss(torch.tensor([-3.0, -5.0]), torch.tensor([-3.5, -4.0]), torch.tensor([1, 0]),
                             torch.tensor([-6.0, -7.5]), torch.tensor([-6.5, -7.5 + 1.0]), beta=0.5)
    assert float(stats["z"]) == 0.0
    assert loss.item() == pytest.approx((1 - _sigmoid(0.25) + 1 - _sigmoid(0.5)) / 2, abs=1e-6)


def test_conservative_dpo_by_hand_and_its_stats():
    """Label smoothing eps 0.2, beta 0.5 on two pairs with log-ratio margins m = log 10 and log 0.375 (the
    second pair ranked wrongly): loss = mean -(1-eps) log sigmoid(beta m) - eps log sigmoid(-beta m), its
    gradient in pi_chosen, and the stats (implicit rewards beta*(pi - ref) of chosen and rejected, beta*m,
    pair accuracy 1/2)."""
    beta, eps = 0.5, 0.2
    pc = torch.log(torch.tensor([0.5, 0.3])).requires_grad_(True)
    chosen = [math.log(0.5 / 0.25), math.log(0.3 / 0.2)]  # pi - ref
    rejected = [math.log(0.1 / 0.5), math.log(0.4 / 0.1)]
    m = [c - r for c, r in zip(chosen, rejected)]  # log 10, log 0.375
    want = sum(-(1 - eps) * math.log(_sigmoid(beta * x)) - eps * math.log(_sigmoid(-beta * x)) for x in m) / 2
    grad = [beta * (-(1 - eps) * (1 - _sigmoid(beta * x)) + eps * _sigmoid(beta * x)) / 2 for x in m]
    loss, stats = L.dpo_loss(pc, LOG(.1, .4), LOG(.25, .2), LOG(.5, .1), beta=beta, label_smoothing=eps)
    loss.backward()
    assert loss.item() == pytest.approx(want, abs=1e-6) and pc.grad.tolist() == pytest.approx(grad, abs=1e-6)
    assert float(stats["chosen_reward"]) == pytest.approx(beta * sum(chosen) / 2, abs=1e-6)
    assert float(stats["rejected_reward"]) == pytest.approx(beta * sum(rejected) / 2, abs=1e-6)
    assert float(stats["margin"]) == pytest.approx(beta * sum(m) / 2, abs=1e-6)
    assert float(stats["pair_accuracy"]) == 0.5


def test_dpo_gradient_at_reference_is_half_beta_times_logprob_gradient_difference():
    """With policy == reference: -grad L = beta*sigmoid(0)*(grad pi_chosen - grad pi_rejected)."""
    torch.manual_seed(0)
    w = torch.randn(3, 5, requires_grad=True)
    x = torch.randn(4, 5)

    def logps(w):
        lp = torch.log_softmax(x @ w.T, -1)  # (4, 3)
        return lp[:2, 0] + lp[2:, 1], lp[:2, 2] + lp[2:, 0]  # (2,) chosen / rejected sequence sums

    pc, pr = logps(w)
    loss, _ = L.dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.1)
    g = torch.autograd.grad(loss, w, retain_graph=True)[0]
    gc = torch.autograd.grad(pc.mean(), w, retain_graph=True)[0]
    gr = torch.autograd.grad(pr.mean(), w)[0]
    torch.testing.assert_close(-g, 0.1 * 0.5 * (gc - gr), atol=1e-7, rtol=1e-6)


def _tabular(kind, beta, steps=3000, **kw):
    """One prompt, a softmax over 4 answers, reference uniform; chosen = answer 0, rejected = 1."""
    theta = torch.zeros(4, requires_grad=True)
    ref = torch.log(torch.full((4,), 0.25))
    opt = torch.optim.Adam([theta], lr=0.05)
    for _ in range(steps):
        lp = torch.log_softmax(theta, 0)
        loss, _ = L.dpo_loss(lp[:1], lp[1:2], ref[:1], ref[1:2], beta=beta, kind=kind, **kw)
        opt.zero_grad()
        loss.backward()
        opt.step()
    lp = torch.log_softmax(theta.detach(), 0)
    return ((lp[0] - ref[0]) - (lp[1] - ref[1])).item()


def test_conservative_dpo_and_ipo_reach_their_closed_form_margins():
    m = _tabular("sigmoid", 0.1, label_smoothing=0.1)
    assert m == pytest.approx(math.log(0.9 / 0.1) / 0.1, abs=0.05)  # beta*m = logit(1-eps): m = 21.97
    assert _tabular("ipo", 0.1) == pytest.approx(1 / (2 * 0.1), abs=0.01)  # m = 1/(2 beta) = 5


def test_kto_moves_desirable_up_undesirable_down_with_hand_computed_z():
    """Two prompts, a tabular softmax over 3 answers each. Batch: (x0, a0) desirable, (x1, a1)
    undesirable; mismatched pairs (x0, a1) and (x1, a0) as rl.py builds them (answer i+1 after prompt i)."""
    theta = torch.zeros(2, 3, requires_grad=True)
    ref = torch.log_softmax(torch.zeros(2, 3), 1)
    opt = torch.optim.SGD([theta], lr=1.0)
    for _ in range(100):
        lp = torch.log_softmax(theta, 1)
        pi, rf = torch.stack([lp[0, 0], lp[1, 1]]), torch.stack([ref[0, 0], ref[1, 1]])
        pi_mis, ref_mis = torch.stack([lp[0, 1], lp[1, 0]]).detach(), torch.stack([ref[0, 1], ref[1, 0]])
        loss, stats = L.kto_loss(pi, rf, torch.tensor([1, 0]), pi_mis, ref_mis, beta=0.5)
        z_hand = max(0.0, ((lp[0, 1] - ref[0, 1]) + (lp[1, 0] - ref[1, 0])).item() / 2)
        assert float(stats["z"]) == pytest.approx(z_hand, abs=1e-7)
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = torch.softmax(theta.detach(), 1)
    assert p[0, 0] > 0.6 and p[1, 1] < 0.15  # from 1/3 each


@pytest.mark.parametrize("line, match", [
    ('{"prompt": "2*3=", "chosen": "6"', r":2: not valid JSON"),
    ('{"prompt": "2*3=", "chosen": "6"}', r":2: field 'rejected' missing"),
    ('{"prompt": "2*3=", "chosen": "6", "rejected": "x"}', r":2: field 'rejected' has character 'x'"),
    ('[1, 2]', r":2: expected a JSON object"),
])
def test_bad_pairs_file_names_the_line(tmp_path, line, match):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "2*3=", "chosen": "6", "rejected": "7"}\n' + line + "\n")
    with pytest.raises(DataError, match=match):
        load_records(path, "pairs")


def test_empty_or_mislabelled_files_are_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no pairs records"):
        load_records(tmp_path / "empty.jsonl", "pairs")
    (tmp_path / "kto.jsonl").write_text('{"prompt": "2*3=", "completion": "6", "label": "yes"}\n')
    with pytest.raises(DataError, match=r":1: field 'label' missing or not a bool"):
        load_records(tmp_path / "kto.jsonl", "kto")
    assert len(load_records(ensure_pairs("mul") / "kto_val.jsonl", "kto")) == 405


def scored_rollout(scores):
    """A rollout of one-token prompts [10 + r] and responses [r, 2] (EOS 2), with these scores."""
    n = len(scores)
    ids = torch.tensor([[10 + r, r, 2] for r in range(n)])  # (N, P+L), P = 1, L = 2
    mask = torch.ones(n, 2, dtype=torch.long)
    return rl.rows.Rollout(ids, torch.zeros(n), mask, torch.zeros(n, 2), length=torch.full((n,), 2),
                      score=torch.tensor(scores))


def test_rft_keeps_only_the_samples_that_score_1():
    """Verified-correct is a score of 1, as accuracy and pass@k count it: partial credit (an rg:
    task's 0.5) is not kept. A pair row takes each group's best and worst sample."""
    batch = scored_rollout([0.0, 0.5, 1.0, 1.0, 0.5, 0.0])  # 2 groups of 3
    rows, labels = pref.rollout_rows(batch, L.ALGOS["rft"], 3)
    assert rows == [([12], [2, 2], [1, 1]), ([13], [3, 2], [1, 1])] and labels is None
    rows, labels = pref.rollout_rows(batch, L.ALGOS["dpo"], 3)
    assert [p for p, _, _ in rows] == [[12], [13], [10], [15]]  # chosen, then rejected
    rows, labels = pref.rollout_rows(batch, L.ALGOS["kto"], 3)
    assert labels.tolist() == [True, True, False, False]


def test_online_pairs_rank_by_the_return_dynamic_sampling_tests():
    """An environment's turn rewards join the score in the episode return that dynamic sampling
    keeps groups by; the pairs rank by it too. Group 0 (scores 0 0 1, returns 0.5 0.1 1.0): chosen
    row 2, rejected row 1 (by score alone: row 0). Group 1 lost every game (scores 0 0 0, returns
    0.3 0.1 0.2): a signal to dynamic sampling, and a pair of rows 3 and 4 (by score: row 3 twice)."""
    batch = scored_rollout([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    batch.turn_rewards = torch.tensor([[0.5, 0], [0.1, 0], [0, 0], [0.3, 0], [0.1, 0], [0.2, 0]])
    rows, labels = pref.rollout_rows(batch, L.ALGOS["dpo"], 3)
    assert [p for p, _, _ in rows] == [[12], [13], [11], [14]]  # chosen 2, 3; rejected 1, 4
    assert pref.rollout_rows(batch, L.ALGOS["rft"], 3)[0] == [([12], [2, 2], [1, 1])]  # score 1 only


@pytest.mark.parametrize("loss, pairs", [("dpo", "offline"), ("ipo", "offline"), ("kto", "offline"),
                                         ("dpo", "online"), ("kto", "online")])
def test_preference_losses_run_and_log(sft_ckpt, tmp_path, monkeypatch, loss, pairs):  # noqa: F811
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: float(text[:1] == "1"))
    res, rows = run(sft_ckpt, tmp_path, loss=loss, pairs=pairs, pairs_per_step=4, group_size=16)  # 16: mixed groups
    train = [r for r in rows if "rl/loss" in r]
    assert len(train) == 2 and all(math.isfinite(r["rl/loss"]) for r in train)
    keys = ["rl/z", "rl/desirable_reward", "rl/undesirable_reward"] if loss == "kto" else \
        ["rl/chosen_reward", "rl/rejected_reward", "rl/margin", "rl/pair_accuracy"]
    assert all(k in train[-1] for k in keys)
    if pairs == "online":
        assert "rl/zero_std_frac" in train[-1]
    assert train[0]["rl/n_seqs"] == 2 * 4  # 4 pairs or 8 labelled answers (pairs_per_step 4 offline, 4 prompts online)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2] and "eval/kl" in evals[-1]
    hp = [r for r in rows if "hparams/beta" in r][0]
    assert hp["hparams/beta"] == L.DEFAULTS[loss]["beta"] and hp["hparams/rpo_alpha"] == 1.0


def test_preference_config_errors(sft_ckpt, tmp_path):  # noqa: F811
    from nanorl.config import UserError
    with pytest.raises(UserError, match="preference: dpo, ipo, kto"):
        rl.main(rl.Config(loss="nonsense", sft_ckpt=sft_ckpt))
    with pytest.raises(UserError, match="pairs must be"):
        rl.main(rl.Config(loss="dpo", pairs="sometimes", sft_ckpt=sft_ckpt))
    with pytest.raises(UserError, match="has no hyperparameter 'label_smoothing'"):
        rl.main(rl.Config(loss="grpo", label_smoothing=0.1, sft_ckpt=sft_ckpt, out_dir=str(tmp_path)))


def test_rpo_adds_the_chosen_per_token_nll():
    pc, pr, rc, rr = LOG(.5, .2), LOG(.1, .1), LOG(.25, .25), LOG(.25, .25)
    base, _ = L.dpo_loss(pc, pr, rc, rr, beta=1.0)
    rpo, _ = L.dpo_loss(pc, pr, rc, rr, beta=1.0, rpo_alpha=0.5, chosen_len=torch.tensor([2.0, 4.0]))
    nll = (-math.log(.5) / 2 - math.log(.2) / 4) / 2  # mean over pairs of -pi_c / |y_c|
    assert rpo.item() == pytest.approx(base.item() + 0.5 * nll, abs=1e-6)


def test_kto_rpo_adds_the_desirable_per_token_nll_only():
    pi, rf = LOG(.5, .2), LOG(.25, .25)
    args = (pi, rf, torch.tensor([1, 0]), LOG(.3, .3), rf)
    base, _ = L.kto_loss(*args, beta=1.0)
    rpo, _ = L.kto_loss(*args, beta=1.0, rpo_alpha=0.5, length=torch.tensor([2.0, 4.0]))
    nll = (-math.log(.5) / 2 + 0.0) / 2  # mean over answers; the undesirable one adds no NLL
    assert rpo.item() == pytest.approx(base.item() + 0.5 * nll, abs=1e-6)


# a = pi / |y|: chosen [-2/2, -3/3] = [-1, -1], rejected [-4/4, -2/1] = [-1, -2]
PI_C, PI_R = torch.tensor([-2.0, -3.0]), torch.tensor([-4.0, -2.0])
LEN_C, LEN_R = torch.tensor([2.0, 3.0]), torch.tensor([4.0, 1.0])


@pytest.mark.parametrize("name,hp,loss,grad_c,grad_r,margin", [
    # beta 2, gamma 0.5: logits 2 * [0, 1] - 0.5; the mean of -log sigmoid(-0.5) and -log sigmoid(1.5);
    # d/d pi_c = -sigmoid(-logit) * beta / |y_c| / 2
    ("simpo", dict(rpo_alpha=0.0), 0.5877451, [-0.3112297, -0.0608085], [0.1556148, 0.1824255], 1.0),
    # the default rpo_alpha 1 adds the chosen answers' mean -a_c = 1, and -1 / |y_c| / 2 to their gradient
    ("simpo", {}, 1.5877451, [-0.5612297, -0.2274752], [0.1556148, 0.1824255], 1.0),
    # log odds_c - log odds_r = [0, 1 - (log(1 - e^-1) - log(1 - e^-2))] = [0, 1.3132617];
    # -a_c - 0.1 * log sigmoid of it; d/d a_c = -1 - lam * sigmoid(-lo) / (1 - e^a_c)
    ("orpo", {}, 1.0465665, [-0.2697747, -0.1722548], [0.0098874, 0.0122557], 0.6566308),
])
def test_reference_free_losses_by_hand(name, hp, loss, grad_c, grad_r, margin):
    pc, pr = PI_C.clone().requires_grad_(True), PI_R.clone().requires_grad_(True)
    out, stats = L.ALGOS[name].objective(pc, pr, LEN_C, LEN_R, **{**L.DEFAULTS[name], **hp})
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-6)
    torch.testing.assert_close(pc.grad, torch.tensor(grad_c), atol=1e-6, rtol=0)
    torch.testing.assert_close(pr.grad, torch.tensor(grad_r), atol=1e-6, rtol=0)
    assert float(stats["margin"]) == pytest.approx(margin, abs=1e-6) and float(stats["pair_accuracy"]) == 0.5


def test_orpo_is_finite_where_an_answer_is_certain():
    # a = 0 (every token certain) would make log(1 - e^a) = -inf
    pc = torch.tensor([0.0, -1e-9], requires_grad=True)
    out, _ = L.orpo_loss(pc, torch.tensor([-3.0, -0.5]), torch.ones(2), torch.ones(2), lam=1.0)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(pc.grad).all()


@pytest.mark.parametrize("loss, pairs", [("simpo", "offline"), ("orpo", "online")])
def test_reference_free_losses_run_without_a_reference(sft_ckpt, tmp_path, monkeypatch, loss, pairs):  # noqa: F811
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: float(text[:1] == "1"))
    calls = []
    row_logps = rl.pref.row_logps
    monkeypatch.setattr(rl.pref, "row_logps", lambda m, *a: calls.append(m) or row_logps(m, *a))
    res, rows = run(sft_ckpt, tmp_path, loss=loss, pairs=pairs, pairs_per_step=4, group_size=16)
    train = [r for r in rows if "rl/loss" in r]
    assert len(train) == 2 and all(math.isfinite(r["rl/loss"]) for r in train)
    assert all(k in train[-1] for k in ("rl/chosen_reward", "rl/margin", "rl/pair_accuracy"))
    assert "rl/log_ratio" not in train[-1] and res["ref"] not in calls and calls  # no reference forward
