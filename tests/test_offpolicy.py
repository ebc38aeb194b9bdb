"""The off-policy lab: rollout-correction weights and the distillation losses by hand, stale rollouts
(the queue, exact resume), the bf16 sampler gap, the identity at k = 0, and every misuse's one line."""
import copy
import math
from dataclasses import replace

import pytest
import torch

import losses as L
from by_name import LOSSES
import rl
from verify import VERIFIERS
from nanorl.checkpoint import load_checkpoint, save_checkpoint
from nanorl.config import UserError
from test_reliability import rows, same_weights, signal_on_call
from test_rl import TINY_RL, cli, run, tiny_batch, update_once, varied_reward  # noqa: F401
from losses import rollout_weights

# ----------------------------------------------------------------------------- weights by hand
# rho = exp(old - mu): row 0 [3, 0.4, 1.5]; row 1 [6, 0.8] and padding holding a junk 100 (5 tokens)
MU = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
RHO = torch.tensor([[3.0, 0.4, 1.5], [6.0, 0.8, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("kind, want, frac", [
    ("tis", [[2, 0.4, 1.5], [2, 0.8]], 2 / 5),  # min(rho, 2): 3 and 6 capped
    ("seq_tis", [[1.8, 1.8, 1.8], [2, 2]], 2 / 5),  # 3 * 0.4 * 1.5 = 1.8; 6 * 0.8 = 4.8 -> 2 (not the 100)
    ("icepop", [[3, 0, 1.5], [0, 0.8]], 2 / 5),  # outside [0.5, 5]: 0.4 and 6 masked
    ("decoupled", [[3, 0.4, 1.5], [0, 0.8]], 1 / 5),  # above 5: 6 masked
])
def test_rollout_weights_by_hand(kind, want, frac):
    w, cut = rollout_weights(MU + RHO.log(), MU, MASK, kind)
    got = [w[0].tolist(), w[1, :2].tolist()]
    assert got == [pytest.approx(r, abs=1e-5) for r in want] and cut.item() == pytest.approx(frac)
    assert not w.requires_grad


def test_rollout_weights_refuse_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown rollout correction 'is'"):
        rollout_weights(MU, MU, MASK, "is")


def test_teacher_advantage_and_opd_by_hand():
    """A_t = -clamp(log mu - log pi_T, +-10): mu - teacher = [0.5, -12, 3] -> A = [-0.5, 10, -3]; at ratio 1
    opd's loss is -sum_t A_t / n_tokens and its gradient -A_t / n_tokens."""
    mu = torch.tensor([[-1.0, -13.0, -0.5], [-2.0, -0.1, 0.0]])
    teacher = torch.tensor([[-1.5, -1.0, -3.5], [-2.0, -0.3, -5.0]])
    adv = L.teacher_advantages(mu, teacher, MASK)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 10.0, -3.0], [0.0, -0.2, 0.0]]))
    logp = mu.clone().requires_grad_(True)
    loss, stats = LOSSES["opd"](logp, mu, adv, MASK, n_tokens=10)
    loss.backward()
    assert loss.item() == pytest.approx(-6.3 / 10) and float(stats["ratio_max"]) == 1
    torch.testing.assert_close(logp.grad, -adv / 10)
    logp = torch.tensor([[-1.0 + math.log(2), -13.0, -0.5], [-2.0, -0.1, 0.0]])  # ratio 2 on token 0
    assert LOSSES["opd"](logp, mu, adv, MASK)[0].item() == pytest.approx(-(2 * -0.5 + 10 - 3 - 0.2) / 5)
    zero = L.teacher_advantages(mu, mu, MASK)  # the teacher is pi_old: no credit
    logp = mu.clone().requires_grad_(True)
    loss, _ = LOSSES["opd"](logp, mu, zero, MASK)
    loss.backward()
    assert loss.item() == 0 and torch.equal(zero, torch.zeros(2, 3)) and not logp.grad.any()

