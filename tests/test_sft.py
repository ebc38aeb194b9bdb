"""SFT smoke run, resume, sample.py, and the command-line error contract (one line, no traceback)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import sft
import tokenizer
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint
from nanorl.config import load_config
from nanorl.evaluate import Task

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
        assert 0 <= r["eval/accuracy"] <= 1 and r["eval/n"] == 810 and "val/accuracy" in r
        assert "eval/pass@2" in r and "eval/pass@8" not in r  # 2 samples per problem: pass@2, not a pass@8 label
    train = [r for r in rows(sft_run / "metrics.jsonl") if "train/loss" in r]
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in train)
    assert all(r["perf/tok_s"] > 0 for r in train)


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
    task = Task(tok, "mul", True, "exact", 0)
    x, y, m = sft.encode_split(task.gold_rows([("12*12=", "144"), ("10*10=", "100")]), tok.pad_id, "response")
    assert tok.decode(y[0][m[0].bool()].tolist()) == "441"  # reversed answer, then EOS
    assert y[0][m[0].bool()].tolist()[-1] == tok.eos_id  # EOS is a target
    _, _, m_all = sft.encode_split(task.gold_rows([("12*12=", "144")]), tok.pad_id, "all")
    assert m_all.sum() == 9


def cli(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


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


def test_micro_batches_accumulate_the_full_batch_gradient():
    """Gradient accumulation over uneven micro-batches (3+3+3+1 rows) equals one full-batch step,
    with rows of different target counts (a per-micro-batch mean would weight them wrongly)."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=32))
    x, y = torch.randint(0, 16, (10, 7)), torch.randint(0, 16, (10, 7))
    mask = (torch.arange(7) >= torch.randint(0, 7, (10, 1))).float()  # (10, 7) 1..7 targets per row
    grads = {}
    for mb in (10, 3, 1):
        model.zero_grad(set_to_none=True)
        loss = sft.accumulate_grads(model, x, y, mask, mb)
        grads[mb] = (loss, [p.grad.clone() for p in model.parameters()])
    full = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none")
    assert torch.allclose(grads[10][0], (full * mask.flatten()).sum() / mask.sum())  # mean over target tokens
    for mb in (3, 1):
        assert torch.allclose(grads[mb][0], grads[10][0], atol=1e-6)
        for a, b in zip(grads[mb][1], grads[10][1]):
            assert torch.allclose(a, b, atol=1e-6)


def toy_bpe(monkeypatch):
    """The test's tiny tiktoken Encoding, registered under the name "toy" for this test only."""
    import tiktoken
    from test_tokenizer import toy_encoding
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "toy", toy_encoding())
    return "toy"


BPE = dict(task="mul_text", reverse=False, block_size=32, max_new_tokens=6, batch_size=8, micro_batch_size=3,
           max_iters=2, eval_interval=2, eval_samples=0, n_layer=1, n_head=2, n_embd=32, threads=1)


def test_text_task_with_a_bpe_tokenizer_runs_two_steps(tmp_path, monkeypatch):
    sft.main(sft.Config(tokenizer=toy_bpe(monkeypatch), out_dir=str(tmp_path), **BPE))
    ckpt = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ckpt["step"] == 2 and ckpt["tokenizer"]["kind"] == "bpe" and ckpt["model_args"]["vocab_size"] == 260
    evals = [r for r in rows(tmp_path / "metrics.jsonl") if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2] and evals[0]["eval/n"] == 810
    assert evals[0]["eval/examples"][0]["prompt"].startswith("What is ")
    from nanorl.bpe import from_dict
    tok = from_dict(ckpt["tokenizer"])
    gold = Task(tok, "mul_text", False, "exact", 0).gold_rows([("What is 23 times 47?", "1081")])
    x, y, m = sft.encode_split(gold, tok.pad_id, "response")
    assert tok.decode(y[0][m[0].bool()].tolist()) == "1081" and y[0][m[0].bool()][-1] == tok.eos_id


