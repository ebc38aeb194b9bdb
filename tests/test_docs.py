"""Every command the README's blocks and the module docstrings show runs as written, on tiny
settings: in a scratch folder (its out/ starts empty; configs/ and data/ are the repo's), in the
order a reader would (data, SFT, reward model, RL, sampling, the game's table), each with a few
flags appended that make it tiny (--max_iters, the model's width). A command that cannot run
small is listed in NOT_RUN with the reason; a new command in the docs must be one or the other."""
import ast
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from tests.test_names import tracked

ROOT = Path(__file__).resolve().parent.parent
TINY = {  # flags appended to each script's command: every run a few seconds
    "data.tasks": [],
    "sft.py": ["--max_iters=2", "--eval_interval=2", "--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=16",
               "--eval_samples=0", "--threads=1"],
    "reward_model.py": ["--max_iters=2", "--eval_interval=2", "--batch_size=8", "--policy_samples=0",
                        "--eval_policy_samples=1", "--threads=1"],
    "rl.py": ["--max_iters=1", "--eval_interval=1", "--prompts_per_step=2", "--group_size=2", "--eval_samples=0",
              "--pairs_per_step=4", "--threads=1"],
    "sample.py": [],
    "nanorl.view": [],
    "bench/guess.py": [],
    "bench/executed_lines.py": ["--max_iters=1", "--eval_interval=1", "--prompts_per_step=2", "--group_size=2",
                                "--threads=1"],
}
SEEDED = {"out/sft-teacher": "out/sft-mul"}  # nanorl/distill.py's teacher: any SFT checkpoint of the task
NOT_RUN = {  # a pattern of the command -> why no test runs it as written
    r"^(make|pip) ": "installs, or the whole pipeline: .ci/run runs `make test`; `make demo` is the long run",
    r"^torchrun ": "two processes: tests/test_ddp.py runs rl.py and sft.py under torchrun",
    r"^python -m pytest ": "bench/mutate.py's own pytest call",
    r"^python bench/(?!guess\.py|executed_lines\.py)": "a benchmark, minutes to hours by design (bench/README.md); the small "
                                    "runs of compare, gpu_check, grad_lab and same_weights are tested",
    r"--init_from=gpt2": "downloads GPT-2's weights: tests/test_hf.py maps a tiny random HF GPT-2 offline",
    r"path/to/": "a template: tests/test_task.py runs a folder task through sft.py, rl.py and sample.py",
    r"--replay=": "replays a log, which a tiny run that never updates leaves empty: tests/test_rollout_log.py "
                  "replays whole logs of 20 steps",
}


def readme_commands():
    """The command lines of the README's indented blocks (make's own output lines left out)."""
    return [line for line in (ROOT / "README.md").read_text().split("\n")
            if re.match(r" {4}(python|torchrun|make|pip) ", line) and not re.match(r" {4}make \w+:", line)]


def commands():
    """[(where, command)] of the README's indented blocks, then of every module docstring: each
    `;`-separated command once, its comment and line continuations removed."""
    found = [("README.md", line) for line in readme_commands()]
    for path in tracked(".py"):  # the top level's and one folder down's, tests/ left out
        if path.count("/") <= 1 and not path.startswith("tests/"):
            doc = (ast.get_docstring(ast.parse((ROOT / path).read_text())) or "").replace("\\\n", " ")
            found += [(path, line) for line in doc.split("\n")
                      if re.match(r"\s*(python|torchrun)\b", line)]
    out = {}
    for where, line in found:
        for command in line.split(" ; "):
            try:
                words = shlex.split(command, comments=True)
            except ValueError:  # prose in the line ("<the mutant's tests>")
                words = command.split()
            out.setdefault(shlex.join(words), where)
    return [(where, command) for command, where in out.items()]


def script_of(command):
    """The script a command runs (a key of TINY), or None."""
    words = command.split()
    name = words[2] if words[1] == "-m" else words[1]
    return name if words[0] == "python" and name in TINY else None


def test_every_command_is_run_here_or_says_why_not():
    skipped = {pattern: [c for _, c in commands() if re.search(pattern, c)] for pattern in NOT_RUN}
    assert all(skipped.values()), f"NOT_RUN patterns that match no command: {[p for p, c in skipped.items() if not c]}"
    stray = [(w, c) for w, c in commands() if not script_of(c) and not any(c in v for v in skipped.values())]
    assert not stray, f"commands neither run by this test nor in NOT_RUN: {stray}"
    unmarked = [line for line in readme_commands() if any(re.search(p, part) for p in NOT_RUN
                                                           for part in line.strip().split(" ; "))
                and not re.search(r"#.*(a long run|install|template)", line)]
    assert not unmarked, f"README commands that no test runs must say why (a long run, an install): {unmarked}"


STAGES = ["data.tasks", "sft.py", "reward_model.py", "rl.py", "nanorl.view", "sample.py", "bench/guess.py",
          "bench/executed_lines.py"]


@pytest.mark.filterwarnings("ignore:'data.tasks' found in sys.modules")  # runpy of an imported module
@pytest.mark.filterwarnings("ignore:'nanorl.view' found in sys.modules")
def test_every_command_runs_on_tiny_settings(tmp_path, monkeypatch, capsys):
    """Each in order, as a reader would run them after one another; sample.py prints an accuracy
    when its prompts have answers."""
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # bench/executed_lines.py sets sys.path[0]
    runnable = [(w, c) for w, c in commands() if script_of(c) and not any(re.search(p, c) for p in NOT_RUN)]
    runnable.sort(key=lambda wc: STAGES.index(script_of(wc[1])))  # stable: the docs' order within a stage
    seeded = False
    for where, command in runnable:
        script = script_of(command)
        if script == "rl.py" and not seeded:
            for new, old in SEEDED.items():
                (tmp_path / new).symlink_to(tmp_path / old)
            seeded = True
        module = not script.endswith(".py")  # python -m NAME
        argv = shlex.split(command)[(3 if module else 2):] + TINY[script]
        monkeypatch.setattr(sys, "argv", [script, *argv])
        try:
            if module:
                runpy.run_module(script, run_name="__main__")
            else:
                runpy.run_path(str(ROOT / script), run_name="__main__")
        except SystemExit as e:
            assert not e.code, f"{where}: `{command}` exited {e.code}: {capsys.readouterr().err[-1500:]}"
        out = capsys.readouterr()
        if "--answer=" in command or "--prompts_file=" in command or "--split=" in command:
            assert "accuracy" in out.err, f"{where}: `{command}` printed no accuracy"
    assert len(runnable) >= 25  # the collector found them


def test_the_readmes_reading_route_points_at_the_code():
    """Each `name` (`file.py:line`) of the README names what that line holds, so the route from
    main to DAPO's clip stays true as the code moves."""
    refs = re.findall(r"`([\w.\"]+)` \(`([\w/]+\.py):(\d+)`\)", (ROOT / "README.md").read_text())
    assert len(refs) >= 10
    for name, path, line in refs:
        text = (ROOT / path).read_text().split("\n")[int(line) - 1]
        assert name.split(".")[-1] in text, f"README: `{name}` is not at {path}:{line} ({text.strip()!r})"
