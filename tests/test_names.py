"""One word, one meaning (docs/guides.md#words): names the glossary rules out, checked over the code
outside tests/ and bench/ (every .py file, parsed; a local is any name a function binds: an
assignment, a loop or `with` target, a parameter). The names banned came from a review: `prepared`
(a stats dict), `steps` (the updates' stats), `online_pairs` (true for offline rows too) and `got`
(two meanings on two consecutive lines of nanorl/turns.py)."""
import ast
import re
import subprocess
from pathlib import Path

import pytest

from nanorl import loop

ROOT = Path(__file__).resolve().parent.parent
SKIP = ("tests/", "bench/")  # the rules cover the code a run executes
BANNED = {  # a local never takes this name: why
    "got": "says nothing of what it holds, and turns.py's held two things on two lines",
    "prepared": "rl.py's stats dict of that name is gone",
    "online_pairs": "rl.check's flag of that name is removed",
    "st": "STYLE.md: a name says what it holds",
    "pre": "STYLE.md: a name says what it holds",
    "iteration": "the glossary's word is step (an optimizer step: update)",
    "iterations": "the glossary's word is step (an optimizer step: update)",
}
# (file, name): a local that takes the name of a function of its own module, there before the rule
SHADOWS = {("losses.py", "loss"), ("nanorl/loop.py", "save"), ("nanorl/rollout_log.py", "facts")}


def tracked(*suffixes):
    """The repo's files that git tracks and that end in one of suffixes, relative paths, sorted:
    never a virtualenv, out/ or data a run generated inside the checkout."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    return sorted(n for n in names if n.endswith(suffixes) and (ROOT / n).is_file())


def sources():
    """{path relative to the repo: its parsed module} for the code the rules cover."""
    return {p: ast.parse((ROOT / p).read_text(), p) for p in tracked(".py")
            if not p.startswith(SKIP)}


def locals_of(tree):
    """(function, name, line) for every name a function (or a method) binds."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    yield getattr(fn, "name", "lambda"), node.id, node.lineno
                elif isinstance(node, ast.arg) and node is not fn:
                    yield getattr(fn, "name", "lambda"), node.arg, node.lineno


CODE = sources()


def test_the_rules_see_the_code():
    assert {"rl.py", "losses.py", "nanorl/loop.py", "nanorl/turns.py"} <= set(CODE)
    assert not any(p.startswith(("tests/", "bench/")) for p in CODE)


@pytest.mark.parametrize("name", sorted(BANNED))
def test_no_local_takes_a_banned_name(name):
    found = [f"{path}:{line} in {fn}()" for path, tree in CODE.items()
             for fn, local, line in locals_of(tree) if local == name]
    assert not found, f"{name!r} ({BANNED[name]}): {', '.join(found)}"


def test_steps_never_holds_optimizer_steps():
    """An optimizer step is an update: rl.py (its loop's steps are step s) and losses.py bind no
    `steps` at all."""
    found = [f"{path}:{line} in {fn}()" for path in ("rl.py", "losses.py")
             for fn, local, line in locals_of(CODE[path]) if local == "steps"]
    assert not found, found


def test_step_is_the_loops_step():
    """GiGPO's advantage kind is its step group (a group's turns from one state), not a step."""
    import losses
    assert "step" not in losses.COLUMNS["advantage"] and "step_group" in losses.COLUMNS["advantage"]


def test_a_local_never_takes_the_name_of_a_function_of_its_module():
    """`sample` the responses and `sample()` the function: in one module a name is one or the
    other. SHADOWS lists the ones there before this rule (fix one, drop it from the list)."""
    found = set()
    for path, tree in CODE.items():
        functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        found |= {(path, local) for fn, local, _ in locals_of(tree)
                  if local in functions and local != fn}
    assert found <= SHADOWS, sorted(found - SHADOWS)


def test_the_clock_logs_an_eval_and_decides_best_apart():
    """Clock.is_best logged, kept and decided at once; now log_eval logs and keeps, new_best
    decides, and no code or doc calls the old name."""
    assert not hasattr(loop.Clock, "is_best")
    assert callable(loop.Clock.log_eval) and callable(loop.Clock.new_best)
    found = [p for p in tracked(".py", ".md") if not p.startswith(SKIP)
             and "is_best" in (ROOT / p).read_text()]
    assert not found, found


def test_the_glossary_names_each_word_once():
    text = (ROOT / "docs" / "guides.md").read_text()
    words = re.findall(r"^\| ([^|]+?) \|", text[text.index("## Words"):text.index("## Add a loss")],
                       re.M)[1:]  # the header's "word" left out
    assert len(words) == len(set(words))
    assert {"step", "update", "sample", "turn", "version", "row", "algorithm"} <= set(words)


def test_only_evaluate_names_the_pass_at_k_metric():
    """evaluate.pass_k_name is the one source of the metric's name (pass@k, or pass@n with fewer
    samples): no other code builds "pass@" in an f-string."""
    found = [f"{path}:{node.lineno}" for path, tree in CODE.items() if path != "nanorl/evaluate.py"
             for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
             and any(isinstance(v, ast.Constant) and "pass@" in str(v.value) for v in node.values)]
    assert not found, found