def test_sft_from_hf_gpt2_weights(tmp_path, monkeypatch):
    """--init_from=<save_pretrained folder>: the run starts from exactly those weights."""
    import transformers
    from test_hf import tiny_hf
    hf = tiny_hf(tmp_path / "hf", n_layer=1, vocab_size=260, n_positions=32, bos_token_id=259, eos_token_id=259)
    cfg = sft.Config(tokenizer=toy_bpe(monkeypatch), init_from=str(tmp_path / "hf"), out_dir=str(tmp_path / "out"),
                     **{**BPE, "max_iters": 0, "n_layer": 4})  # n_layer etc. come from the HF model
    model = sft.main(cfg)
    assert model.config.n_layer == 1 and model.config.vocab_size == 260
    idx = torch.randint(0, 260, (2, 12))
    with torch.no_grad():
        assert (model.eval()(idx) - hf(idx).logits).abs().max() <= 1e-5
    with pytest.raises(sft.UserError, match="260 tokens, the tokenizer 'char' 16"):
        sft.main(sft.Config(**{**BPE, "task": "mul", "tokenizer": "char", "init_from": str(tmp_path / "hf")},
                            out_dir=str(tmp_path / "o2")))
    assert transformers  # a real dependency of this test (requirements-test.txt), never skipped


def test_gpt2_config_offline_fails_in_one_line_naming_the_file(tmp_path):
    """`python sft.py configs/gpt2_mul.py --max_iters=2` without the network (a proxy that refuses
    connections) and without cached BPE files: exit 2 and one line naming what it could not fetch."""
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    r = subprocess.run([sys.executable, "sft.py", "configs/gpt2_mul.py", "--max_iters=2", f"--out_dir={tmp_path}/o"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr
    assert err[0].startswith("error: could not fetch https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/")


def test_n_train_sees_only_its_labelled_problems_and_is_recorded(tmp_path, monkeypatch):
    from data.tasks import labelled, load_split
    seen = []
    encode = sft.encode_split
    monkeypatch.setattr(sft, "encode_split", lambda rows, *a: seen.append(rows) or encode(rows, *a))
    sft.main(sft.Config(max_iters=2, out_dir=str(tmp_path), n_train=50, **TINY))
    tok = tokenizer.from_dict(load_checkpoint(str(tmp_path / "ckpt.pt"))["tokenizer"])
    assert seen == [Task(tok, "mul", True, "exact", 0).gold_rows(labelled(load_split("mul", "train"), 50))]
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["config"]["n_train"] == 50
    with pytest.raises(sft.UserError, match="n_train=99999 but the train split holds"):
        sft.main(sft.Config(max_iters=2, out_dir=str(tmp_path), n_train=99999, **TINY))


CITIES = {"train": [("city 12?", "Paris"), ("city 34?", "Rome")], "val": [("city 56?", "Oslo")],
          "test": [("city 78?", "Bern")]}


@pytest.mark.parametrize("task, flags, want", [
    ("mul", [], True), ("cities", [], False), ("cities", ["--reverse=true"], True),
    ("rg:chain_sum", ['--rg={"max_terms": 2, "max_digits": 2}', "--block_size=80"], False),
    ("env:guess", ["--block_size=48", "--max_new_tokens=40"], False)])
def test_reverse_defaults_to_the_tasks_and_the_checkpoint_stores_it(tmp_path, task, flags, want):
    """Only the built-in arithmetic tasks reverse by default: a folder's answer "Paris" trained
    reversed would be "siraP", and the digits in its prompts flipped. The command line wins."""
    if task == "cities":
        task = str(tmp_path / "cities")
        os.mkdir(task)
        for split, problems in CITIES.items():
            with open(os.path.join(task, f"{split}.jsonl"), "w") as f:
                f.writelines(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in problems)
        flags = flags + ["--verifier=text"]
    tiny = [f"--{k}={v}" for k, v in {**TINY, "eval_samples": 0, "max_iters": 0}.items()]
    cfg = load_config(sft.Config, [f"--task={task}", *flags, *tiny, f"--out_dir={tmp_path / 'o'}"])
    sft.main(cfg)
    path = str(tmp_path / "o" / "ckpt.pt")
    ckpt = load_checkpoint(path)
    assert ckpt["config"]["reverse"] is want
    if task.endswith("cities"):  # what the model reads and writes
        t = Task.of(ckpt, path, model_from_checkpoint(ckpt, path)[1])
        prompt, answer = t.gold_rows(t.train[:1])[0]
        assert (t.tok.decode(prompt), t.tok.decode(answer[:-1])) == \
            (("city 21?", "siraP") if want else ("city 12?", "Paris"))
