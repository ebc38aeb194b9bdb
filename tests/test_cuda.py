"""The CUDA paths the CPU suite never takes: bf16 autocast in rollouts and updates, the SDPA
branch of attention (the CPU runs T > 1 as plain matmuls), CUDA generators, torch.unique on the
device, --compile, a GPU checkpoint read on the CPU, the NaN stop. Skipped without CUDA:

    python -m pytest -m cuda -q -s tests/      # -s shows the measured log-prob gaps

bench/gpu_check.py runs them as its first step."""
import copy

import pytest
import torch

import losses as L
import rl
from data.tasks import ALPHABET
from model import GPT, GPTConfig, generate, logprobs, response_forward, seeded
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from nanorl.evaluate import load_policy
from model import adamw
from test_rl import run, varied_reward  # noqa: F401 (a fixture)
from tokenizer import CharTokenizer

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]
DEV = "cuda"
EOS, PAD = 1, 0
BF16_TOL = 0.25  # nats: bf16 keeps 8 bits, a logit of 20 moves by up to 0.08


def train_prompts(task, n):
    """The first n train problems' prompts, as token ids."""
    return [p for p, _ in task.gold_rows(task.train[:n])]


def peaked_model():
    """A tiny random GPT whose samples often agree (shared prefixes) and some stop early."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=24, vocab_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        model.lm_head.weight *= 10
        model.lm_head.weight[EOS] *= 4
    return model.to(DEV)


@pytest.mark.parametrize("bf16, tol", [(False, 1e-4), (True, BF16_TOL)])
@torch.no_grad()
def test_sampler_logps_equal_trainer_logps(sft_ckpt, bf16, tol):  # noqa: F811
    """rl.py's rollout and update under one precision: the sampler's log-probs (cached decode,
    SDPA at T = 1) against the trainer's (one forward, response_forward's dedup)."""
    model, task = load_policy(sft_ckpt, False, DEV)
    with torch.autocast(DEV, torch.bfloat16, enabled=bf16):
        out = generate(model, train_prompts(task, 64), 8, task.tok.eos_id, task.tok.pad_id, G=8,
                       generator=seeded(DEV, "gap", 0))
        mask = out["action_mask"][:, out["prompt_len"]:]  # (N, L)
        lp = logprobs(model, out["ids"], out["offsets"], mask)[0]
    gap = (lp - out["logps"]).abs()[mask.bool()]
    print(f"logp gap {'bf16' if bf16 else 'fp32'}: max {gap.max():.3g}, mean {gap.mean():.3g} "
          f"nats over {gap.numel()} tokens")
    assert gap.max() <= tol and gap.mean() <= tol / 10


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_equals_uncached_sampling(sft_ckpt, temperature):  # noqa: F811
    model, task = load_policy(sft_ckpt, False, DEV)
    a, b = (generate(model, train_prompts(task, 32), 8, task.tok.eos_id, task.tok.pad_id, G=4,
                     temperature=temperature, generator=seeded(DEV, "cache", 0), use_cache=c)
            for c in (True, False))
    assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["response_mask"], b["response_mask"])
    assert (a["logps"] - b["logps"]).abs().max() <= 1e-4


def test_prefix_sharing_equals_plain_sampling():
    """Rows with equal prefixes share a forward and a cache row (torch.unique on the GPU, a
    duplicate prompt too): the same tokens and log-probs as every row run in full."""
    model, prompts = peaked_model(), [[2, 3, 4], [5, 6, 7, 8, 9], [2, 3, 4]]
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.size(0)))
    a = generate(model, prompts, 10, EOS, PAD, G=8, generator=seeded(DEV, "share", 0))
    hook.remove()
    b = generate(model, prompts, 10, EOS, PAD, G=8, generator=seeded(DEV, "share", 0),
                 use_cache=False)
    assert torch.equal(a["ids"], b["ids"]) and (a["logps"] - b["logps"]).abs().max() <= 1e-4
    assert rows[0] == 3 and min(rows[1:]) < 24  # shared prefixes ran once


def test_response_forward_equals_plain_forward():
    """Duplicate, shuffled rows: each distinct row runs once, each prompt once; logits and
    gradients equal a plain model(ids, offsets) forward's."""
    model = peaked_model()
    out = generate(model, [[2, 3, 4], [5, 6, 7, 8, 9]], 10, EOS, PAD, G=8,
                   generator=seeded(DEV, "dedup", 0))
    perm = torch.randperm(len(out["ids"]), generator=seeded(DEV, "perm", 0), device=DEV)
    ids, offsets, P = out["ids"][perm], out["offsets"][perm], out["prompt_len"]
    assert len(torch.unique(ids, dim=0)) < len(ids)  # duplicates to share
    weights = torch.randn(ids.size(0), ids.size(1) - P, 16, device=DEV)
    logits, grads = [], []
    for forward in (lambda: response_forward(model, ids, offsets, P, torch.ones_like(ids[:, P:])),
                    lambda: model(ids, offsets)[:, P - 1:-1]):
        model.zero_grad()
        logits.append(forward())
        (logits[-1] * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert (logits[0] - logits[1]).abs().max() <= 1e-5 * logits[1].abs().max()
    assert all((g - h).abs().max() <= 1e-4 * h.abs().max() for g, h in zip(*grads))


def test_gpu_checkpoint_loads_on_cpu_and_back(tmp_path):
    """Weights and the fused AdamW's state saved on the GPU: the same logits on the CPU and
    back on the GPU, and the optimizer steps on from them on the CPU."""
    tok = CharTokenizer(ALPHABET)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size)).to(DEV)
    ids = torch.randint(2, tok.vocab_size, (4, 12), device=DEV)
    opt = adamw(model, 1e-3, 0.1)
    model(ids).pow(2).mean().backward()
    opt.step()
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, model, opt, {"task": "mul"}, 1, tok)
    ck = load_checkpoint(path)
    cpu_model = model_from_checkpoint(ck, path)[0]
    with torch.no_grad():
        want = model(ids)
        assert torch.allclose(cpu_model(ids.cpu()), want.cpu(), atol=1e-4)
        back = copy.deepcopy(cpu_model).to(DEV)
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
        assert torch.allclose(back(ids), want, atol=1e-6)
    cpu_opt = adamw(cpu_model, 1e-3, 0.1)
    cpu_opt.load_state_dict(ck["optimizer"])
    cpu_model(ids.cpu()).pow(2).mean().backward()
    cpu_opt.step()
    assert all(int(s["step"]) == 2 for s in cpu_opt.state.values())