# ----------------------------------------------------------------------------- gkd by hand
# student p = [0.7, 0.2, 0.1], teacher q = [0.2, 0.5, 0.3]:
# KL(p||q) = 0.7 ln 3.5 + 0.2 ln 0.4 + 0.1 ln(1/3) = 0.583815; KL(q||p) = 0.2 ln(2/7) + 0.5 ln 2.5 + 0.3 ln 3
# = 0.537176; b = 0.5: M = [0.45, 0.35, 0.2], KL(q||M) = 0.137791, KL(p||M) = 0.128045, JSD 0.132918;
# b = 0.25: M = 0.25 q + 0.75 p = [0.575, 0.275, 0.15], KL(q||M) = 0.295652, KL(p||M) = 0.033459,
# JSD 0.099007.
# d KL(p||q)/dz_j = p_j (ln(p_j/q_j) - KL); d KL(q||p)/dz = p - q.
P, Q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.2, 0.5, 0.3])


@pytest.mark.parametrize("beta, want, grad", [
    (1.0, 0.583815, [0.7 * (math.log(3.5) - 0.583815), 0.2 * (math.log(0.4) - 0.583815),
                     0.1 * (math.log(1 / 3) - 0.583815)]),
    (0.0, 0.537176, [0.5, -0.3, -0.2]),
    (0.5, 0.132918, None),
    (0.25, 0.099007, None),  # TRL's weights: b on the teacher, 1 - b on the student
])
def test_gkd_by_hand(beta, want, grad):
    """Position 0 holds the pair; position 1 is padding with other logits (left out); n_tokens 4 divides."""
    z = torch.stack([P.log(), torch.tensor([5.0, -5.0, 0.0])])[None].requires_grad_(True)  # (1, 2, 3)
    zt = torch.stack([Q.log(), torch.tensor([-5.0, 5.0, 0.0])])[None]
    mask, lp = torch.tensor([[1, 0]]), torch.zeros(1, 2)
    loss, _ = LOSSES["gkd"](lp, lp, torch.zeros(1), mask, logits=z, teacher_logits=zt, gkd_beta=beta)
    assert loss.item() == pytest.approx(want, abs=1e-5)
    assert LOSSES["gkd"](lp, lp, torch.zeros(1), mask, n_tokens=4, logits=z, teacher_logits=zt,
                 gkd_beta=beta)[0].item() == pytest.approx(want / 4, abs=1e-5)
    loss.backward()
    if grad is not None:
        torch.testing.assert_close(z.grad[0, 0], torch.tensor(grad), atol=1e-5, rtol=0)
    assert not z.grad[0, 1].any()  # padding: no gradient


@pytest.mark.parametrize("beta", [1.0, 0.0, 0.5])
def test_gkd_against_itself_is_zero_with_zero_gradient(beta):
    torch.manual_seed(0)
    z = torch.randn(2, 3, 16, requires_grad=True)
    lp = torch.zeros(2, 3)
    loss, _ = LOSSES["gkd"](lp, lp, torch.zeros(2), MASK, logits=z, teacher_logits=z.detach(), gkd_beta=beta)
    loss.backward()
    assert abs(loss.item()) < 1e-6 and z.grad.abs().max() < 1e-6

# ----------------------------------------------------------------------------- rl.pg_step


def one_update(loss, model, batch, teacher=None, **kw):
    """One rl.pg_step (in the lab where kw opens it) on a copy of model -> (the copy, its stats)."""
    run, stats = update_once(rl.Config(loss=loss, group_size=4, **kw), copy.deepcopy(model), batch, teacher)
    return run.model, stats


