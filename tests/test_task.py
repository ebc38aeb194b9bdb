"""Bring your own task: a folder of `prompt=answer` files plus a verifier named on the command line,
through sft.py, rl.py and sample.py (docs/guides.md's guide, run for real on a tiny model)."""
import itertools
import json
import random
import subprocess
import sys

import pytest

import rl
import sft
from nanorl.config import UserError
from data.tasks import DataError
from nanorl.checkpoint import load_checkpoint

from test_rl import ROOT, TINY_SFT


def write_task(folder):
    """Answer = the first letter of a 3-letter word over 'xyz' (not an integer: needs --verifier=text)."""
    words = ["".join(w) for w in itertools.product("xyz", repeat=3)]
    random.Random(0).shuffle(words)
    folder.mkdir()
    for split, ws in (("train", words[:19]), ("val", words[19:23]), ("test", words[23:])):
        (folder / f"{split}.txt").write_text("".join(f"{w}={w[0]}\n" for w in ws))
    return folder


def test_own_task_folder_and_verifier_through_sft_rl_and_sample(tmp_path):
    task = write_task(tmp_path / "letters")
    out = tmp_path / "sft"
    sft.main(sft.Config(task=str(task), reverse=False, verifier="text", out_dir=str(out),
                        **{**TINY_SFT, "max_iters": 150, "batch_size": 32, "eval_interval": 150}))
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["config"]["verifier"] == "text" and set("xyz") <= set(ckpt["tokenizer"]["chars"])
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if "eval/accuracy" in line]
    assert evals[-1]["eval/accuracy"] == 1.0 and evals[-1]["eval/n"] == 4  # "x" scores 0 under the integer verifier

    res = rl.main(rl.Config(sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "rl"), loss="grpo", max_iters=1,
                            eval_interval=1, prompts_per_step=2, group_size=4, eval_samples=2, threads=1))
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert res["metrics"]["eval/accuracy"] == 1.0 and [r for r in rows if "rl/accuracy" in r][0]["rl/accuracy"] > 0.5

    r = subprocess.run([sys.executable, "sample.py", f"--ckpt={out / 'ckpt.pt'}", f"--prompts_file={task / 'test.txt'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "accuracy 1.0000 (4/4)" in r.stderr


def test_own_task_errors(tmp_path):
    task = write_task(tmp_path / "letters")
    (task / "val.txt").unlink()
    with pytest.raises(DataError, match="lacks val.txt"):
        sft.main(sft.Config(task=str(task), out_dir=str(tmp_path / "o")))
    with pytest.raises(DataError, match="or a folder holding train.txt, val.txt, test.txt"):
        sft.main(sft.Config(task=str(tmp_path / "nowhere"), out_dir=str(tmp_path / "o")))
    with pytest.raises(UserError, match="unknown verifier 'nope'; valid: exact, final, text"):
        sft.main(sft.Config(verifier="nope", out_dir=str(tmp_path / "o")))
