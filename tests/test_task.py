"""Bring your own task: a folder of `prompt=answer` files plus a verifier named on the command line,
through sft.py, rl.py and sample.py (docs/guides.md's guide, run for real on a tiny model)."""
import itertools
import json
import random
import re
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
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "accuracy 1.0000 (4/4)" in r.stderr


def test_own_task_errors(tmp_path):
    task = write_task(tmp_path / "letters")
    (task / "val.txt").unlink()
    with pytest.raises(DataError, match="lacks val.jsonl"):
        sft.main(sft.Config(task=str(task), out_dir=str(tmp_path / "o")))
    with pytest.raises(DataError, match="or a folder of train, val, test .jsonl or .txt"):
        sft.main(sft.Config(task=str(tmp_path / "nowhere"), out_dir=str(tmp_path / "o")))
    with pytest.raises(UserError, match="unknown verifier 'nope'; valid: exact, final, text"):
        sft.main(sft.Config(verifier="nope", out_dir=str(tmp_path / "o")))


# ---------------------------------------------------------------- JSONL tasks


def write_jsonl(folder, rows_of):
    folder.mkdir()
    for split in ("train", "val", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of(split)))
    return folder


def reverse_rows(split):
    """Prompts with '=' and newlines; answer or ground_truth: the word reversed."""
    words = {"train": ["ab", "ba", "abc", "cab", "bca", "aab"], "val": ["cba"], "test": ["acb", "bac"]}[split]
    return [{"prompt": f"rev=\n{w}=", ("answer" if i % 2 else "ground_truth"): w[::-1]} for i, w in enumerate(words)]


def test_a_jsonl_task_through_sft_rl_and_sample(tmp_path):
    """A prompt may hold any character, '=' and newlines included; ground_truth names the answer
    too; the char tokenizer's alphabet comes from the files."""
    from data.tasks import load_split
    task = write_jsonl(tmp_path / "rev", reverse_rows)
    assert load_split(str(task), "train")[:2] == [("rev=\nab=", "ba"), ("rev=\nba=", "ab")]
    out = tmp_path / "sft"
    sft.main(sft.Config(task=str(task), reverse=False, verifier="text", out_dir=str(out), block_size=24,
                        **{**TINY_SFT, "max_iters": 20, "batch_size": 8, "eval_interval": 20}))
    assert {"\n", "="} <= set(load_checkpoint(str(out / "ckpt.pt"))["tokenizer"]["chars"])
    rl.main(rl.Config(sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "rl"), loss="grpo", max_iters=1,
                      eval_interval=1, prompts_per_step=2, group_size=4, eval_samples=2, threads=1))
    r = subprocess.run([sys.executable, "sample.py", f"--ckpt={out / 'ckpt.pt'}", "--split=test"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "accuracy" in r.stderr and r.stdout.count("rev=") == 2


def test_an_empty_or_missing_jsonl_split_is_refused_at_load(tmp_path):
    """Every split needs a problem (an empty one would divide its evals by 0): one line each."""
    task = write_jsonl(tmp_path / "rev", reverse_rows)
    (task / "val.jsonl").write_text("\n")
    cfg = dict(task=str(task), verifier="text", out_dir=str(tmp_path / "o"))
    with pytest.raises(DataError, match=r"rev/val.jsonl: no problems in file$"):
        sft.main(sft.Config(**cfg))
    (task / "val.jsonl").unlink()
    with pytest.raises(DataError, match=r"rev lacks val.jsonl\)$"):
        sft.main(sft.Config(**cfg))


@pytest.mark.parametrize("line, match", [
    ('{"prompt": "a", "answer": "b"', r"train.jsonl:2: not valid JSON"),
    ('["a", "b"]', r"train.jsonl:2: expected a JSON object"),
    ('{"answer": "b"}', r"train.jsonl:2: field 'prompt' missing or not a string"),
    ('{"prompt": "a"}', r"train.jsonl:2: field 'answer' missing or not a string"),
    ('{"prompt": "a", "answer": 3}', r"train.jsonl:2: field 'answer' missing or not a string"),
    ('{"prompt": ["a"], "answer": "b"}', r"train.jsonl:2: field 'prompt' missing or not a string"),
    ('{"prompt": "", "answer": "b"}', r"train.jsonl:2: field 'prompt' is empty"),
    ('{"prompt": "a", "answer": ""}', r"train.jsonl:2: field 'answer' is empty"),
])
def test_a_bad_jsonl_line_is_one_error_naming_file_and_line(tmp_path, line, match):
    from data.tasks import load_split
    task = write_jsonl(tmp_path / "bad", reverse_rows)
    good = (task / "train.jsonl").read_text().splitlines()[0]
    (task / "train.jsonl").write_text(f"{good}\n{line}\n")
    with pytest.raises(DataError, match=match):
        load_split(str(task), "train")


def test_a_character_outside_the_checkpoints_tokenizer_names_file_and_line(tmp_path):
    """The files changed after SFT: rl.py reads them with the checkpoint's alphabet."""
    task = write_jsonl(tmp_path / "rev", reverse_rows)
    out = tmp_path / "sft"
    sft.main(sft.Config(task=str(task), reverse=False, verifier="text", out_dir=str(out), block_size=24,
                        **{**TINY_SFT, "max_iters": 2, "eval_interval": 2}))
    with open(task / "val.jsonl", "a") as f:
        f.write(json.dumps({"prompt": "rev=\nxyz=", "answer": "zyx"}) + "\n")
    with pytest.raises(DataError, match=r"val.jsonl:2: field 'prompt' has character 'x', not in the task alphabet"):
        rl.main(rl.Config(sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "rl"), max_iters=1))


def test_block_size_and_max_new_tokens_that_do_not_fit_say_what_to_set(tmp_path):
    task = write_jsonl(tmp_path / "rev", reverse_rows)
    base = dict(task=str(task), reverse=False, verifier="text", out_dir=str(tmp_path / "o"), max_iters=1)
    with pytest.raises(UserError, match=r"block_size=12 does not fit .*longest prompt \(9 tokens\) and "
                                        r"max_new_tokens=8: set --block_size=17"):
        sft.main(sft.Config(block_size=12, **base))
    with pytest.raises(UserError, match=r"max_new_tokens=2 cuts .*longest answer \(4 tokens with EOS\): "
                                        r"set --max_new_tokens=4"):
        sft.main(sft.Config(block_size=16, max_new_tokens=2, **base))


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])
def test_a_raw_line_separator_inside_a_json_string_is_valid_jsonl(tmp_path, sep):
    """json.dumps(..., ensure_ascii=False) writes them raw; CRLF line ends are fine too."""
    from data.tasks import load_split
    task = write_jsonl(tmp_path / "sep", reverse_rows)
    rows = [{"prompt": f"rev{sep}ab=", "answer": "ba"}, {"prompt": "rev=\nbc=", "answer": "cb"}]
    (task / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows),
                                      encoding="utf-8", newline="")
    assert load_split(str(task), "train") == [(f"rev{sep}ab=", "ba"), ("rev=\nbc=", "cb")]