def test_nan_stops_the_run_as_on_cpu(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    """A NaN loss stops the run with the CPU's one-line error; ckpt.pt stays the step-0 one."""
    real = L.algo_loss
    monkeypatch.setattr(L, "algo_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), {}))
    errors = []
    for dev in ("cpu", DEV):
        out = tmp_path / dev
        with pytest.raises(rl.UserError) as e:
            run(sft_ckpt, out, loss="grpo", max_iters=2, eval_samples=0, device=dev,
                dynamic_sampling=False)  # an update at step 1 whatever the samples
        errors.append(str(e.value).replace(str(out), "OUT"))
        assert load_checkpoint(str(out / "ckpt.pt"))["step"] == 0
    assert errors[0] == errors[1] and errors[1].startswith("step 1: non-finite loss (nan)")
    assert "\n" not in errors[1]


def test_compile_gives_the_eager_step(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    """--compile: the first GRPO step (bf16 autocast, the same seeded rollout) has the eager
    step's gradient norm and entropy; the compiled trainer agrees with the eager sampler."""
    steps = []
    for compiled in (False, True):
        _, rows = run(sft_ckpt, tmp_path / str(compiled), loss="grpo", compile=compiled,
                      max_iters=1, prompts_per_step=8, group_size=8, eval_samples=0, device=DEV)
        steps.append(next(r for r in rows if "rl/grad_norm" in r))
    eager, comp = steps
    print(f"compile: grad_norm {comp['rl/grad_norm']:.5g} (eager {eager['rl/grad_norm']:.5g}), "
          f"logp_mismatch {comp['rl/logp_mismatch']:.3g}")
    assert eager["rl/grad_norm"] > 0
    assert abs(comp["rl/grad_norm"] / eager["rl/grad_norm"] - 1) <= 0.05
    assert abs(comp["rl/entropy"] - eager["rl/entropy"]) <= 0.01
    assert comp["rl/logp_mismatch"] <= BF16_TOL
