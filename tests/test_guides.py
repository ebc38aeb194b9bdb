"""docs/guides.md's "Add a loss" and "Add an environment" diffs apply to this very code and run as the
guides show."""
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path


from tests.test_names import tracked
from tests.test_rl import TINY_RL

ROOT = Path(__file__).resolve().parent.parent
CHECK = """
import torch
import losses as L, rl
g = torch.Generator().manual_seed(0)
logp, old = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
adv, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1, 1, 1, 0]] * 3)
r, A = (logp - old).exp(), adv[:, None].expand(3, 4)
want = -((r * A - A.abs() * (r - 1) ** 2 / 0.2)[:, :3]).mean()  # 2 spo_eps = 0.2
def loss(name, *tensors, **knobs):  # the row's loss, its other knobs at the row's defaults
    return L.algo_loss(L.ALGOS[name], L.resolve_hparams(name, **knobs), *tensors)[0]
got = loss("spo", logp, old, adv, mask, spo_eps=0.1)
torch.testing.assert_close(got, want)
kw = dict(beta=0.0, eps_high=0.28)  # grpo_tm at dapo's clip and beta: dapo's loss
torch.testing.assert_close(loss("grpo_tm", logp, old, adv, mask, **kw), loss("dapo", logp, old, adv, mask))
assert rl.Config(loss="spo", spo_eps=0.1).spo_eps == 0.1
print("ok")
"""


def guide_diff(section, end):
    text = (ROOT / "docs" / "guides.md").read_text()
    return re.search(r"```diff\n(.*?)```", text[text.index(section):text.index(end)], re.S)[1]


def patched_copy(tmp_path, section, end):
    """A copy of the files git tracks (no tests, bench, docs) with the guide's diff applied."""
    repo = tmp_path / "repo"
    for name in tracked(""):  # never a virtualenv, out/ or generated data in the checkout
        if not name.startswith(("tests/", "bench/", "docs/")):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    (repo / "guide.diff").write_text(guide_diff(section, end))
    subprocess.run(["git", "apply", "--recount", "guide.diff"], cwd=repo, check=True)
    return repo


def test_add_a_loss_diff_applies_and_runs(tmp_path, sft_ckpt):  # noqa: F811
    repo = patched_copy(tmp_path, "## Add a loss", "## Add an environment")
    run = dict(cwd=repo, capture_output=True, text=True, timeout=300)
    out = subprocess.run([sys.executable, "-c", CHECK], **run)
    assert out.stdout.strip() == "ok", out.stderr
    flags = [f"--{k}={v}" for k, v in TINY_RL.items()]
    for loss in ("grpo_tm", "spo"):  # as the guide shows, on the tiny checkpoint
        cmd = [sys.executable, "rl.py", f"--loss={loss}", f"--sft_ckpt={sft_ckpt}",
               f"--out_dir={tmp_path / loss}", "--dynamic_sampling=false", *flags] + (["--spo_eps=0.1"] * (loss == "spo"))
        out = subprocess.run(cmd, **run)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [json.loads(line) for line in open(tmp_path / loss / "metrics.jsonl")]
        assert all(math.isfinite(r["rl/loss"]) for r in rows if "rl/loss" in r)
        assert any("rl/loss" in r for r in rows) and rows[-1]["eval/accuracy"] >= 0
        if loss == "spo":
            assert rows[0]["hparams/spo_eps"] == 0.1


def test_add_an_environment_diff_adds_one_file_and_trains_on_it(tmp_path):
    """The new environment is one new file: SFT on its demonstrations, then GRPO on its games,
    a few steps each, with the episode metrics logged."""
    repo = patched_copy(tmp_path, "## Add an environment", "## Bring your own task")
    assert (repo / "envs" / "digit.py").exists() and not (ROOT / "envs" / "digit.py").exists()
    run = dict(cwd=repo, capture_output=True, text=True, timeout=300)
    tiny = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--threads=1"]
    out = subprocess.run([sys.executable, "sft.py", "--task=env:digit", "--reverse=false", "--block_size=40",
                          "--max_new_tokens=31", "--max_iters=30", "--eval_interval=30",
                          f"--out_dir={tmp_path / 'sft'}", *tiny], **run)
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run([sys.executable, "rl.py", f"--sft_ckpt={tmp_path / 'sft' / 'ckpt.pt'}", "--loss=grpo",
                          "--max_iters=3", "--eval_interval=3", "--prompts_per_step=8", "--group_size=4",
                          "--eval_samples=2", f"--out_dir={tmp_path / 'rl'}", "--threads=1"], **run)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert any("rl/turns" in r for r in rows) and "eval/turns" in rows[-1]
