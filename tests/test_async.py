"""Real async RL (nanorl/asyncrl.py): bit-identity with the simulated --staleness, versions and the
staleness bound, in-flight weights (each token's version and mu), exact resume, a sampler that crashes,
fails or hangs, kill -9 of either process, Ctrl-C, torchrun with 2 ranks, and the misuses' one line."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import rl
from model import GPT, GPTConfig, KVCache, generate
from nanorl import asyncrl
from nanorl.config import UserError
from test_envs import TINY_RL, guess_ckpt  # noqa: F401
from test_ppo_rm import rm_ckpt  # noqa: F401
from test_rl import sft_ckpt  # noqa: F401
from test_tools import tool_ckpt  # noqa: F401
from test_reliability import rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAME = dict(TINY_RL, max_iters=20, eval_interval=100, eval_samples=0)  # the guess game, process reward


def no_perf(path):
    """metrics.jsonl rows without wall-clock numbers or the async run's own lag metrics."""
    return [{k: v for k, v in r.items() if not k.startswith("rl/version_lag")} for r in rows(path)]


@pytest.mark.parametrize("loss, k", [("grpo", 1), ("grpo", 2), ("ppo", 1), ("ppo", 2)])
def test_async_gives_the_simulated_stalenesss_weights_bit_for_bit(guess_ckpt, tmp_path, loss, k):  # noqa: F811
    """20 steps of the game (an environment, turn rewards, dynamic sampling): the sampler process at
    version s-1 makes the rollout the simulation makes in step s, so weights and metrics are identical; every
    trained token is exactly k versions behind the trainer."""
    cfg = dict(GAME, sft_ckpt=guess_ckpt, loss=loss, staleness=k)
    sim = rl.main(rl.Config(out_dir=str(tmp_path / "sim"), **cfg))["model"].state_dict()
    real = rl.main(rl.Config(out_dir=str(tmp_path / "async"), async_rollouts=True, **cfg))["model"].state_dict()
    assert all(torch.equal(sim[n], real[n]) for n in sim)
    assert no_perf(tmp_path / "async" / "metrics.jsonl") == rows(tmp_path / "sim" / "metrics.jsonl")
    trained = [r for r in rows(tmp_path / "async" / "metrics.jsonl", timing=True) if "rl/loss" in r]
    assert len(trained) == 20 - k
    assert all(r["rl/version_lag_mean"] == r["rl/version_lag_max"] == k for r in trained)
    assert all(0 <= r["perf/trainer_idle_frac"] <= 1 and 0 <= r["perf/sampler_idle_frac"] <= 1 for r in trained)


@pytest.mark.parametrize("kind", ["tool", "rm"])
def test_async_composes_with_tools_and_the_reward_model(kind, request, tmp_path):
    """The calculator called mid-answer (PPO: the KL and the critic move it even where every answer is
    wrong), and the reward model scoring where the rollout is made (GRPO on its varied scores): the
    simulation's weights, bit for bit, over 6 steps."""
    if kind == "tool":
        cfg = dict(loss="ppo", sft_ckpt=request.getfixturevalue("tool_ckpt"), max_new_tokens=80,
                   dynamic_sampling=False)
    else:
        cfg = dict(loss="grpo", sft_ckpt=request.getfixturevalue("sft_ckpt"), reward="rm",
                   rm_ckpt=request.getfixturevalue("rm_ckpt")[0])
    cfg = dict(cfg, max_iters=6, eval_interval=100, eval_samples=0, prompts_per_step=4, group_size=4,
               threads=1, staleness=1)
    sim = rl.main(rl.Config(out_dir=str(tmp_path / "sim"), **cfg))
    real = rl.main(rl.Config(out_dir=str(tmp_path / "async"), async_rollouts=True, **cfg))
    assert all(torch.equal(sim["model"].state_dict()[n], v) for n, v in real["model"].state_dict().items())
    assert no_perf(tmp_path / "async" / "metrics.jsonl") == rows(tmp_path / "sim" / "metrics.jsonl")
    assert sum("rl/loss" in r for r in rows(tmp_path / "sim" / "metrics.jsonl")) == 5


def test_a_resumed_async_run_is_exact(guess_ckpt, tmp_path):  # noqa: F811
    """Stopped after step 3 (rollout 4 in flight, thrown away) and resumed to step 6: the sampler
    re-samples rollout 4 from the checkpoint's weights, prompt sampler and generator; the same weights
    and metrics as one whole run."""
    cfg = dict(GAME, sft_ckpt=guess_ckpt, loss="grpo", staleness=2, async_rollouts=True)
    whole = rl.main(rl.Config(out_dir=str(tmp_path / "whole"), **{**cfg, "max_iters": 6}))["model"].state_dict()
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), **{**cfg, "max_iters": 3}))
    queued = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["ranks"][0]["queue"]
    assert len(queued) == 2 and all("version" in q for q in queued)
    resumed = rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **{**cfg, "max_iters": 6}))
    assert all(torch.equal(whole[n], resumed["model"].state_dict()[n]) for n in whole)
    steps = [[r for r in rows(tmp_path / name / "metrics.jsonl") if "rl/n_groups" in r] for name in ("cut", "whole")]
    assert steps[0] == steps[1] and len(steps[0]) == 6  # the cut run's extra eval at step 3 aside


