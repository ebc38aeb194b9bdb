"""bench/grad_lab.py on a tiny model: the exact gradient of J, its Monte-Carlo check, the finite-K
statistics, and REINFORCE's mean direction converging to grad J."""
import math
import os
import subprocess
import sys

import pytest
import torch

import losses as L
from bench import grad_lab as lab
from nanorl.checkpoint import save_checkpoint
from data.tasks import ALPHABET
from nanorl.evaluate import Task
from losses import nll_loss
from nanorl.pref import row_logps
from nanorl.rows import gold_rows
from model import GPT, GPTConfig
from tokenizer import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBLEMS = [("1*1=", "1"), ("2*1=", "2"), ("1*3=", "3"), ("2*2=", "4")]


@pytest.fixture(scope="module")
def tiny():
    """A 1-layer GPT fitted a little on four one-digit problems: J near 0.4, every group varied."""
    torch.manual_seed(0)
    tok = CharTokenizer(ALPHABET)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32,
                          scalar_head=True))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss, _ = nll_loss(*row_logps(model, gold_rows(tok, PROBLEMS, False), tok.pad_id))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def task_of(tok):
    return Task(tok, "mul", False, "exact", 0, list(PROBLEMS))


def cfg(**kw):
    return lab.Config(**{**dict(samples=len(PROBLEMS) * 8, group_size=8, max_new_tokens=4, seed=3), **kw})


def test_summarize_on_hand_computed_directions():
    # g1 = (3, 1), g2 = (1, 3), grad J = (1, 0): g_bar = (2, 2), |g_bar|^2 = 8, g1.g2 = 6,
    # per-batch cosines 3/sqrt(10) and 1/sqrt(10), sum |g_k - g_bar|^2 / (K-1) = 4
    g = torch.tensor([[3.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    s = lab.summarize(g @ g.T, g @ torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor(1.0))
    assert s["cos_mean"].item() == pytest.approx(2 / math.sqrt(8))
    assert s["cos_inf"].item() == pytest.approx(2 / math.sqrt(6))
    assert s["cos_batch"].item() == pytest.approx(2 / math.sqrt(10))
    assert s["rel_var"].item() == pytest.approx(0.5)


def test_grad_j_matches_a_finite_difference(tiny):
    model, tok = tiny
    model = GPT(model.config).double().eval()
    model.load_state_dict({k: v.double() for k, v in tiny[0].state_dict().items()})
    J, g = lab.exact_objective(model, tok, PROBLEMS, False, temperature=0.8)
    params = lab.policy_params(model)
    v = torch.randn(g.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    v, eps, sides = v / v.norm(), 1e-4, []
    for sign in (1, -1):
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params) + sign * eps * v,
                                                params)
        sides.append(lab.exact_objective(model, tok, PROBLEMS, False, temperature=0.8)[0])
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params) - sign * eps * v,
                                                params)
    fd = (sides[0] - sides[1]) / (2 * eps)
    assert 0.2 < J < 0.8
    assert fd == pytest.approx(float(g @ v), rel=1e-3)


def test_j_is_the_monte_carlo_mean_reward(tiny):
    model, tok = tiny
    c = cfg(samples=len(PROBLEMS) * 64, group_size=64)  # every batch: each prompt once, 64 samples
    J = lab.exact_objective(model, tok, PROBLEMS, False)[0]
    per_prompt = torch.stack([lab.rollout_batch(model, task_of(tok), c, 64, k, False).score
                              .view(-1, 64).mean(1) for k in range(20)]).mean(0)  # (4,) sorted?
    mc = per_prompt.mean().item()
    se = math.sqrt(sum(p * (1 - p) for p in per_prompt.tolist()) / (20 * 64)) / len(PROBLEMS)
    assert abs(mc - J) < 3 * se, (mc, J, se)


def test_losses_that_share_a_gradient_at_ratio_one_give_the_same_direction(tiny):
    model, tok = tiny
    c = cfg()
    specs = lab.specs_of(["reinforce", "rloo", "dr_grpo", "grpo", "gspo", "sapo", "pnpo"],
                         [], False, c.max_new_tokens)
    batch = lab.rollout_batch(model, task_of(tok), c, c.group_size, 0, True)
    d, _ = lab.directions(model, model, batch, [s for s in specs if s[3]], c, c.group_size)

    def cos(a, b):
        return float(d[a] @ d[b] / (d[a].norm() * d[b].norm()))
    for a, b in [("reinforce", "rloo"), ("reinforce", "dr_grpo"), ("grpo", "gspo"), ("grpo", "sapo"),
                 ("grpo", "pnpo")]:  # the same advantage and normaliser at ratio 1 (DAPO: + its shaping)
        assert cos(a, b) == pytest.approx(1.0, abs=1e-5), (a, b)
    assert cos("reinforce", "grpo") < 0.9999  # std scaling and the length mean do change it


def test_reinforce_mean_direction_converges_to_grad_j(tiny):
    model, tok = tiny
    g = lab.exact_objective(model, tok, PROBLEMS, False)[1]
    specs = [s for s in lab.specs_of(["reinforce"], [], False, 4) if not s[3]]  # no dynamic sampling
    few, many = (lab.measure(model, model, task_of(tok), cfg(batches=K), specs, 8, g)
                 ["reinforce, no dyn"] for K in (4, 96))
    cos_inf, se = many["cos_inf"]
    assert abs(cos_inf - 1) < 2 * se < 0.1, many  # unbiased in direction: 1.007 +- 0.033 here
    assert few["cos_mean"][0] < 0.7 and many["cos_mean"][0] > 0.95  # 0.578 at K = 4, 0.968 at 96
    # finite K: the mean of K unbiased directions has cosine 1/sqrt(1 + rel_var/K) with grad J
    assert many["cos_mean"][0] == pytest.approx(1 / math.sqrt(1 + many["rel_var"][0] / 96), abs=0.01)


def test_the_lab_refuses_a_verifier_other_than_exact(tmp_path):
    tok = CharTokenizer(ALPHABET)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32))
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, model, config={"task": "mul", "reverse": True, "verifier": "final"}, tokenizer=tok)
    r = subprocess.run([sys.executable, "bench/grad_lab.py", f"--ckpt={path}"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "exact verifier" in r.stderr and "'final'" in r.stderr
