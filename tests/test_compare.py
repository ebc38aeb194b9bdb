"""compare.py on a tiny SFT checkpoint: bad input fails before any run and loses nothing, two runs give
the same table apart from the timing columns, a failed run is a row, matplotlib is optional, wandb
runs share a group."""
import os
import subprocess
import sys
import time

import pytest

from bench import compare
from nanorl.config import UserError

from test_rl import ROOT

TINY = dict(max_iters=2, eval_interval=1, eval_samples=2, jobs=2,  # baselines: the default step budget (auto)
            rl_args="--prompts_per_step=4 --group_size=4 --pairs_per_step=8")
TIMING = ("train s", "wall s")


def table(md):
    """The table of a compare.md as rows of cells, timing columns removed."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    keep = [i for i, h in enumerate(rows[0]) if h not in TIMING]
    return [[r[i] for i in keep if i < len(r)] for r in rows]


def cli(*args):
    return subprocess.run([sys.executable, "bench/compare.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture
def earlier(tmp_path):
    """An out_dir holding an earlier comparison: none of it may be lost."""
    out = tmp_path / "cmp"
    (out / "runs" / "grpo-s1337").mkdir(parents=True)
    files = {out / "compare.md": "old table\n", out / "runs" / "grpo-s1337" / "metrics.jsonl": '{"step": 0}\n'}
    for p, text in files.items():
        p.write_text(text)
    return out, files


def unchanged(out, files):
    """Exactly the earlier files and their folders, with their contents."""
    want = {p.relative_to(out) for p in files} | {"runs", "runs/grpo-s1337"}
    return {str(p.relative_to(out)) for p in out.rglob("*")} == {str(p) for p in want} and \
        all(p.read_text() == t for p, t in files.items())


@pytest.mark.parametrize("args, msg", [
    (["--losses=grpo,nonsense"], "unknown loss 'nonsense' in --losses; valid: reinforce, rloo, ppo"),
    (["--sft_ckpt={tmp}/none.pt"], "none.pt: no such checkpoint"),
    (["--sft_ckpt={ckpt}", "--out_dir={tmp}/afile/cmp"], "is not writable"),
    (["--sft_ckpt={ckpt}", "--rl_args=--lrr=1"], "unknown config key 'lrr' (did you mean 'lr'?)"),
    (["--sft_ckpt={ckpt}", "--rl_args=--seed=3"], "--seed=3 is set by compare.py itself"),
    (["--seeds=1,x"], "--seeds must be comma-separated integers"),
    (["--baseline_budget=120s"], "--baseline_budget must be auto or steps like 50"),
])
def test_bad_input_is_one_line_and_loses_nothing(sft_ckpt, tmp_path, earlier, args, msg):  # noqa: F811
    out, files = earlier
    (tmp_path / "afile").write_text("a file, not a folder")
    args = [a.format(tmp=tmp_path, ckpt=sft_ckpt) for a in args]
    r = cli(f"--out_dir={out}", *args)  # a later --out_dir wins
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert unchanged(out, files)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_out_dir(sft_ckpt, tmp_path, earlier):  # noqa: F811
    out, files = earlier
    os.chmod(out, 0o500)
    try:
        with pytest.raises(UserError, match="is not writable"):
            compare.main(compare.Config(sft_ckpt=sft_ckpt, out_dir=str(out)))
    finally:
        os.chmod(out, 0o700)
    assert unchanged(out, files)


def test_same_seeds_same_table_failed_run_is_a_row_and_nothing_is_lost(sft_ckpt, tmp_path, earlier, monkeypatch):  # noqa: F811
    """cliff refuses a checkpoint graded by the text verifier (a run that fails); grpo and the sft
    baseline run twice into the same out_dir: the tables agree apart from timing, the earlier runs are
    kept as .old<k>."""
    import sft
    from test_rl import TINY_SFT
    out, _ = earlier
    sft.main(sft.Config(out_dir=str(tmp_path / "sft-text"), verifier="text", **TINY_SFT))
    cfg = compare.Config(losses="grpo,cliff,sft", sft_ckpt=str(tmp_path / "sft-text" / "ckpt.pt"),
                         out_dir=str(out), **TINY)
    try:  # imported whole first, so that hiding it below and bringing it back leaves sys.modules intact
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        pass
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)  # as if not installed
        first = compare.main(cfg)
    md1 = (out / "compare.md").read_text()
    assert first["failed"] == ["cliff-s1337"] and "matplotlib is not installed (pip install matplotlib)" in md1
    assert not (out / "compare.png").exists()
    t = table(md1)
    assert [r[0] for r in t[1:]] == ["grpo", "cliff (1 of 1 seeds failed: see runs/cliff-s1337/log.txt)", "sft"]
    assert "baselines (budget auto): sft 9" in md1  # 2 x 4.6, the same training time here
    assert t[2][1:3] == ["—", "— → —"]
    assert "only the exact verifier" in (out / "runs" / "cliff-s1337" / "log.txt").read_text()
    assert t[1][1] == "2" and t[3][1] == "9" and t[1][2].startswith("0.") and "→" in t[3][2]  # steps, accuracy

    second = compare.main(cfg)
    md2 = (out / "compare.md").read_text()
    assert table(md2) == t  # the same table apart from the timing columns (which may even agree, rounded)
    for md in (md1, md2):  # the timing columns are there, whole seconds, for every run that finished
        raw = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
        cols = [raw[0].index(h) for h in TIMING]
        assert all(r[c].isdigit() for r in raw[1:] if "failed" not in r[0] for c in cols)
    assert (out / "runs" / "grpo-s1337.old1" / "metrics.jsonl").read_text() == '{"step": 0}\n'  # the earliest
    assert (out / "runs" / "grpo-s1337.old2" / "log.txt").exists() and second["failed"] == ["cliff-s1337"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![curves](compare.png)" in md2


def test_wandb_runs_share_a_group_offline(sft_ckpt, tmp_path, monkeypatch):  # noqa: F811
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "cmp"
    compare.main(compare.Config(losses="sft,rft", sft_ckpt=sft_ckpt, out_dir=str(out), wandb=True,
                                **{**TINY, "baseline_budget": "1", "rl_args": TINY["rl_args"] + " --wandb_group=grp-cmp-7"}))
    for name in ("sft-s1337", "rft-s1337"):
        runs = list((out / "runs" / name / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, name
        deadline = time.time() + 600  # wandb's service may still be flushing the file on a loaded machine
        while time.time() < deadline:
            log = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))
            if b"grp-cmp-7" in log:
                break
            time.sleep(0.2)
        assert b"grp-cmp-7" in log
        config = next(x for x in (out / "runs" / name / "log.txt").read_text().splitlines() if x.startswith("config:"))
        assert "wandb_group=grp-cmp-7" in config.split()  # rl_args' group wins over compare's default
    assert not (out / "wandb").exists()  # no summary run of its own