@pytest.mark.parametrize("loss, fixes", [
    ("grpo", [dict(rollout_is=k) for k in ("tis", "seq_tis", "icepop")] + [dict(decoupled=True)]),
    ("dapo", [dict(rollout_is="icepop"), dict(decoupled=True, minibatches=2)]),
    ("gspo", [dict(rollout_is="seq_tis")]),
])
def test_every_correction_is_the_identity_on_policy(loss, fixes):
    """staleness 0, no bf16 sampler: pi_old = mu, every weight is exactly 1: today's update."""
    model, batch = tiny_batch()
    for fix in fixes:
        base, want = one_update(loss, model, batch, minibatches=fix.get("minibatches", 1))
        got, stats = one_update(loss, model, batch, **fix)
        assert same_weights(base.state_dict(), got.state_dict(), tol=1e-6) and stats["rl/is_capped_frac"] == 0
        assert {k: stats[k] for k in want} == pytest.approx(want, abs=1e-6)


def test_stale_batch_trains_from_the_recomputed_pi_old_and_weighs_by_pi_old_over_mu():
    """mu of row 0's first token set ln 3 below the trainer's: the loss's ratio is still 1 (to pi_old), the
    gap |sum_t (pi_old - mu)| is ln 3 on that row, and tis caps that one token (weight 3 > 2)."""
    model, batch = tiny_batch()
    mu = batch.mu.clone()
    mu[0, 0] -= math.log(3)
    _, stats = one_update("grpo", model, replace(batch, mu=mu, old_logp=mu), staleness=1, rollout_is="tis")
    n = batch.mask.sum().item()
    assert stats["rl/ratio_max"] == pytest.approx(1, abs=1e-5)
    assert stats["rl/old_mu_seq_max"] == pytest.approx(math.log(3), abs=1e-4)
    assert stats["rl/old_mu_seq_mean"] == pytest.approx(math.log(3) / 16, abs=1e-4)
    assert stats["rl/is_capped_frac"] == pytest.approx(1 / n)
    assert stats["rl/logp_mismatch"] == pytest.approx(math.log(3), abs=1e-4)  # the trainer against mu


@pytest.mark.parametrize("loss, fix, scale", [
    ("grpo", dict(rollout_is="tis"), 2.0),  # rho = 10 on every token, capped at 2
    ("grpo", dict(rollout_is="icepop"), 0.0),  # 10 > 5: every token masked
    ("grpo", dict(decoupled=True), 0.0),  # pi_prox/mu = 10 > 5: masked
    ("gspo", dict(rollout_is="seq_tis"), 2.0),  # 10^|y| capped at 2
    ("grpo", dict(), 1.0),  # no correction: pi_old's clip alone
])
def test_the_weight_multiplies_the_update(loss, fix, scale):
    """mu 10x below the trainer on every sampled token: at ratio 1 to the recomputed pi_old the gradient
    is the on-policy one times the weight (grpo's KL term has no gradient at pi = ref)."""
    model, batch = tiny_batch()
    _, base = one_update(loss, model, batch)
    mu = torch.where(batch.mask.bool(), batch.mu - math.log(10), 0.0)  # (N, L)
    stale = replace(batch, mu=mu, old_logp=mu)
    _, stats = one_update(loss, model, stale, staleness=1, **fix)
    assert base["rl/grad_norm"] > 1e-3 and stats["rl/ratio_max"] == pytest.approx(1, abs=1e-5)
    assert stats["rl/grad_norm"] == pytest.approx(scale * base["rl/grad_norm"], rel=1e-4, abs=1e-6)
    assert stats.get("rl/is_capped_frac", 0) == (scale != 1)


@pytest.mark.parametrize("loss", ["opd", "gkd"])
def test_distilling_from_itself_gives_zero_advantage_loss_and_gradient(loss):
    """Teacher = student: A_t = -(log mu - log pi_T) is the sampler/trainer gap (~1e-7); gkd's is 0."""
    from test_rl import make_run
    model, batch = tiny_batch()
    cfg = rl.Config(loss=loss, group_size=4)
    run = make_run(cfg, model, teacher=model)
    adv, extra = run.advantages(cfg, L.ALGOS[loss], run, copy.copy(batch))
    assert adv.shape == batch.mask.shape and adv.abs().max() < 1e-5
    assert ("teacher_logits" in extra) == (loss == "gkd")
    _, stats = one_update(loss, model, batch, teacher=model)
    assert abs(stats["rl/loss"]) < 1e-6 and stats["rl/grad_norm"] < 1e-5



