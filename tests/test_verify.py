"""Verifiers: reference tables, digit rules, huge numbers, fuzzing that they never raise."""
import time

import pytest
from hypothesis import given, settings, strategies as st

from nanorl.cliff import first_wrong_token
from verify import VERIFIERS, exact_answer, final_answer, overlong_penalty

FUZZ = settings(max_examples=2000, deadline=None, derandomize=True)
SMALL = settings(max_examples=300, deadline=None, derandomize=True)

# ---------------------------------------------------------------- exact_answer, normal order

@pytest.mark.parametrize("completion, gold, want", [
    ("1081", "1081", 1.0),
    ("1080", "1081", 0.0),
    ("108", "1081", 0.0),
    ("10810", "1081", 0.0),
    ("1801", "1081", 0.0),                      # reversed text in normal mode
    ("0", "0", 1.0),                            # "0" itself is fine
    ("00", "0", 0.0),
    ("0012", "12", 0.0),                        # leading zeros are wrong
    ("012", "12", 0.0),
    ("-12", "-12", 1.0),                        # negatives
    ("12", "-12", 0.0),
    ("-12", "12", 0.0),
    ("-012", "-12", 0.0),
    ("-0", "0", 0.0),
    ("+12", "12", 0.0),                         # no '+' in the exact format
    ("--12", "-12", 0.0),
    ("", "12", 0.0),                            # empty
    ("", "", 0.0),                              # empty gold matches nothing
    ("1081 ", "1081", 0.0),                     # whitespace / extra text
    (" 1081", "1081", 0.0),
    ("1081\n", "1081", 0.0),
    ("10 81", "1081", 0.0),
    ("1081x", "1081", 0.0),
    ("=1081", "1081", 0.0),
    ("1,081", "1081", 0.0),
    ("1081.0", "1081", 0.0),
    ("١٢", "12", 0.0),                          # Arabic-Indic digits
    ("１２", "12", 0.0),                        # fullwidth digits
    ("12", "１２", 0.0),                        # unicode gold matches nothing
    ("²", "2", 0.0),                            # superscript (str.isdigit() is True for it)
    ("012", "012", 0.0),                        # non-canonical gold matches nothing
    ("12", 12, 1.0),                            # int gold accepted
    (None, "12", 0.0),                          # non-str input: 0, no exception
    ("12", None, 0.0),
])
def test_exact_answer(completion, gold, want):
    assert exact_answer(completion, gold) == want


# ---------------------------------------------------------------- exact_answer, reversed format

@pytest.mark.parametrize("completion, gold, want", [
    ("1801", "1081", 1.0),                      # 1081 written least-significant digit first
    ("1081", "1081", 0.0),
    ("21", "12", 1.0),                          # "21" -> "12"
    ("2100", "12", 0.0),                        # -> "0012": leading zeros
    ("0021", "12", 0.0),                        # -> "1200"
    ("0", "0", 1.0),
    ("00", "0", 0.0),
    ("7", "7", 1.0),
    ("21-", "-12", 1.0),                        # the whole string is reversed: "-12" is written "21-"
    ("-21", "-12", 0.0),                        # -> "12-"
    ("0-", "0", 0.0),                           # -> "-0"
    ("210-", "-12", 0.0),                       # -> "-012"
    ("1801 ", "1081", 0.0),
    (" 1801", "1081", 0.0),
    ("", "0", 0.0),
    ("١٢", "21", 0.0),
])
def test_exact_answer_reversed(completion, gold, want):
    assert exact_answer(completion, gold, reverse=True) == want


def test_huge_numbers_compare_as_strings():
    # 5,000 digits: int() of this raises on Python >= 3.11 (4,300-digit limit), so passing proves no int().
    gold = "9" + "1234567890" * 499 + "123456789"
    assert len(gold) == 5000
    wrong = gold[:-1] + "0"
    t = time.perf_counter()
    assert exact_answer(gold, gold) == 1.0
    assert exact_answer(wrong, gold) == 0.0
    assert exact_answer(gold[::-1], gold, reverse=True) == 1.0
    assert exact_answer(wrong[::-1], gold, reverse=True) == 0.0
    assert exact_answer("0" + gold, "0" + gold) == 0.0
    assert final_answer(f"work <final>{gold}</final>", gold) == 1.0
    assert final_answer(f"<final>{wrong}</final>", gold) == 0.0
    assert final_answer(f"<final>{gold}</final>", 10 ** 5000) == 0.0  # str() of this int refuses: 0, no raise
    assert exact_answer("1" * 1_000_000, "1" * 1_000_000) == 1.0
    assert time.perf_counter() - t < 1.0


# ---------------------------------------------------------------- final_answer

