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
from test_envs import TINY_RL
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


def test_bit_identity_holds_at_equal_threads_per_stage(guess_ckpt, tmp_path):  # noqa: F811
    """The async trainer keeps half of --threads and its sampler takes the rest: --threads=2 async is the
    simulation at --threads=1, weights and metrics (docs/guides.md#async-rl says so)."""
    cfg, threads = dict(GAME, sft_ckpt=guess_ckpt, loss="grpo", staleness=1, max_iters=6), torch.get_num_threads()
    sim = rl.main(rl.Config(out_dir=str(tmp_path / "sim"), **{**cfg, "threads": 1}))["model"].state_dict()
    real = rl.main(rl.Config(out_dir=str(tmp_path / "async"), async_rollouts=True, **{**cfg, "threads": 2}))
    torch.set_num_threads(threads)
    assert all(torch.equal(sim[n], v) for n, v in real["model"].state_dict().items())
    assert no_perf(tmp_path / "async" / "metrics.jsonl") == rows(tmp_path / "sim" / "metrics.jsonl")
    guide = " ".join(open(os.path.join(ROOT, "docs", "guides.md")).read().split())
    assert "bit-identical weights at equal threads per stage" in guide and \
        "`--threads=2` async equals `--threads=1` simulated" in guide


def test_an_async_runs_log_holds_each_rollouts_own_sampling_stats(guess_ckpt, tmp_path):  # noqa: F811
    """The rollout log of an async run equals the simulation's, rows and stats: each step's file holds the
    rollout it trained on with that rollout's sampling stats (the sampler's), not none."""
    cfg = dict(GAME, sft_ckpt=guess_ckpt, loss="grpo", staleness=1, max_iters=4, log_rollouts=-1, log_every=1)
    for name, extra in (("sim", {}), ("async", {"async_rollouts": True})):
        rl.main(rl.Config(out_dir=str(tmp_path / name), **cfg, **extra))
    for step in range(2, 5):
        sim, real = (torch.load(tmp_path / name / "rollouts" / f"step_{step:06d}.pt", weights_only=True)["ranks"][0]
                     for name in ("sim", "async"))
        same = lambda stats: {k: v for k, v in stats.items() if not k.startswith("perf/")}  # noqa: E731
        assert same(real["stats"]) == same(sim["stats"]) and real["stats"]["rl/n_groups"] >= 1
        assert real["batch"].keys() == {*sim["batch"], "version"}  # each token's version: async's only
        assert all(torch.equal(real["batch"][k], sim["batch"][k]) for k in sim["batch"])


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
    assert len(queued) == 2 and all("version" in batch and stats["rl/n_groups"] for batch, stats in queued)
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
        v = q[0]["version"]
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
    out = asyncrl.stamped(generate, policy)(policy, [prompt], 8, eos_id=-1, pad_id=11,
                                            generator=torch.Generator().manual_seed(0))
    L = out["logps"].size(1)
    assert L == 8 and out["version"].tolist() == [[0, 0, 0] + [1] * (L - 3)]
    assert policy.log == []  # each call's record is read and cleared: it would grow with the run
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
    assert received.poll(5) and asyncrl.recv(received) == {"error": "ValueError: bad row"}


PUBLISH = """
import os, sys, time, torch
import torch.multiprocessing as mp
sys.path.insert(0, sys.argv[1])
from nanorl import asyncrl

def sampler(conn, parent, ready):
    weights = asyncrl.Weights(torch.nn.Linear(1024, 1024), conn, parent)
    weights.wait_for(0)
    ready.send(True)
    weights.wait_for(100)  # reading version after version, until killed

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    for attempt in range(5):
        theirs, ours = ctx.Pipe(duplex=False)
        ready, told = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=sampler, args=(theirs, os.getpid(), told))
        proc.start(); theirs.close(); told.close()
        sender = asyncrl.Sender(ours)
        for v in range(40):  # 4 MB each
            sender.put((v, torch.nn.Linear(1024, 1024).state_dict()))
        assert ready.poll(300) and ready.recv()
        time.sleep(0.01 * attempt)
        proc.kill(); proc.join()
        time.sleep(0.5)  # the publisher meets the dead reader
    print("done")
"""