def test_opd_builds_its_advantage_from_the_recomputed_pi_old_not_from_mu():
    """Teacher = the student and a stale sampler mu, ln 3 below it on every token: the reverse KL to the
    teacher is 0 with zero gradient. An advantage from mu would credit every token ln 3 and push the
    policy away from the sampler."""
    model, batch = tiny_batch()
    mu = torch.where(batch.mask.bool(), batch.mu - math.log(3), 0.0)  # (N, L)
    stale = replace(batch, mu=mu, old_logp=mu)
    for kw in (dict(staleness=1), dict(sampler_bf16=True), dict(staleness=1, ppo_epochs=2)):
        _, stats = one_update("opd", model, stale, teacher=model, **kw)
        assert abs(stats["rl/loss"]) < 1e-6 and stats["rl/grad_norm"] < 1e-5, kw


@pytest.mark.parametrize("loss", ["opd", "gkd"])
def test_distillation_at_a_temperature_by_hand(loss):
    """At temperature 0.7 both distributions are tempered: the student's logits (gkd), the teacher's
    logits (gkd) and the teacher's log-probs (opd), against a hand computation from plain forwards.
    The teacher differs from the student, so opd's advantage has a sign to get right."""
    from model import GPT
    model, batch = tiny_batch(temperature=0.7)
    torch.manual_seed(5)
    teacher = GPT(model.config).eval()
    with torch.no_grad():
        teacher.lm_head.weight *= 4  # peaked: far from the near-uniform student
    ids, off, mask = batch.ids, batch.offsets, batch.mask.bool()
    P = ids.size(1) - mask.size(1)
    with torch.no_grad():
        z, zt = (m(ids, off)[:, P - 1:-1].float() / 0.7 for m in (model, teacher))  # (N, L, V) each
    lp, lq = z.log_softmax(-1), zt.log_softmax(-1)
    if loss == "gkd":  # reverse KL(p || q) at every response position
        want = ((lp.exp() * (lp - lq)).sum(-1)[mask]).sum() / mask.sum()
    else:  # -sum_t A_t / n at ratio 1, A_t = log q(y_t) - log p(y_t)
        y = ids[:, P:, None]
        want = -((lq.gather(-1, y) - lp.gather(-1, y)).squeeze(-1)[mask]).sum() / mask.sum()
    _, stats = one_update(loss, model, batch, teacher=teacher, temperature=0.7)
    assert abs(want.item()) > 0.1 and stats["rl/loss"] == pytest.approx(want.item(), rel=1e-4)

# ----------------------------------------------------------------------------- rl.py runs