def number_rows(golds):
    """A folder whose train line 2 holds the gold answer `golds`: the rest canonical integers."""
    return lambda split: ([{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": golds}]
                          if split == "train" else [{"prompt": "3+4=", "answer": "7"}])


@pytest.mark.parametrize("gold", ["x", " 4", "04", "+4", "4.0", "1,000"])
def test_a_gold_answer_the_verifier_cannot_accept_stops_the_load(tmp_path, gold):
    """The default verifier takes canonical integers: a gold answer it scores 0, written as the model
    writes it, stops sft.py naming file:line and the verifier that takes it; with that one it trains."""
    task = write_jsonl(tmp_path / "golds", number_rows(gold))
    base = dict(task=str(task), out_dir=str(tmp_path / "o"), **{**TINY_SFT, "max_iters": 1, "eval_interval": 1})
    with pytest.raises(DataError, match=rf"train.jsonl:2: gold answer {re.escape(repr(gold))} scores 0 under the "
                                        r"verifier 'exact': use --verifier=text$"):
        sft.main(sft.Config(**base))
    sft.main(sft.Config(verifier="text", **base))


def test_rl_checks_the_gold_answers_of_files_changed_after_sft(tmp_path):
    task = write_jsonl(tmp_path / "nums", number_rows("4"))
    out = tmp_path / "sft"
    sft.main(sft.Config(task=str(task), out_dir=str(out), **{**TINY_SFT, "max_iters": 1, "eval_interval": 1}))
    with open(task / "val.jsonl", "a") as f:
        f.write(json.dumps({"prompt": "9+9=", "answer": "018"}) + "\n")
    with pytest.raises(DataError, match=r"val.jsonl:2: gold answer '018' scores 0 under the verifier 'exact'"):
        rl.main(rl.Config(sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "rl"), max_iters=1))


@pytest.mark.parametrize("reverse", [False, True])
def test_an_answer_keeps_its_surrounding_spaces(tmp_path, reverse):
    """JSONL strings are taken verbatim: the gold ' ab ' is what the model must write, and the text
    verifier gives it 1 (so the load-time check passes) whatever the digit order."""
    from data.tasks import load_split
    from nanorl.evaluate import Task
    task = write_jsonl(tmp_path / "spaces", lambda split: [{"prompt": "w=", "answer": " ab "},
                                                           {"prompt": "v=", "answer": "b a"}])
    assert load_split(str(task), "train") == [("w=", " ab "), ("v=", "b a")]
    out = tmp_path / "sft"
    sft.main(sft.Config(task=str(task), reverse=reverse, verifier="text", out_dir=str(out),
                        **{**TINY_SFT, "max_iters": 1, "eval_interval": 1}))
    ck = load_checkpoint(str(out / "ckpt.pt"))
    from nanorl.checkpoint import model_from_checkpoint
    tok = model_from_checkpoint(ck, str(out / "ckpt.pt"))[1]
    t = Task.of(ck, str(out / "ckpt.pt"), tok)
    ids = [r for _, r in t.gold_rows(t.train)]
    assert [t.score(r, None, p) for r, p in zip(ids, t.train)] == [1.0, 1.0]
    assert t.score(tok.encode("ab") + [tok.eos_id], None, t.train[0]) == 0.0


def test_val_and_test_prompts_that_reorder_a_train_prompt_get_one_warning(tmp_path, capsys):
    """The key of rg: splits (its numbers and words, sorted) as a check on your own folder: a
    reordering, a respacing and an exact duplicate of train prompts are counted in one warning."""
    rows = {"train": ["3+4=", "10+2="], "val": ["4+3="], "test": ["3 + 4=", "10+2=", "5+5="]}
    task = write_jsonl(tmp_path / "near", lambda split: [{"prompt": p, "answer": "1"} for p in rows[split]])
    sft.main(sft.Config(task=str(task), out_dir=str(tmp_path / "o"), **{**TINY_SFT, "max_iters": 1, "eval_interval": 1}))
    out = capsys.readouterr().out
    assert out.count("warning:") == 1 and "3 val/test prompts have a train prompt" in out
    assert "e.g. '4+3=' and '3+4='" in out