def test_a_sampler_killed_while_it_reads_a_version_costs_the_trainer_no_traceback(tmp_path):
    """Killed 5 times mid-stream of published versions: the trainer's side prints nothing."""
    (tmp_path / "publish.py").write_text(PUBLISH)  # a file: spawn imports its sampler from it
    r = subprocess.run([sys.executable, str(tmp_path / "publish.py"), ROOT], cwd=ROOT, capture_output=True,
                       text=True, timeout=WAIT_S)
    assert r.returncode == 0 and r.stdout.strip() == "done" and r.stderr == "", r.stderr[-2000:]


def test_a_message_cut_short_by_a_dead_sender_reads_as_its_end():
    """The other end died mid-message (a length sent, part of the bytes): EOFError, which each side takes as
    the other's end, not an OSError's traceback."""
    import struct
    received, out = torch.multiprocessing.get_context("spawn").Pipe(duplex=False)
    os.write(out.fileno(), struct.pack("!i", 100) + b"x" * 10)
    out.close()
    with pytest.raises(EOFError):
        asyncrl.recv(received)


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


WAIT_S = 600  # every wait below is for a condition; a loaded machine may take minutes


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


def until(condition, proc, what):
    """Wait for condition() (up to WAIT_S), failing at once, with its stderr, if proc ends first."""
    deadline = time.time() + WAIT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"rl.py exited ({proc.returncode}) before {what}: "
                                 f"{proc.communicate()[1][-2000:]}")
        if time.time() > deadline:
            raise AssertionError(f"no {what} in {WAIT_S} s")
        time.sleep(0.05)


def descendant(proc, word):
    """The first of proc's descendants whose command line holds word, once there is one."""
    found = []

    def look():
        for c in children(proc.pid):
            try:
                if word in open(f"/proc/{c}/cmdline").read():
                    return found.append(c) or True
            except OSError:
                continue
        return False
    until(look, proc, f"a process running {word}")
    return found[0]


def sampler_of(proc):
    """The sampler process (spawned: not multiprocessing's resource tracker)."""
    return descendant(proc, "spawn_main")


def state(pid):
    """R running, S sleeping (waiting), ... (/proc/pid/stat), or '' when gone."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def alive(pid):
    return state(pid) not in ("", "Z")  # Z: exited, not yet reaped


def ignored(pid):
    """The signals pid ignores (/proc/pid/status's SigIgn mask)."""
    mask = next(int(line.split()[1], 16) for line in open(f"/proc/{pid}/status") if line.startswith("SigIgn"))
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


def command(guess_ckpt, out, *extra):  # noqa: F811
    """rl.py's command line: async, long enough to act on."""
    return [sys.executable, "rl.py", f"--sft_ckpt={guess_ckpt}", f"--out_dir={out}", "--loss=grpo",
            "--staleness=1", "--async_rollouts=true", "--max_iters=100000", "--eval_interval=100000",
            "--eval_samples=0", "--prompts_per_step=4", "--group_size=4", "--threads=1", *extra]


STARTED = []  # this module's runs: a failed test's are ended after it


def start(args):
    """A command in a process group of its own (as a terminal runs it)."""
    STARTED.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True))
    return STARTED[-1]


@pytest.fixture(autouse=True)
def end_what_a_failed_test_started():
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:  # the test failed before its run ended: end the run's group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def logged(out):
    """Steps in metrics.jsonl so far."""
    try:
        return sum(1 for line in open(out / "metrics.jsonl") if '"rl/n_groups"' in line)
    except OSError:
        return 0


def wait_for_steps(proc, out, n=3):
    until(lambda: logged(out) >= n, proc, f"{n} steps logged")


