"""bench/mutate.py's own command line: --help prints its usage and runs nothing (it started every
mutant: 15 min), an unknown option is refused, and every mutant applies where it says."""
import subprocess
import sys

import pytest

from test_docs import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import mutate  # noqa: E402


@pytest.mark.parametrize("args, rc", [(["--help"], 0), (["-h"], 0), (["--bogus"], 2)])
def test_help_prints_the_usage_and_runs_no_mutant(args, rc):
    r = subprocess.run([sys.executable, "bench/mutate.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == rc and "python bench/mutate.py --check" in r.stdout, r.stderr[-2000:]
    assert "unmutated" not in r.stdout and "caught" not in r.stdout


def test_every_mutant_applies_once_and_the_viewer_has_mutants():
    mutate.check(mutate.MUTANTS)  # each old text occurs once in its file, and its tests exist
    files = {path for path, *_ in mutate.MUTANTS}
    assert {"nanorl/view.py", "nanorl/rollout_log.py", "nanorl/asyncrl.py"} <= files