def test_staleness_trains_each_step_on_the_rollout_of_k_steps_earlier(sft_ckpt, tmp_path, monkeypatch,
                                                                       varied_reward):  # noqa: F811
    sampled, trained, collect, step = [], [], rl.collect, rl.pg_step
    monkeypatch.setattr(rl, "collect", lambda *a, **k: sampled.append(collect(*a, **k)) or sampled[-1])
    monkeypatch.setattr(rl, "pg_step", lambda c, a, r, lr, g, given: (given[0] is not None and trained.append(
        given[0])) or step(c, a, r, lr, g, given))
    _, out = run(sft_ckpt, tmp_path, staleness=2, max_iters=4, eval_interval=4, dynamic_sampling=False)
    assert len(sampled) == 4 and len(trained) == 2
    assert trained[0] is sampled[0][0] and trained[1] is sampled[1][0]  # step 3: step 1's; step 4: step 2's
    steps = [r for r in out if "rl/n_groups" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and [("rl/loss" in r) for r in steps] == [0, 0, 1, 1]
    assert all(r["rl/old_mu_seq_max"] > 0 for r in steps[2:])  # mu two updates behind pi_old


def test_distillation_keeps_every_group_and_prompt(sft_ckpt, tmp_path, monkeypatch):  # noqa: F811
    """opd and gkd need no reward: all-wrong groups, which dynamic sampling would drop, are trained on, and no
    prompt is skipped for having been all-wrong."""
    monkeypatch.setitem(VERIFIERS, "exact", lambda *a, **k: 0.0)
    _, out = run(sft_ckpt, tmp_path, loss="opd", teacher_ckpt=sft_ckpt, max_iters=1, eval_interval=1,
                 eval_samples=0)
    r = [r for r in out if "rl/loss" in r][0]
    assert r["rl/zero_std_frac"] == 1 and r["rl/n_groups"] == TINY_RL["prompts_per_step"]
    assert r["rl/loss"] != 0
    selects = []
    for loss in ("gkd", "grpo"):
        cfg, row, hp = rl.check(rl.Config(loss=loss, sft_ckpt=sft_ckpt, out_dir=str(tmp_path / loss),
                                          teacher_ckpt=sft_ckpt))
        selects.append(rl.setup(cfg, row, hp, torch.device("cpu"), 0, 1)[1].prompts.selection)
    assert selects == [False, True]


def test_resume_with_staleness_is_exact(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    """Interrupted during step 4 of a staleness-2 run (its second update) and resumed: the queue of two
    rollouts comes back from ckpt.pt (weights_only), so weights and metrics equal one whole run's."""
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, staleness=2, decoupled=True, max_iters=5, eval_interval=5,
               ckpt_interval=100)
    whole = rl.main(rl.Config(out_dir=str(tmp_path / "whole"), **cfg))
    signal_on_call(monkeypatch, rl, "optimizer_step", 2)
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), **cfg))
    ck = load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))
    assert ck["step"] == 4 and len(ck["ranks"][0]["queue"]) == 2
    monkeypatch.undo()
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: float(text[:1] == "1"))
    resumed = rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    assert same_weights(whole["model"].state_dict(), resumed["model"].state_dict())
    assert rows(tmp_path / "whole" / "metrics.jsonl") == rows(tmp_path / "cut" / "metrics.jsonl")
    with pytest.raises(UserError, match=r"cannot resume with staleness=1: the run has staleness=2"):
        rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **{**cfg, "staleness": 1}))


