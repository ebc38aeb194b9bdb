"""Reliability under faults: SIGKILL and SIGINT/SIGTERM mid-run, exact resume, corrupt or foreign
files, out-of-range configs, injected NaN gradients, fp32 log-probs under bf16. Each test injects one
fault and checks that no work beyond one checkpoint interval is lost and that the message is clear."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import losses as L
import rl
from model import token_logps
from verify import VERIFIERS
import sft
from nanorl import loop as supervised
from nanorl.config import UserError
from nanorl.checkpoint import load_checkpoint
from test_rl import ROOT, TINY_RL, varied_reward  # noqa: F401 (a fixture)

TINY_SFT = dict(n_layer=1, n_head=2, n_embd=32, batch_size=32, warmup_iters=5, eval_samples=2, threads=1)
SFT_CLI = [sys.executable, "sft.py", "--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=32", "--max_iters=100000",
           "--eval_interval=100000", "--eval_samples=0", "--log_interval=1", "--threads=1"]


def rows(path, timing=False):
    """metrics.jsonl rows; without timing, the perf/* keys (wall-clock) are dropped."""
    out = [json.loads(line) for line in open(path)]
    return out if timing else [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in out]


def signal_on_call(monkeypatch, module, name, call_no, sig=signal.SIGTERM):
    """Send `sig` to this process during the call_no-th call of module.name (a deterministic
    'the user pressed Ctrl-C during step k')."""
    real, n = getattr(module, name), [0]

    def wrapped(*a, **k):
        n[0] += 1
        if n[0] == call_no:
            os.kill(os.getpid(), sig)
        return real(*a, **k)
    monkeypatch.setattr(module, name, wrapped)


def same_weights(a, b, tol=1e-6):
    return a.keys() == b.keys() and all((a[k] - b[k]).abs().max().item() <= tol for k in a)


def logged_steps(path):
    """Steps of the whole lines of a metrics file that a killed process may have left half-written."""
    steps = []
    for line in open(path):
        try:
            steps.append(json.loads(line)["step"])
        except json.JSONDecodeError:
            pass
    return steps


def wait_for_step(path, step, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.stderr.read()
        if os.path.exists(path) and max(logged_steps(path), default=0) >= step:
            return
        time.sleep(0.2)
    raise TimeoutError(f"no step {step} in {path}")


# ----------------------------------------------------------------------------- interrupted runs

def test_sigkill_mid_training_loses_at_most_one_checkpoint_interval(tmp_path):
    p = subprocess.Popen(SFT_CLI + [f"--out_dir={tmp_path}", "--ckpt_interval=20"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "metrics.jsonl", 50, p)
    p.kill()  # SIGKILL: no handler runs
    p.wait()
    ck = load_checkpoint(str(tmp_path / "ckpt.pt"))
    last = max(logged_steps(tmp_path / "metrics.jsonl"))
    assert ck["step"] % 20 == 0 and 0 <= last - ck["step"] < 20 + 5  # a few steps may run between log and kill
    r = subprocess.run(SFT_CLI[:-4] + [f"--out_dir={tmp_path}", f"--max_iters={ck['step'] + 5}", "--eval_interval=1000",
                                       "--resume=true", "--threads=1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {tmp_path}/ckpt.pt at step {ck['step']}" in r.stdout
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == ck["step"] + 5


def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path):
    """The process dies inside torch.save of the second checkpoint: ckpt.pt is still the first."""
    code = f"""
import os, signal, nanorl.checkpoint as C, model as M
from tokenizer import CharTokenizer
m, tok, path = M.GPT(M.GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8)), CharTokenizer("0123456789+*=-"), {str(tmp_path / "ckpt.pt")!r}
C.save_checkpoint(path, m, None, {{}}, 1, tok)
def dying_save(obj, f):
    f.write(b"PK\\x03\\x04 half a zip")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
C.torch.save = dying_save
C.save_checkpoint(path, m, None, {{}}, 2, tok)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == -signal.SIGKILL
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 1
    assert [f for f in os.listdir(tmp_path) if f.startswith("ckpt.pt.tmp.")]  # the half-written temp file, never renamed


def test_sigint_finishes_the_step_saves_and_exits_zero(tmp_path):
    p = subprocess.Popen(SFT_CLI + [f"--out_dir={tmp_path}", "--ckpt_interval=100000"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "metrics.jsonl", 10, p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert "SIGINT: saved" in out and "--resume=true" in out and "Traceback" not in err
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == max(logged_steps(tmp_path / "metrics.jsonl"))


def test_one_stop_sent_twice_is_one_and_another_a_second_later_stops_at_once(tmp_path):
    """`timeout` signals the run, then its group: the run gets SIGTERM twice within microseconds, which
    a loaded machine may deliver apart. That is one stop (finish the step, save, exit 0); a second stop
    a second or more later (Ctrl-C again) stops at once."""
    cfg = supervised.TrainConfig(out_dir=str(tmp_path))
    with supervised.Clock(cfg, supervised.State(), rank=0) as clock:
        clock.handle(signal.SIGTERM, None)
        clock.handle(signal.SIGTERM, None)  # the copy: no KeyboardInterrupt
        assert clock.signal == "SIGTERM"
        clock.signal_t -= 1.0
        with pytest.raises(KeyboardInterrupt):
            clock.handle(signal.SIGINT, None)
    # the run under `timeout` itself: tests/test_async.py::test_a_stop_signal_to_the_group_saves_the_step_and_exits_0


# ----------------------------------------------------------------------------- exact resume

def test_sft_resume_is_exact(tmp_path, monkeypatch):
    cfg = dict(TINY_SFT, max_iters=20, eval_interval=10, ckpt_interval=5, log_interval=1, dropout=0.1)
    whole = sft.main(sft.Config(out_dir=str(tmp_path / "whole"), **cfg))
    signal_on_call(monkeypatch, supervised, "lr_at", 8)  # SIGTERM during step 8
    sft.main(sft.Config(out_dir=str(tmp_path / "cut"), **cfg))
    assert load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))["step"] == 8
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "train/lo')  # the broken last line of a writer that was killed
    monkeypatch.undo()
    resumed = sft.main(sft.Config(out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    assert same_weights(whole.state_dict(), resumed.state_dict())
    assert rows(tmp_path / "whole" / "metrics.jsonl") == rows(tmp_path / "cut" / "metrics.jsonl")


@pytest.mark.parametrize("loss, kw", [("grpo", {}), ("ppo", {}), ("dpo", dict(pairs_per_step=8))])
def test_rl_resume_is_exact(sft_ckpt, tmp_path, monkeypatch, varied_reward, loss, kw):  # noqa: F811
    """Interrupted during step 2 and resumed: the same weights and metrics rows as one whole run
    (prompt order, skipped prompts, sampling generator, optimizer, PPO value head, eval RNG)."""
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, loss=loss, max_iters=4, eval_interval=3, ckpt_interval=100, **kw)
    whole = rl.main(rl.Config(out_dir=str(tmp_path / "whole"), **cfg))
    signal_on_call(monkeypatch, rl.pref if loss == "dpo" else rl, "optimizer_step", 2)  # the caller's
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), **cfg))
    assert load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))["step"] == 2
    monkeypatch.undo()
    varied_reward_again = (lambda text, gold, reverse=False: float(text[:1] == "1"))
    monkeypatch.setitem(VERIFIERS, "exact", varied_reward_again)
    resumed = rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    assert same_weights(whole["model"].state_dict(), resumed["model"].state_dict())
    assert rows(tmp_path / "whole" / "metrics.jsonl") == rows(tmp_path / "cut" / "metrics.jsonl")


def test_resume_refuses_a_foreign_checkpoint(tmp_path, sft_ckpt):  # noqa: F811
    sft.main(sft.Config(out_dir=str(tmp_path), max_iters=2, eval_interval=2, **TINY_SFT))
    with pytest.raises(UserError, match=r"ckpt.pt: cannot resume, it is not a run of this model.*'n_layer': 1"):
        sft.main(sft.Config(out_dir=str(tmp_path), resume=True, **{**TINY_SFT, "n_layer": 2}))
    with pytest.raises(UserError, match=r"ckpt.pt: cannot resume with lr=0.002: the run has lr=0.001, "):
        sft.main(sft.Config(out_dir=str(tmp_path), resume=True, **{**TINY_SFT, "lr": 2e-3}))
    rl.main(rl.Config(out_dir=str(tmp_path / "rl"), sft_ckpt=sft_ckpt, loss="grpo", **{**TINY_RL, "max_iters": 1}))
    with pytest.raises(UserError, match="ckpt.pt: cannot resume with loss='dapo', .*: the run has loss='grpo'"):
        rl.main(rl.Config(out_dir=str(tmp_path / "rl"), sft_ckpt=sft_ckpt, loss="dapo", resume=True, **TINY_RL))
    with pytest.raises(Exception, match="no such checkpoint.*drop --resume"):
        rl.main(rl.Config(out_dir=str(tmp_path / "none"), sft_ckpt=sft_ckpt, resume=True, **TINY_RL))


# ----------------------------------------------------------------------------- bad values, numerical faults

@pytest.mark.parametrize("script, kw, msg", [
    (sft, dict(lr=-1e-3), "lr must be > 0"), (sft, dict(batch_size=0), "batch_size must be > 0"),
    (sft, dict(n_embd=30, n_head=4), "divisible by n_head"), (sft, dict(dropout=1.0), "dropout"),
    (sft, dict(ckpt_interval=0), "ckpt_interval must be > 0"), (sft, dict(max_iters=-1), "max_iters must be >= 0"),
    (rl, dict(lr=-1e-4), "lr must be > 0"), (rl, dict(group_size=1), "group_size must be >= 2"),
    (rl, dict(eps_high=-0.1), "eps_high must be >= 0"), (rl, dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (rl, dict(temperature=0.0), "temperature must be > 0"), (rl, dict(ppo_epochs=0), "ppo_epochs must be >= 1"),
    (rl, dict(loss="dpo", pairs_per_step=0), "pairs_per_step must be >= 1"),
    (rl, dict(device="tpu9"), "device must be auto, cpu, cuda, cuda:N or mps"),
] + ([(sft, dict(device="cuda"), "device 'cuda' is not available")] if not torch.cuda.is_available() else []))
def test_out_of_range_config_is_rejected_before_any_work(tmp_path, script, kw, msg):
    with pytest.raises(UserError, match=msg):
        script.main(script.Config(out_dir=str(tmp_path / "out"), **kw))
    assert not (tmp_path / "out").exists()


def poison_gradient(model, name, from_call):
    """Make the gradient of parameter `name` NaN from its from_call-th backward on."""
    n = [0]

    def hook(g):
        n[0] += 1
        return g * float("nan") if n[0] >= from_call else g
    dict(model.named_parameters())[name].register_hook(hook)
    return model


def test_nan_gradient_stops_sft_naming_step_and_tensor(tmp_path, monkeypatch):
    real = sft.GPT
    monkeypatch.setattr(sft, "GPT", lambda c: poison_gradient(real(c), "transformer.h.0.mlp.c_fc.weight", 7))
    with pytest.raises(UserError, match=r"step 7: non-finite gradient of transformer.h.0.mlp.c_fc.weight; stopped"):
        sft.main(sft.Config(out_dir=str(tmp_path), max_iters=20, eval_interval=100, ckpt_interval=5, **TINY_SFT))
    ck = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ck["step"] == 5 and all(torch.isfinite(v).all() for v in ck["model"].values())


def test_nan_gradient_stops_rl_naming_step_and_tensor(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    from nanorl import evaluate
    real = evaluate.model_from_checkpoint
    monkeypatch.setattr(evaluate, "model_from_checkpoint",
                        lambda *a, **k: (poison_gradient(real(*a, **k)[0], "transformer.wte.weight", 2), real(*a, **k)[1]))
    with pytest.raises(UserError, match=r"step 2: non-finite gradient of transformer.wte.weight; stopped, last good"):
        rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=sft_ckpt, loss="grpo", dynamic_sampling=False,
                          **{**TINY_RL, "max_iters": 3, "ckpt_interval": 1, "eval_interval": 10}))
    ck = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ck["step"] == 1 and all(torch.isfinite(v).all() for v in ck["model"].values())


def test_log_probs_stay_fp32_under_bf16():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g).bfloat16()  # (B, T, V) as a bf16 autocast forward returns them
    ids, mask = torch.randint(0, 11, (3, 6), generator=g), torch.ones(3, 6, dtype=torch.long)
    lp = token_logps(logits[:, :-1], ids[:, 1:], mask[:, 1:], temperature=0.7)
    assert lp.dtype == torch.float32 and L.token_entropy(logits).dtype == torch.float32
    exact = torch.log_softmax(logits.double() / 0.7, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(lp.double(), exact, atol=1e-5)  # fp32 math on the bf16 values, not bf16 math


def test_a_fresh_run_keeps_the_previous_runs_metrics(tmp_path):
    cfg = dict(TINY_SFT, max_iters=2, eval_interval=2, eval_samples=0, out_dir=str(tmp_path))
    sft.main(sft.Config(**cfg))
    first = rows(tmp_path / "metrics.jsonl")
    sft.main(sft.Config(**cfg))
    assert rows(tmp_path / "metrics.jsonl.prev") == first and rows(tmp_path / "metrics.jsonl") == first  # not appended


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(group_size=2), dict(overlong_window=4), dict(beta=0.1),
                                dict(max_new_tokens=6), dict(seed=1), dict(dynamic_sampling=False), dict(lr=1e-4)])
def test_resume_refuses_settings_that_change_what_is_trained(sft_ckpt, tmp_path, kw):  # noqa: F811
    """Every setting but when to stop, evaluate, save and log, where to run and the memory knobs."""
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, loss="grpo", max_iters=1, out_dir=str(tmp_path))
    rl.main(rl.Config(**cfg))
    key = next(iter(kw))
    with pytest.raises(UserError, match=rf"ckpt.pt: cannot resume with {key}=.*: the run has {key}="):
        rl.main(rl.Config(**{**cfg, "resume": True, **kw}))
    rl.main(rl.Config(**{**cfg, "resume": True, "max_iters": 2, "eval_interval": 1, "eval_samples": 0, "threads": 2,
                         "micro_batch_size": 8, "ckpt_interval": 7}))  # these may change
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 2


def test_resume_at_an_eval_step_evaluates_it_once(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    """Stopped by a signal in step 2 with an eval due at its end: that eval and the checkpoint are
    written once; the resumed run's metrics rows equal the whole run's, no eval repeated."""
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, loss="grpo", max_iters=4, eval_interval=2, ckpt_interval=100)
    rl.main(rl.Config(out_dir=str(tmp_path / "whole"), **cfg))
    signal_on_call(monkeypatch, rl, "optimizer_step", 2)
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), **cfg))
    assert load_checkpoint(str(tmp_path / "cut" / "ckpt.pt"))["step"] == 2
    monkeypatch.undo()
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: float(text[:1] == "1"))
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    got, want = rows(tmp_path / "cut" / "metrics.jsonl"), rows(tmp_path / "whole" / "metrics.jsonl")
    assert [r["step"] for r in got if "eval/accuracy" in r] == [0, 2, 4] and got == want


@pytest.mark.parametrize("script", ["sft", "rl"])
def test_best_pt_holds_the_first_eval_of_the_best_val_accuracy(sft_ckpt, tmp_path, script, varied_reward):  # noqa: F811
    """best.pt is written at an eval that beats every earlier one, strictly: on a tie the earlier
    step keeps it. Its step and best_val against the logged evals."""
    if script == "sft":
        sft.main(sft.Config(out_dir=str(tmp_path), max_iters=60, eval_interval=10, **TINY_SFT))
    else:
        rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=sft_ckpt, **{**TINY_RL, "max_iters": 6, "eval_interval": 1}))
    evals = [(r["val/accuracy"], r["step"]) for r in rows(tmp_path / "metrics.jsonl") if "val/accuracy" in r]
    best = max(v for v, _ in evals)
    first = next(s for v, s in evals if v == best)
    ck = load_checkpoint(str(tmp_path / "best.pt"))
    assert (ck["step"], ck["best_val"]) == (first, best) and len(evals) >= 6
    assert len({v for v, _ in evals}) < len(evals)  # a tie happened: the rule was tested
