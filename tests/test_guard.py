"""The suite's leftover-process guard (tests/conftest.py) on a session of its own: a child forked
without exec, and a grandchild orphaned in the session's process group, both carry no mark in the
environment of their exec, and both fail the session, named with their test."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

FORKS = '''
import os, time

def sleeper(path):
    """Fork a child that writes its pid to path and sleeps: no exec, so no mark."""
    pid = os.fork()
    if pid == 0:
        open(path, "w").write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
    while not os.path.exists(path) or not open(path).read():
        time.sleep(0.01)

def test_forks():
    sleeper(os.environ["PID_FILE"] + ".child")

def test_orphans():
    if os.fork() == 0:  # a middle process that forks the sleeper and exits: it is orphaned
        sleeper(os.environ["PID_FILE"] + ".orphan")
        os._exit(0)
    os.wait()

def test_clean():
    assert True
'''


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the guard reads /proc (Linux)")
def test_the_guard_finds_processes_forked_without_exec(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_forks.py").write_text(textwrap.dedent(FORKS))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not a pytest.ini above tmp_path
    pid_file = tmp_path / "pid"
    env = dict(os.environ, PID_FILE=str(pid_file), NANORL_TEST_GRACE_S="1")
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "test_forks.py"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
        pids = {k: int((tmp_path / f"pid.{k}").read_text()) for k in ("child", "orphan")}
    finally:
        for k in ("child", "orphan"):  # whatever the guard left: this session's guard must not
            f = tmp_path / f"pid.{k}"
            if f.exists() and f.read_text():
                try:
                    os.kill(int(f.read_text()), signal.SIGKILL)
                except OSError:
                    pass
    assert r.returncode == 1, r.stdout[-2000:]
    for test, pid in (("test_forks", pids["child"]), ("test_orphans", pids["orphan"])):
        assert f"FAILED test_forks.py::{test} left a process behind: pid {pid}:" in r.stdout
    assert "3 passed" in r.stdout and "test_clean left" not in r.stdout
    time.sleep(0.2)
    for pid in pids.values():  # killed by the guard
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