@pytest.mark.parametrize("completion, gold, want", [
    ("3+4=7 <final>7</final>", "12", 0.0),      # reference values
    ("3*4=12 <final>12</final>", "12", 1.0),
    ("<final>12</final>", "12", 1.0),
    ("3*4=14 <final>14</final>", "12", 0.0),
    ("<final>12</final> done.", "12", 1.0),     # text outside the tag is free
    ("12", "12", 0.0),                          # no tag
    ("<final>12</final><final>12</final>", "12", 0.0),     # two tags
    ("<final>7</final> <final>12</final>", "12", 0.0),
    ("<final><final>12</final></final>", "12", 0.0),       # nested
    ("<final>12<final>12</final></final>", "12", 0.0),
    ("<final>12", "12", 0.0),                   # unclosed
    ("12</final>", "12", 0.0),                  # no opener
    ("</final>12<final>", "12", 0.0),           # out of order
    ("<final>12</final></final>", "12", 0.0),   # stray closer
    ("<final></final>", "12", 0.0),             # empty
    ("<final> 12</final>", "12", 0.0),          # no spaces inside
    ("<final>12 </final>", "12", 0.0),
    ("<final>1 2</final>", "12", 0.0),
    ("<final>012</final>", "12", 0.0),          # leading zero
    ("<final>+12</final>", "12", 1.0),          # optional '+'
    ("<final>-12</final>", "-12", 1.0),
    ("<final>-12</final>", "12", 0.0),
    ("<final>+-12</final>", "-12", 0.0),
    ("<final>0</final>", "0", 1.0),
    ("<final>-0</final>", "0", 0.0),
    ("<final>+0</final>", "0", 1.0),
    ("<final>١٢</final>", "12", 0.0),           # unicode digits
    ("<final>１２</final>", "12", 0.0),
    ("<FINAL>12</FINAL>", "12", 0.0),           # case-sensitive
    ("<final >12</final>", "12", 0.0),
    ("<final>12.0</final>", "12", 0.0),
    ("", "12", 0.0),
    (None, "12", 0.0),
])
def test_final_answer(completion, gold, want):
    assert final_answer(completion, gold) == want


def test_registry():
    assert VERIFIERS["exact"]("1801", "1081", reverse=True) == 1.0
    assert VERIFIERS["final"]("<final>1081</final>", "1081", reverse=True) == 1.0  # final ignores reverse
    assert VERIFIERS["text"]("ab c", "ab c") == 1.0 and VERIFIERS["text"]("c ba", "ab c", reverse=True) == 1.0
    assert VERIFIERS["text"]("ab", "ab ") == 0.0 and VERIFIERS["text"](None, "ab") == 0.0
    assert set(VERIFIERS) == {"exact", "final", "text"}


# ---------------------------------------------------------------- first_wrong_token

EOS = 99
GOLD = [1, 0, 8, 1, EOS]                        # "1081" + EOS in emitted order


@pytest.mark.parametrize("response, gold, want", [
    (GOLD, GOLD, None),                         # correct
    ([1, 0, 8, 2, EOS], GOLD, 3),               # wrong digit
    ([2, 0, 8, 1, EOS], GOLD, 0),
    ([1, 0, 8, EOS], GOLD, 3),                  # early EOS
    ([1, 0, 8, 1, 5], GOLD, 4),                 # a digit where EOS belongs (missing EOS)
    ([1, 0, 8, 1, 7, EOS], GOLD, 4),            # one digit too many
    ([1, 0, 8, 1], GOLD, 3),                    # truncated strict prefix: blame the last emitted token
    ([1], GOLD, 0),
    ([], GOLD, 0),                              # empty response
    ([1, 0, 8, 1, EOS, 5], GOLD, 5),            # tokens after a correct EOS: the first extra one
    ([], [], None),
    ([3], [], 0),
    ([1, 8, 0, 1, EOS], [1, 8, 0, 1, EOS], None),  # reversed format: caller passes reversed gold
    ((1, 0, 8, 2, EOS), tuple(GOLD), 3),        # any sequence
])
def test_first_wrong_token(response, gold, want):
    assert first_wrong_token(response, gold) == want


@SMALL
@given(st.lists(st.integers(0, 5), max_size=8), st.lists(st.integers(0, 5), max_size=8))
def test_first_wrong_token_properties(response, gold):
    i = first_wrong_token(response, gold)
    if response == gold:
        assert i is None
    else:
        assert i is not None and response[:i] == gold[:i]   # everything before it is right
        assert 0 <= i < max(len(response), 1)               # it points into the response (0 if empty)


# ---------------------------------------------------------------- overlong_penalty