def test_inflight_tokens_carry_newer_versions_within_the_bound(guess_ckpt, tmp_path):  # noqa: F811
    """--inflight: each token's version is between its rollout's start and the trainer's; the lag
    over the tokens trained on stays within k."""
    cfg = dict(GAME, sft_ckpt=guess_ckpt, loss="grpo", staleness=2, max_iters=8)
    rl.main(rl.Config(out_dir=str(tmp_path), async_rollouts=True, inflight=True, **cfg))
    trained = [r for r in rows(tmp_path / "metrics.jsonl") if "rl/loss" in r]
    assert len(trained) == 6 and all(0 <= r["rl/version_lag_mean"] <= r["rl/version_lag_max"] <= 2 for r in trained)
    queued = torch.load(tmp_path / "ckpt.pt", weights_only=True)["ranks"][0]["queue"]
    for s, q in zip((7, 8), queued):  # rollout s starts at version s-1, and the trainer publishes s at most
        v = q["version"]
        assert v.min() >= s - 1 and v.max() <= s and (v[:, 1:] >= v[:, :-1]).all()


class Source:
    """A stand-in for the trainer's weight queue: version 1 (other weights) appears at forward `at`."""

    def __init__(self, model, new, at):
        self.model, self.new, self.at, self.version, self.calls = model, new, at, 0, 0

    def poll(self):
        self.calls += 1
        if self.calls == self.at + 1:
            self.model.load_state_dict(self.new)
            self.version = 1


def test_inflight_swaps_weights_between_decode_steps_and_keeps_the_cache():
    """Version 1 arrives before decode step 3: tokens 0-2 are version 0 with the old weights' log-probs;
    tokens 3 on are version 1, and mu is the new weights read over the old weights' keys and values
    (computed here by hand with a cache the old model filled): the kept cache, not a recomputed one."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=12, block_size=24, n_layer=2, n_head=2, n_embd=16)
    old, new = GPT(cfg).eval(), GPT(cfg).eval()
    model = GPT(cfg).eval()
    model.load_state_dict(old.state_dict())
    policy = asyncrl.InFlight(model, Source(model, new.state_dict(), at=3), inflight=True)
    policy.source.parent = os.getppid()
    prompt = [1, 2, 3]
    out = generate(policy, [prompt], 8, eos_id=-1, pad_id=11, generator=torch.Generator().manual_seed(0))
    L = out["logps"].size(1)
    assert L == 8 and out["version"].tolist() == [[0, 0, 0] + [1] * (L - 3)]
    seq = torch.tensor([prompt + out["ids"][0, 3:].tolist()])  # (1, 3 + L)
    cache = KVCache()
    with torch.no_grad():
        logits_old = old(seq[:, :5], None, cache)  # the prompt, tokens 0-1: by version 0 (forwards 0-2)
        logits_new = new(seq[:, 5:-1], None, cache)  # token 2 on: by version 1 over the old cache
    lp = torch.cat([logits_old[:, 2:], logits_new], 1).log_softmax(-1)  # (1, L, V) predicting tokens 0..L-1
    want = lp.gather(2, seq[:, 3:, None]).squeeze(2)
    torch.testing.assert_close(out["logps"], want, rtol=0, atol=1e-5)
    recomputed = new(seq[:, :-1]).log_softmax(-1)[:, 2:].gather(2, seq[:, 3:, None]).squeeze(2)
    assert (recomputed[:, 3:] - want[:, 3:]).abs().max() > 1e-3  # the kept cache is not a recomputed one


def test_a_failing_sampler_reports_one_line():
    """An exception in the sampler reaches the trainer as its message, on one line."""
    received, out = torch.multiprocessing.get_context("spawn").Pipe(duplex=False)

    def setup(*a):
        raise ValueError("bad row\nmore")
    handler, threads = signal.getsignal(signal.SIGINT), torch.get_num_threads()
    try:
        asyncrl.serve(vars(rl.Config()), rl.Config, {}, "cpu", 0, 1, 1, {}, 1, setup, None, None, out,
                      os.getppid())
    finally:
        signal.signal(signal.SIGINT, handler)
        torch.set_num_threads(threads)
    assert received.poll(5) and received.recv() == {"error": "ValueError: bad row"}


@pytest.mark.parametrize("kw, msg", [
    (dict(inflight=True), "--inflight updates the async sampler's weights: it needs --async_rollouts=true"),
    (dict(async_rollouts=True), "--async_rollouts needs --staleness >= 1"),
    (dict(async_rollouts=True, staleness=1, loss="rloo"), "--staleness trains on old rollouts"),
    (dict(async_rollouts=True, staleness=1, loss="dpo", pairs="online"), "--staleness trains on old rollouts"),
    (dict(async_rollouts=True, staleness=1, async_timeout=0.0), "async_timeout must be > 0"),
])
def test_async_misuse_is_one_line(guess_ckpt, tmp_path, kw, msg):  # noqa: F811
    with pytest.raises(UserError, match=msg):
        rl.main(rl.Config(**{**GAME, "sft_ckpt": guess_ckpt, "out_dir": str(tmp_path), **kw}))

# ----------------------------------------------------------------------------- processes


def children(pid):
    """Every live descendant of pid."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    parent = dict(zip(map(int, out[0::2]), map(int, out[1::2])))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def sampler_of(pid):
    """The sampler process among pid's children (not multiprocessing's resource tracker)."""
    for _ in range(600):
        for c in children(pid):
            try:
                cmd = open(f"/proc/{c}/cmdline").read()
            except OSError:
                continue
            if "spawn_main" in cmd:
                return c
        time.sleep(0.05)
    raise AssertionError("no sampler process")