@pytest.mark.parametrize("bf16, sampler_bf16, want", [
    (True, False, True),  # the run's bf16 reaches the rollouts
    (False, True, True),  # the flag adds bf16 to the rollouts alone
    (False, False, False),
])
def test_rollouts_keep_the_runs_bf16_and_the_flag_only_adds_it(sft_ckpt, tmp_path, monkeypatch, bf16,
                                                                 sampler_bf16, want):  # noqa: F811
    seen, generate = [], rl.generate
    monkeypatch.setattr(rl, "generate", lambda *a, **k: seen.append(
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        or generate(*a, **k))
    run(sft_ckpt, tmp_path, bf16=bf16, sampler_bf16=sampler_bf16, max_iters=1, eval_interval=1,
        eval_samples=0)
    assert seen and set(seen) == {want}


def test_rollout_speed_counts_the_tokens_sampled_this_step(sft_ckpt, tmp_path, monkeypatch,
                                                           varied_reward):  # noqa: F811
    """--staleness=2: every step samples, and perf/rollout_tok_s is the tokens of this step's rollout
    over its time, not those of the older rollout the step trains on."""
    sampled, collect = [], rl.collect
    monkeypatch.setattr(rl, "collect", lambda *a, **k: sampled.append(collect(*a, **k)) or sampled[-1])
    _, out = run(sft_ckpt, tmp_path, staleness=2, max_iters=4, eval_interval=4, eval_samples=0,
                 dynamic_sampling=False, temperature=2.0)  # long, varied responses
    steps = [r for r in out if "rl/n_groups" in r]
    tokens = [b.length.sum().item() for b, _ in sampled]
    assert len(steps) == 4 and len(set(tokens)) > 1
    for r, n in zip(steps, tokens):
        assert r["perf/rollout_tok_s"] * r["perf/rollout_s"] == pytest.approx(n, rel=1e-6)


def test_bf16_sampler_opens_a_gap_the_trainer_measures(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    _, out = run(sft_ckpt, tmp_path, sampler_bf16=True, rollout_is="icepop", max_iters=1, eval_interval=1,
                 eval_samples=0, dynamic_sampling=False)
    r = [r for r in out if "rl/loss" in r][0]
    assert r["rl/logp_mismatch"] > 1e-3 and 0 < r["rl/logp_mismatch_mean"] < r["rl/logp_mismatch"]
    assert 0 < r["rl/old_mu_seq_mean"] <= r["rl/old_mu_seq_max"] and 0 <= r["rl/is_capped_frac"] < 1
    assert r["rl/ratio_max"] == pytest.approx(1, abs=1e-5)  # the clip's anchor is the trainer's pi_old


def test_a_teacher_with_another_tokenizer_is_refused(sft_ckpt, tmp_path):  # noqa: F811
    from model import GPT, GPTConfig
    from tokenizer import CharTokenizer
    tok = CharTokenizer("0123456789+*=-ab")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=1, n_embd=8))
    save_checkpoint(str(tmp_path / "t.pt"), model, None, {}, 0, tok)
    with pytest.raises(UserError, match="t.pt: the teacher's tokenizer differs from the policy's"):
        rl.main(rl.Config(loss="opd", sft_ckpt=sft_ckpt, teacher_ckpt=str(tmp_path / "t.pt"),
                          out_dir=str(tmp_path / "o")))


@pytest.mark.parametrize("kw, msg", [
    (dict(loss="opd"), "opd distils a teacher: set --teacher_ckpt"),
    (dict(loss="gkd"), "gkd distils a teacher: set --teacher_ckpt"),
    (dict(loss="reinforce", rollout_is="tis"), "reweight a policy ratio; reinforce has none"),
    (dict(loss="gkd", teacher_ckpt="t.pt", decoupled=True), "reweight a policy ratio; gkd has none"),
    (dict(rollout_is="is"), "rollout_is must be none, tis, seq_tis or icepop, got is$"),
    (dict(staleness=-1), "staleness must be >= 0, got -1"),
    (dict(loss="rloo", staleness=2), "--staleness trains on old rollouts, .*; rloo has none"),
    (dict(loss="dpo", staleness=1), "--staleness trains on old rollouts, .*; dpo has none"),
    (dict(rollout_is="tis", decoupled=True), "--decoupled brings its own behaviour weight"),
    (dict(loss="gspo", rollout_is="tis"), "gspo weighs whole sequences: only --rollout_is=seq_tis"),
    (dict(loss="gmpo", decoupled=True), "gmpo weighs whole sequences"),
    (dict(loss="gkd", teacher_ckpt="t.pt", gkd_beta=1.5), r"gkd_beta must be in \[0, 1\], got 1.5"),
])
def test_misuse_gets_one_clear_line(tmp_path, kw, msg):
    with pytest.raises(UserError, match=msg):
        rl.main(rl.Config(out_dir=str(tmp_path / "out"), **kw))
    assert not (tmp_path / "out").exists()


def test_cli_misuse_is_one_line():
    r = cli("rl.py", "--loss=rloo", "--rollout_is=tis")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --rollout_is and --decoupled reweight a policy ratio; rloo has none"]

# ----------------------------------------------------------------------------- bench/offpolicy.py