def test_kill_9_of_the_sampler_stops_the_trainer_in_one_line(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(command(guess_ckpt, tmp_path))
    sampler = sampler_of(proc)
    wait_for_steps(proc, tmp_path)
    os.kill(sampler, signal.SIGKILL)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode != 0 and "the async sampler died (exit code -9) at rollout" in err, err[-2000:]
    assert "Traceback" not in err


def test_a_hung_sampler_stops_the_trainer_within_the_timeout_and_is_killed(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(command(guess_ckpt, tmp_path, "--async_timeout=10"))
    sampler = sampler_of(proc)
    wait_for_steps(proc, tmp_path)
    os.kill(sampler, signal.SIGSTOP)  # alive and silent
    t = time.time()
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode != 0 and "the async sampler sent nothing in 10 s (--async_timeout): hung at rollout" in err, err[-2000:]
    assert time.time() - t < 100  # the timeout's 10 s and the stop, not the default 300 s
    until(lambda: not alive(sampler), proc, "the sampler's end")


def test_kill_9_of_the_trainer_leaves_no_sampler_behind(guess_ckpt, tmp_path):  # noqa: F811
    proc = start(command(guess_ckpt, tmp_path))
    sampler = sampler_of(proc)
    wait_for_steps(proc, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=WAIT_S)  # the sampler's stderr too: it ends when the sampler does
    until(lambda: not alive(sampler), proc, "the sampler's end")
    assert "Traceback" not in err, err[-2000:]


def test_an_orphaned_sampler_exits_before_its_next_forward():
    """The trainer gone (its pid is no longer the parent): the sampler's policy exits at its next
    forward, mid-rollout, not after the rollout when its send fails."""
    code = ("import os, torch; from model import GPT, GPTConfig; from nanorl import asyncrl\n"
            "m = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))\n"
            "class Source: version, parent = 0, os.getppid() + 10**6  # not our parent\n"
            "policy = asyncrl.InFlight(m, Source(), inflight=False)\n"
            "policy(torch.zeros(1, 2, dtype=torch.long)); print('forward ran')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0 and "forward ran" not in r.stdout, r.stderr[-2000:]


# a sampler call a prompt: sampling takes ~8x the update
SAMPLER_LONGER = ("--prompts_per_step=16", "--group_size=8", "--sample_batch_size=8", "--dynamic_sampling=false")


def stop_by_signal(guess_ckpt, tmp_path, sig, via_timeout=False):
    """sig to the run's process group (through `timeout` when via_timeout, which passes it on to
    the run and its group), while the sampler samples and the trainer waits for it (the sampler
    the longer stage) -> the run's stdout."""
    args = command(guess_ckpt, tmp_path, *SAMPLER_LONGER)
    proc = start(["timeout", "-s", "TERM", str(WAIT_S), *args] if via_timeout else args)
    trainer = descendant(proc, "rl.py") if via_timeout else proc.pid
    sampler = sampler_of(proc)
    wait_for_steps(proc, tmp_path)
    assert {signal.SIGINT, signal.SIGTERM} <= ignored(sampler)  # the trainer stops it
    until(lambda: state(sampler) == "R" and state(trainer) == "S", proc, "a rollout in progress")
    (os.kill if via_timeout else os.killpg)(proc.pid, sig)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0 and "continue with --resume=true" in out, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    until(lambda: not alive(sampler) and not children(proc.pid), proc, "the sampler's end")
    return out


@pytest.mark.parametrize("sig, via_timeout", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                              (signal.SIGTERM, True)])
def test_a_stop_signal_to_the_group_saves_the_step_and_exits_0(guess_ckpt, tmp_path, sig, via_timeout):  # noqa: F811
    """Ctrl-C (SIGINT to the group), `kill -TERM -PGID` or a scheduler's cancel, and `timeout`: the
    trainer finishes its step, saves it and exits 0, as a sync run does; the sampler (which ignores
    both signals) is stopped; a resume goes on from the saved step."""
    out = stop_by_signal(guess_ckpt, tmp_path, sig, via_timeout)
    step = torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"]
    assert f"saved {tmp_path}/ckpt.pt at step {step}" in out and step == logged(tmp_path) >= 3
    if sig == signal.SIGINT:
        resumed = command(guess_ckpt, tmp_path, *SAMPLER_LONGER, "--resume=true", f"--max_iters={step + 2}")
        r = subprocess.run(resumed, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
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
        outs = [p.communicate(timeout=600) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
        weights.append(torch.load(out / "ckpt.pt", weights_only=True)["model"])
        trained = [json.loads(line) for line in open(out / "metrics.jsonl") if "rl/loss" in line]
        assert len(trained) == 3
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
