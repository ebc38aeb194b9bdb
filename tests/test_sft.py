"""SFT smoke run, resume, sample.py, and the command-line error contract (one line, no traceback)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import sft
from model import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(n_layer=1, n_head=2, n_embd=32, batch_size=32, warmup_iters=5, eval_interval=15,
            eval_samples=2, threads=1)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    sft.main(sft.Config(max_iters=30, out_dir=str(out), **TINY))
    return out


def rows(path):
    return [json.loads(l) for l in open(path)]


def test_smoke_run_writes_checkpoint_and_metrics(sft_run):
    ckpt = load_checkpoint(str(sft_run / "ckpt.pt"))
    assert ckpt["step"] == 30 and ckpt["config"]["max_iters"] == 30
    assert os.path.exists(sft_run / "best.pt")
    evals = [r for r in rows(sft_run / "metrics.jsonl") if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 15, 30]
    for r in evals:
        assert 0 <= r["eval/accuracy"] <= 1 and r["eval/n"] == 810 and "eval/pass@8" in r and "val/accuracy" in r
    train = [r for r in rows(sft_run / "metrics.jsonl") if "train/loss" in r]
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in train)
    assert all(0 < r["perf/mfu"] < 1 and r["perf/tok_s"] > 0 for r in train)  # MFU against a measured matmul peak


def test_loss_decreases_on_a_tiny_budget(tmp_path):
    cfg = sft.Config(max_iters=150, lr=5e-3, out_dir=str(tmp_path), **{**TINY, "eval_interval": 200, "eval_samples": 0, "log_interval": 10})
    sft.main(cfg)
    losses = [r["train/loss"] for r in rows(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert losses[-1] < 0.8 * losses[0]


def test_resume_continues_without_duplicate_rows(tmp_path):
    cfg = dict(out_dir=str(tmp_path), **{**TINY, "eval_samples": 0})
    sft.main(sft.Config(max_iters=15, **cfg))
    sft.main(sft.Config(max_iters=30, resume=True, **cfg))
    steps = [(r["step"], "eval/accuracy" in r) for r in rows(tmp_path / "metrics.jsonl")]
    assert len(steps) == len(set(steps))  # nothing logged twice
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 30


def test_encode_split_masks_answer_and_eos():
    from data.tasks import ALPHABET
    from tokenizer import CharTokenizer
    tok = CharTokenizer(ALPHABET)
    x, y, m = sft.encode_split(tok, [("12*12=", "144"), ("10*10=", "100")], True, 32, "response")
    assert tok.decode(y[0][m[0].bool()].tolist()) == "441"  # reversed answer, then EOS
    assert y[0][m[0].bool()].tolist()[-1] == tok.eos_id  # EOS is a target
    _, _, m_all = sft.encode_split(tok, [("12*12=", "144")], True, 32, "all")
    assert m_all.sum() == 9


def cli(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_sample_cli_and_accuracy_agrees(sft_run, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\ufeff12*34=408\r\n\r\n56*78=4368\n")
    r = cli("sample.py", f"--ckpt={sft_run}/ckpt.pt", f"--prompts_file={prompts}", "--num_samples=2",
            "--temperature=1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("12*34=") and lines[2].startswith("56*78=")
    assert "accuracy" in r.stderr
    r = cli("sample.py", f"--ckpt={sft_run}/ckpt.pt", "--prompt=12*34=")
    assert r.returncode == 0 and r.stdout.startswith("12*34=")


@pytest.mark.parametrize("args,msg", [
    (["sample.py", "--ckpt=nowhere.pt", "--prompt=1*2="], "nowhere.pt: no such checkpoint"),
    (["sample.py", "--ckpt={ckpt}", "--prompt=12x3="], "character 'x'"),
    (["sample.py", "--ckpt={ckpt}", "--prompt=" + "1" * 40], "--prompt:1: a prompt of 40 tokens + max_new_tokens=8 does not fit the context window"),
    (["sft.py", "--lrr=1"], "unknown config key 'lrr' (did you mean 'lr'?)"),
])
def test_bad_input_exits_with_one_line(sft_run, args, msg):
    r = cli(*[a.format(ckpt=sft_run / "ckpt.pt") for a in args])
    assert r.returncode != 0
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_wandb_offline_run_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sft.main(sft.Config(max_iters=5, out_dir=str(tmp_path), wandb=True, **{**TINY, "eval_interval": 5, "eval_samples": 0}))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))  # the run's event log, ready for `wandb sync`


def test_prompts_file_names_the_over_long_line(sft_run, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("12*34=\n\n" + "1" * 30 + "*2=\n")
    r = cli("sample.py", f"--ckpt={sft_run}/ckpt.pt", f"--prompts_file={f}")
    assert r.returncode == 2 and f"{f}:3: a prompt of 33 tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1
