"""The suite's own check: no test leaves a process behind.

Each test runs with NANORL_TEST set to this session's pid and its node id, which every process it
starts inherits (rl.py, a spawned sampler, torchrun's ranks, a browser). At the end of the session,
any live process that carries this session's mark fails the run, named with the test that started
it, and is killed. (A session a test starts, as bench/gpu_check.py's, checks only its own marks.)
"""
import os
import signal
import sys
import time

import pytest

MARK = "NANORL_TEST"
GRACE_S = 60  # a stopped run's processes may still be exiting


@pytest.fixture(autouse=True)
def mark_processes(request, monkeypatch):
    monkeypatch.setenv(MARK, f"{os.getpid()} {request.node.nodeid}")


def started():
    """{pid: (the test that started it, its command line)} of the live marked processes, but
    multiprocessing's resource tracker of this process (it ends with the session)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        mark = next((e.split(b"=", 1)[1].decode() for e in env
                     if e.startswith(MARK.encode() + b"=")), " ")
        session, test = mark.split(" ", 1)
        tracker = "resource_tracker" in cmd and int(ppid) == os.getpid()
        if session == str(os.getpid()) and state != "Z" and int(pid) != os.getpid() and not tracker:
            found[int(pid)] = (test, cmd)
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