def test_offpolicy_bench_runs_its_grid_and_tabulates(sft_ckpt, tmp_path):  # noqa: F811
    from bench import offpolicy
    cfg = offpolicy.Config(stalenesses="1", corrections="tis", bf16_row=False, seeds="1", max_iters=3,
                           eval_interval=3, eval_samples=0, sft_ckpt=sft_ckpt, out_dir=str(tmp_path),
                           rl_args="--prompts_per_step=4 --group_size=4 --dynamic_sampling=false")
    res = offpolicy.main(cfg)
    log = (tmp_path / "k1-tis" / "runs" / "grpo-s1" / "log.txt").read_text()
    assert not res["failed"] and "--staleness=1 --rollout_is=tis" in log
    row = res["table"][2].split(" | ")
    assert row[0] == "| k=1 tis" and row[5].endswith("%") and float(row[6]) >= 0  # capped share, the gap
    assert (tmp_path / "offpolicy.md").read_text().count("| k=1 tis |") == 1


@pytest.mark.parametrize("kw, msg", [
    (dict(corrections="tis,is"), "corrections of none, tis, seq_tis, icepop, decoupled; got \\['is'\\]"),
    (dict(stalenesses="0,-2"), "need stalenesses >= 0"), (dict(stalenesses="a"), "comma-separated integers"),
    (dict(rl_args="--staleness=3"), "--rl_args: --staleness=3 is set by each row"),
])
def test_offpolicy_bench_refuses_bad_grids(kw, msg):
    from bench import offpolicy
    with pytest.raises(UserError, match=msg):
        offpolicy.main(offpolicy.Config(**kw))


def test_stale_batch_at_a_temperature_recomputes_pi_old_at_it():
    """Sampled at temperature 0.7 by the model itself, then trained with --staleness=1: pi_old,
    recomputed at 0.7, equals mu (no gap, every ratio 1); at temperature 1 it would not."""
    model, batch = tiny_batch(temperature=0.7)
    _, stats = one_update("grpo", model, batch, staleness=1, temperature=0.7)
    assert stats["rl/old_mu_seq_max"] < 1e-5 and stats["rl/logp_mismatch"] < 1e-5
    assert stats["rl/ratio_max"] == pytest.approx(1, abs=1e-5)


def test_logp_mismatch_reads_only_the_policys_tokens():
    """mu holding junk off the action mask (padding: another sampler may leave anything there)
    moves neither the logged trainer-sampler gap nor the update."""
    model, batch = tiny_batch()
    junk = torch.where(batch.mask.bool(), batch.mu, 5.0)  # (N, L)
    assert (batch.mask == 0).any()
    _, want = one_update("grpo", model, batch)
    _, stats = one_update("grpo", model, replace(batch, mu=junk, old_logp=junk))
    assert stats["rl/logp_mismatch"] < 1e-5 and stats["rl/logp_mismatch_mean"] < 1e-6
    assert stats["rl/grad_norm"] == pytest.approx(want["rl/grad_norm"], rel=1e-6)


def test_a_bf16_run_trains_from_the_trainers_pi_old():
    """--bf16 (CUDA's default): the sampler's bf16 numerics (KV cache, one token a step) differ
    from the trainer's, so pi_old is recomputed and the first ratio is exactly 1."""
    model, batch = tiny_batch()
    batch.mu = batch.old_logp = batch.mu - 0.01 * (batch.mask > 0)  # the sampler's bf16 gap
    with torch.autocast("cpu", torch.bfloat16):
        _, stats = one_update("grpo", model, batch, bf16=True, beta=0.0)
    assert stats["rl/old_mu_seq_mean"] > 0.01 and stats["rl/ratio_max"] == 1.0
    _, plain = one_update("grpo", model, batch, bf16=False, beta=0.0)
    assert "rl/old_mu_seq_mean" not in plain and plain["rl/ratio_mean"] > 1.005  # e^0.01
