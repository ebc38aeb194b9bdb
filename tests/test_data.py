"""Task data: splits disjoint by unordered operand pair, seeded, files in the documented formats."""
import json
import random

import pytest

from data.tasks import (ALPHABET, DataError, compute, ensure_data, format_answer, labelled,
                        load_problems, load_split, parse_answer, problems_of, split_pairs, text_prompt)
from nanorl.pref import WRONG_KINDS, ensure_pairs, wrong_answer


@pytest.mark.parametrize("task", ["mul", "add"])
def test_splits_are_disjoint_by_unordered_pair(task):
    s = split_pairs(task)
    sets = {k: {frozenset(p) for p in v} for k, v in s.items()}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"]) and not (sets["val"] & sets["test"])
    assert split_pairs(task) == s  # seeded
    train_problems = {p for p, _ in problems_of(s["train"], "*")}
    for a, b in s["test"][:200]:  # neither order of a held-out pair is ever trained on
        assert f"{a}*{b}=" not in train_problems and f"{b}*{a}=" not in train_problems


def test_mul_covers_every_pair_once_and_holds_out_only_two_digit_problems():
    s = split_pairs("mul")
    two_digit = [p for v in s.values() for p in v if min(p) >= 10]
    assert len(two_digit) == len(set(two_digit)) == 90 * 91 // 2
    assert abs(len(s["test"]) / len(two_digit) - 0.1) < 0.01
    assert all(min(p) >= 10 for p in s["val"] + s["test"])  # the curriculum (7*46) is train-only
    assert {(a, b) for a, b in s["train"] if a < 10} == {(a, b) for a in range(10) for b in range(a, 100)}


def test_files_written_and_parsed(tmp_path):
    root = ensure_pairs("mul", data_dir=tmp_path)  # the splits, then the preference files
    test = load_problems(root / "test.txt")
    assert all(compute("*", *map(int, p[:-1].split("*"))) == int(a) for p, a in test)
    assert (root / "test.txt").read_text().splitlines()[0].count("=") == 1
    pairs = [json.loads(l) for l in open(root / "pairs_train.jsonl")]
    assert {p["kind"] for p in pairs} == set(WRONG_KINDS)
    assert all(p["chosen"] != p["rejected"] and (p["rejected"] == "0" or p["rejected"][0] != "0") for p in pairs)
    kto = [json.loads(l) for l in open(root / "kto_train.jsonl")]
    assert {k["label"] for k in kto} == {True, False}
    assert ensure_data("mul", data_dir=tmp_path) == root == ensure_pairs("mul", data_dir=tmp_path)


def test_wrong_answers_are_wrong():
    rng = random.Random(0)
    for kind in WRONG_KINDS:
        for a, b in [(10, 10), (23, 47), (99, 99), (11, 91)]:
            w = wrong_answer(kind, a, b, "*", rng)
            assert w != str(a * b) and all(c in "0123456789" for c in w)


def test_answer_format_round_trip():
    assert format_answer("1081", True) == "1801" and parse_answer("1801", True) == "1081"
    assert format_answer("1081", False) == "1081"


def test_problem_files_bad_lines(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes("\ufeff12*12=144\r\n\r\n13*13=169\n".encode())  # BOM, CRLF, blank line: fine
    assert load_problems(f) == [("12*12=", "144"), ("13*13=", "169")]
    f.write_text("12*12=144\n12x12=144\n")
    with pytest.raises(DataError, match=r"p.txt:2: character 'x'"):
        load_problems(f)
    f.write_text("12*12\n")
    with pytest.raises(DataError, match=r"p.txt:1: expected one"):
        load_problems(f)
    f.write_text("\n")
    with pytest.raises(DataError, match="no problems"):
        load_problems(f)
    assert set(ALPHABET) >= set("0123456789*+=")


@pytest.mark.parametrize("prompt,text", [("23*47=", "What is 23 times 47?"), ("7*46=", "What is 7 times 46?"),
                                         ("123+456=", "What is 123 plus 456?")])
def test_text_prompts(prompt, text):
    assert text_prompt(prompt) == text


def test_text_task_has_mul_problems_in_words():
    words, symbols = load_split("mul_text", "test"), load_split("mul", "test")
    assert [(text_prompt(p), a) for p, a in symbols] == words  # same problems, same split, same order
    assert any(("What is 23 times 47?", "1081") in load_split("mul_text", s) for s in ("train", "val", "test"))
    with pytest.raises(DataError, match="cannot word the prompt"):
        text_prompt("23x47=")


def test_labelled_problems_are_a_seeded_nested_subset():
    train = load_split("mul", "train")
    few, more = labelled(train, 100), labelled(train, 400)
    assert len(few) == 100 and len(set(few)) == 100 and few == more[:100]  # nested
    assert few == labelled(list(train), 100) and few != train[:100]  # seeded, shuffled
    assert labelled(train, 0) == train
