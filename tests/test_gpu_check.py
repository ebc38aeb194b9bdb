"""bench/gpu_check.py --cpu_smoke: every step of the GPU check runs on the CPU at tiny sizes
and prints its row of the table, ok or (the CUDA tests) skipped, never FAIL."""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ["cuda-tests", "sft", "rl-grpo", "rl-async", "throughput", "torchrun"]


def test_cpu_smoke_prints_the_table_without_a_failure(tmp_path):
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "--cpu_smoke",
                        f"--out_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.split()[:2] == ["step", "status"]))
    rows = [line.split(maxsplit=3) for line in lines[head + 1:head + 1 + len(STEPS)]]
    assert [row[0] for row in rows] == STEPS
    assert rows[0][1:2] == ["skipped"] and rows[0][3] == "skipped (no CUDA)"
    assert all(row[1] == "ok" and float(row[2]) >= 0 for row in rows[1:]), rows
    assert "steps/s, idle: trainer" in rows[3][3] and "version lag max 1" in rows[3][3]
    assert "tok/s" in rows[4][3] and "over gloo" in rows[5][3]
    assert "prime-rl" in r.stdout and "https://github.com/" in r.stdout  # the published figure


def test_the_cuda_tests_step_collects_only_their_file_and_names_a_missing_pytest(monkeypatch, tmp_path):
    """requirements.txt alone has no pytest (and no transformers, which tests/test_hf.py needs):
    the step says what to install in one line, and never collects another test file."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    args = argparse.Namespace(out_dir=str(tmp_path), cpu_smoke=True)
    cmds = []
    monkeypatch.setattr(gpu_check, "call", lambda name, cmd, a: cmds.append(cmd) or (0, ""))
    gpu_check.check_tests(args)
    assert cmds[0][-1] == "tests/test_cuda.py" and not any(c.startswith("tests/") for c in cmds[0][:-1])
    real = gpu_check.importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda n, *a: None if n == "pytest" else real(n, *a))
    assert gpu_check.check_tests(args) == ("FAIL", "pytest is not installed: pip install -r requirements-test.txt")