@pytest.mark.parametrize("length, max_new, window, want", [
    (0, 20, 4, 0.0),
    (10, 20, 4, 0.0),
    (16, 20, 4, 0.0),                           # reference values
    (17, 20, 4, -0.25),
    (18, 20, 4, -0.5),
    (19, 20, 4, -0.75),
    (20, 20, 4, -1.0),
    (25, 20, 4, -1.0),
    (20, 20, 0, 0.0),                           # window <= 0: no soft band
    (21, 20, 0, -1.0),
    (21, 20, -3, -1.0),
    (5, 20, 20, -0.25),
])
def test_overlong_penalty(length, max_new, window, want):
    got = overlong_penalty(length, max_new, window)
    assert got == pytest.approx(want) and isinstance(got, float)
    assert str(got) != "-0.0"


# ---------------------------------------------------------------- fuzz: total, binary, never rewards wrong

golds = st.one_of(st.integers(-10**6, 10**12).map(str), st.text(max_size=6))
number_like = st.text(alphabet="0123456789-+ x\n١٢０<>/final", max_size=12)  # dense in near-misses
texts = st.one_of(st.text(), number_like)


@FUZZ
@given(texts, golds, st.booleans())
def test_exact_answer_fuzz(text, gold, reverse):
    r = exact_answer(text, gold, reverse=reverse)
    assert r in (0.0, 1.0)
    if r == 1.0:                                # rewarded only for the gold string itself
        assert (text[::-1] if reverse else text) == gold


@SMALL
@given(st.integers(-10**30, 10**30), st.booleans())
def test_exact_answer_accepts_gold(n, reverse):
    gold = str(n)
    assert exact_answer(gold[::-1] if reverse else gold, gold, reverse=reverse) == 1.0
    assert exact_answer("0" + gold.lstrip("-"), gold.lstrip("-")) == 0.0  # leading zero


PIECES = ["<final>", "</final>", "12", "1", "2", "0", "-", "+", " ", "x", "=", "<final", "/final>"]
tag_soup = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)


@FUZZ
@given(st.one_of(st.text(), tag_soup, st.builds(lambda a, b: a + "<final>" + b, st.text(), tag_soup)), golds)
def test_final_answer_fuzz(text, gold):
    r = final_answer(text, gold)
    assert r in (0.0, 1.0)
    if r == 1.0:                                # exactly one well-formed tag holding the gold value
        assert text.count("<final>") == 1 and text.count("</final>") == 1
        inside = text.split("<final>")[1].split("</final>")[0]
        assert inside in (gold, "+" + gold)


no_tags = st.text(max_size=20).filter(lambda s: "<final>" not in s and "</final>" not in s)


@SMALL
@given(no_tags, no_tags, st.integers(-10**20, 10**20))
def test_final_answer_accepts_one_tag_anywhere(before, after, n):
    text = before + f"<final>{n}</final>" + after
    if text.count("<final>") == 1 and text.count("</final>") == 1:  # the glue did not make a second tag
        assert final_answer(text, str(n)) == 1.0
        assert final_answer(text, str(n + 1)) == 0.0
        assert final_answer(text + "<final>", str(n)) == 0.0


# ---------------------------------------------------------------- grading sampled token ids

def char_and_bpe(alphabet):
    """A char tokenizer over `alphabet` and a tiny BPE with two specials (end-of-text, and one more)."""
    import tiktoken
    from nanorl.bpe import BPETokenizer
    from tokenizer import CharTokenizer
    ranks = {bytes([i]): i for i in range(256)}
    enc = tiktoken.Encoding("toy2", pat_str=r"\d| ?[a-zA-Z]+| ?[^\sa-zA-Z\d]+|\s+", mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 256, "<|fim|>": 257})
    return CharTokenizer(alphabet), BPETokenizer(enc)


@pytest.mark.parametrize("name, text, gold", [("exact", "1081", "1081"), ("final", "<final>12</final>", "12"),
                                              ("text", "a1", "a1")])
def test_a_special_token_before_eos_makes_any_answer_wrong(name, text, gold):
    """decode drops PAD (and BPE specials), so '10<pad>81' would read as '1081': the verifier must see
    what was sampled. Every special token at every position before the final EOS scores 0."""
    from nanorl.evaluate import Task
    for tok in char_and_bpe("".join(sorted(set(text)))):
        ids, score = tok.encode(text), Task(tok, "mul", False, name, 0).score  # the reward rl.py gives
        assert tok.special_ids == ({0, 1} if tok.pad_id == 0 else {256, 257})
        assert score(ids + [tok.eos_id], None, (None, gold)) == 1.0
        assert score(ids, None, (None, gold)) == 0.0  # truncated: no EOS
        for s in tok.special_ids:
            for k in range(len(ids) + 1):
                bad = ids[:k] + [s] + ids[k:] + [tok.eos_id]
                assert score(bad, None, (None, gold)) == 0.0, (type(tok).__name__, s, k)
