"""The suite's own check: no test leaves a process behind.

Each test runs with NANORL_TEST set to this session's pid and its node id, which every process it
execs inherits (rl.py, a spawned sampler, torchrun's ranks, a browser). A process forked without
exec keeps the environment of its exec, which lacks the mark: it is found by its parent chain
(pytest's descendants) or its process group (pytest's, a grandchild whose parent died), and
named with the test after which it was first seen. At the end of the session, any live process
found either way fails the run, named with its test, and is killed. (A session a test starts, as
bench/gpu_check.py's, checks only its own.)

Beside it, the tiny checkpoints many files start from, each trained once a session.
"""
import os
import signal
import sys
import time

import pytest

MARK = "NANORL_TEST"
GRACE_S = float(os.environ.get("NANORL_TEST_GRACE_S", 60))  # a stopped run's may still be exiting


def processes():
    """{pid: (state, parent pid, process group)} of every process this user may read."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except OSError:  # gone meanwhile
            continue
        out[int(pid)] = state, int(ppid), int(pgrp)
    return out


BEFORE = set(processes()) if os.path.isdir("/proc") else set()  # the session's start: its
# shell, make, a tee beside it share its process group and are not its doing
FORKED = {}  # pid -> the test after which it was first seen, unmarked


def forked(table):
    """The live pids of table that this session forked: its descendants and the members of its
    process group that were not there when it began, itself aside."""
    me, group = os.getpid(), os.getpgrp()

    def descends(pid):
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = table[pid][1] if pid in table else 0
            if pid == me:
                return True
        return False
    return {pid for pid, (state, _, pgrp) in table.items()
            if pid != me and pid not in BEFORE and state != "Z" and (pgrp == group or descends(pid))}


@pytest.fixture(autouse=True)
def mark_processes(request, monkeypatch):
    monkeypatch.setenv(MARK, f"{os.getpid()} {request.node.nodeid}")
    yield
    if os.path.isdir("/proc"):
        for pid in forked(processes()):
            FORKED.setdefault(pid, request.node.nodeid)


def started():
    """{pid: (the test that started it, its command line)} of the live processes that carry this
    session's mark or that it forked, but multiprocessing's resource tracker of this process (it
    ends with the session)."""
    table, found = processes(), {}
    ours = forked(table)
    for pid, (state, ppid, _) in table.items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        mark = next((e.split(b"=", 1)[1].decode() for e in env
                     if e.startswith(MARK.encode() + b"=")), " ")
        session, test = mark.split(" ", 1)
        marked = session == str(os.getpid()) and state != "Z" and pid != os.getpid()
        tracker = "resource_tracker" in cmd and ppid == os.getpid()
        if (marked or pid in ours) and not tracker:
            found[pid] = (test if marked else FORKED.get(pid, "a test (forked, never exec'd)"), cmd)
    return found


def pytest_sessionfinish(session, exitstatus):
    if not os.path.isdir("/proc"):  # Linux only: elsewhere nothing is checked
        return
    if "wandb" in sys.modules:  # its service process, shared by the session's runs, ends with it
        sys.modules["wandb"].teardown()
    deadline = time.time() + GRACE_S
    while (left := started()) and time.time() < deadline:
        time.sleep(0.5)
    for pid, (test, cmd) in left.items():
        print(f"\nFAILED {test} left a process behind: pid {pid}: {cmd[:200]}", flush=True)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------- the shared checkpoints


@pytest.fixture(scope="session")
def sft_ckpt(tmp_path_factory):
    """A tiny SFT on mul (test_rl.TINY_SFT): the start of most RL tests."""
    import sft
    from test_rl import TINY_SFT
    out = tmp_path_factory.mktemp("sft")
    sft.main(sft.Config(out_dir=str(out), **TINY_SFT))
    return str(out / "ckpt.pt")


@pytest.fixture(scope="session")
def guess_ckpt(tmp_path_factory):
    """A tiny SFT on guess the number's demonstrations (test_envs.TINY_GUESS)."""
    import sft
    from test_envs import TINY_GUESS
    out = tmp_path_factory.mktemp("sft-guess")
    sft.main(sft.Config(out_dir=str(out), **TINY_GUESS))
    return str(out / "ckpt.pt")


@pytest.fixture(scope="session")
def tool_ckpt(tmp_path_factory):
    """A tiny SFT on calculator traces (it calls the tool, its answers mostly wrong)."""
    import sft
    out = tmp_path_factory.mktemp("sft-tool")
    sft.main(sft.Config(task="mul3_tool", block_size=96, max_new_tokens=80,
                        out_dir=str(out), n_layer=1, n_head=2, n_embd=32, batch_size=64, lr=3e-3,
                        warmup_iters=5, max_iters=60, eval_interval=60, eval_samples=0,
                        threads=1, bf16=False))
    return str(out / "ckpt.pt")


@pytest.fixture(scope="session")
def rm_ckpt(sft_ckpt, tmp_path_factory):
    """A tiny reward model on sft_ckpt (test_ppo_rm.TINY_RM) -> (its path, its metrics, its folder)."""
    import reward_model
    from test_ppo_rm import TINY_RM
    out = tmp_path_factory.mktemp("rm")
    m = reward_model.main(reward_model.Config(sft_ckpt=sft_ckpt, out_dir=str(out), **TINY_RM))
    return str(out / "ckpt.pt"), m, out