def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def start(guess_ckpt, out, *extra):  # noqa: F811
    """rl.py in a process group of its own (as a terminal runs it), with a sampler; long enough to act on."""
    args = [sys.executable, "rl.py", f"--sft_ckpt={guess_ckpt}", f"--out_dir={out}", "--loss=grpo",
            "--staleness=1", "--async_rollouts=true", "--max_iters=100000", "--eval_interval=100000",
            "--eval_samples=0", "--prompts_per_step=4", "--group_size=4", "--threads=1", *extra]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_steps(out, n=3):
    for _ in range(600):
        if os.path.exists(out / "metrics.jsonl") and sum(1 for _ in open(out / "metrics.jsonl")) > n:
            return
        time.sleep(0.05)
    raise AssertionError("no steps logged")


def test_kill_9_of_the_sampler_stops_the_trainer_in_one_line(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(guess_ckpt, tmp_path)
    sampler = sampler_of(proc.pid)
    wait_for_steps(tmp_path)
    os.kill(sampler, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "the async sampler died (exit code -9) before rollout" in err, err[-2000:]
    assert "Traceback" not in err


def test_a_hung_sampler_stops_the_trainer_within_the_timeout_and_is_killed(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(guess_ckpt, tmp_path, "--async_timeout=3")
    sampler = sampler_of(proc.pid)
    wait_for_steps(tmp_path)
    os.kill(sampler, signal.SIGSTOP)  # alive and silent
    t = time.time()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "the async sampler sent no rollout in 3 s (--async_timeout)" in err, err[-2000:]
    assert time.time() - t < 20
    time.sleep(0.5)
    assert not alive(sampler)


def test_kill_9_of_the_trainer_leaves_no_sampler_behind(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(guess_ckpt, tmp_path)
    sampler = sampler_of(proc.pid)
    wait_for_steps(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    for _ in range(100):
        if not alive(sampler):
            break
        time.sleep(0.1)
    assert not alive(sampler)


def test_ctrl_c_stops_both_processes_and_saves(guess_ckpt, tmp_path):  # noqa: F811
    """SIGINT to the process group, as a terminal sends it: the trainer finishes its step, saves and exits
    0; the sampler (which ignores it) is stopped; a resume goes on from the saved step."""
    proc = start(guess_ckpt, tmp_path)
    sampler = sampler_of(proc.pid)
    wait_for_steps(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "continue with --resume=true" in out, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    time.sleep(0.5)
    assert not alive(sampler) and not children(proc.pid)
    step = torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"]
    r = subprocess.run(start(guess_ckpt, tmp_path).args + ["--resume=true", f"--max_iters={step + 2}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"step {step + 2:5d}/{step + 2}" in r.stdout, r.stderr[-2000:]


def test_torchrun_async_equals_the_simulation_on_two_ranks(guess_ckpt, tmp_path):  # noqa: F811
    """One sampler per rank, each on its rank's share of the prompts: the same weights as the simulated
    staleness under torchrun."""
    free_port = __import__("test_ddp").free_port
    weights = []
    for name, extra in (("sim", []), ("async", ["--async_rollouts=true"])):
        port, out = free_port(), tmp_path / name
        args = [f"--sft_ckpt={guess_ckpt}", f"--out_dir={out}", "--loss=grpo", "--prompts_per_step=4",
                "--group_size=4", "--max_iters=4", "--eval_samples=0", "--eval_interval=100", "--threads=1",
                "--staleness=1", '--env_args={"process_reward": true}', *extra]
        procs = [subprocess.Popen([sys.executable, "rl.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                       "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"})
                 for r in (0, 1)]
        outs = [p.communicate(timeout=200) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
        weights.append(torch.load(out / "ckpt.pt", weights_only=True)["model"])
        trained = [json.loads(line) for line in open(out / "metrics.jsonl") if "rl/loss" in line]
        assert len(trained) == 3
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
