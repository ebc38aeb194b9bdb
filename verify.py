"""Reward functions for RL: exact answer, the <final> tag contract, exact text, first wrong token,
overlong shaping.

Every function here is pure and total: garbage, empty strings, arbitrary unicode, nested tags and
5,000-digit numbers give a score, never an exception. Numbers are compared as digit strings and
never go through int() (Python refuses to int() a string of more than 4,300 digits).

Rules shared by both verifiers. An answer is an integer written with ASCII digits only ('١٢' and
fullwidth '１２' are not 12), in canonical form: "0", or an optional '-' followed by digits with no
leading zero ("0012" and "-0" are wrong). No whitespace and no extra text is stripped or tolerated.
`gold` is the answer as the data files store it: canonical, in normal digit order ("1081", "-12").
A non-canonical gold matches nothing, so a malformed data row scores 0 instead of rewarding junk.

How the caller uses them: decode the response tokens, and if the response ended with EOS strip it
and call `VERIFIERS[name](completion, gold, reverse=...)`; a response truncated at max_new_tokens
without EOS gets reward 0 without calling any verifier (the caller's job: "1081" cut off before
EOS may still be the start of "10810"), and so does one with a special token (PAD, EOS) before its
end, which decoding would drop (evaluate.grade). `overlong_penalty` is added on top (DAPO), and
`first_wrong_token` gives CLIFF the token from which a wrong response's negative advantage starts.
"""
import re

_CANONICAL = re.compile(r"0|-?[1-9][0-9]*")     # no leading zeros, no "-0"; [0-9] is ASCII only
_FINAL = re.compile(r"<final>([+-]?[0-9]+)</final>")


def _gold(gold):
    """The gold answer as a string, or None. Ints are accepted too (str() refuses > 4,300 digits)."""
    if isinstance(gold, str):
        return gold
    if isinstance(gold, int) and not isinstance(gold, bool):
        try:
            return str(gold)
        except ValueError:
            return None
    return None


def exact_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` is exactly the canonical answer `gold`, else 0.0.

    completion: the decoded response with EOS already stripped (the caller scores responses that
    never emitted EOS as 0 and does not call this). With reverse=True the model wrote the answer
    least-significant digit first: the whole completion is reversed back to normal order first
    (`completion[::-1]`, the inverse of data.tasks.format_answer: "1801" -> "1081", "21-" -> "-12")
    and then the normal rules apply, so for gold 12 the reversed "21" scores 1 and "2100"
    (-> "0012", leading zeros) scores 0."""
    gold = _gold(gold)
    if not isinstance(completion, str) or gold is None:
        return 0.0
    answer = completion[::-1] if reverse else completion
    return float(_CANONICAL.fullmatch(answer) is not None and answer == gold)  # fullmatch: no "\n"


def final_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` holds exactly one `<final>N</final>` and N equals `gold`, else 0.0.

    Text outside the tag is free (working, "3*4=12 <final>12</final>"). The tag is case-sensitive
    and must occur exactly once: a second "<final>" or "</final>" anywhere (duplicated, nested,
    unclosed, stray closer) scores 0. N is an optional '+' or '-' then ASCII digits with nothing
    else inside the tag, not even spaces; after dropping a '+' it must be canonical ("0", no
    leading zeros, no "-0") and equal to `gold`. `reverse` is accepted for the VERIFIERS signature
    and ignored: the tag always holds normal digit order."""
    gold = _gold(gold)
    if not isinstance(completion, str) or gold is None:
        return 0.0
    if completion.count("<final>") != 1 or completion.count("</final>") != 1:
        return 0.0
    m = _FINAL.search(completion)
    if m is None:                               # tags out of order, or something else inside
        return 0.0
    answer = m[1].removeprefix("+")
    return float(_CANONICAL.fullmatch(answer) is not None and answer == gold)


def first_wrong_token(response_ids: list[int], gold_ids: list[int]) -> int | None:
    """Index of the first wrong token of the response, in emitted order; None when it equals gold.

    gold_ids: the gold answer's tokens as they should be emitted, EOS last (for the reversed format
    the caller passes the reversed gold tokens). Cases:
      - first position where the two differ (an early EOS, or a missing EOS, is a difference) -> it;
      - response a strict prefix of gold (truncated before finishing) -> len(response) - 1: no
        emitted token is wrong, so the last one emitted, which should have been followed by more,
        is blamed; an empty response -> 0 (there is no token to blame: the caller's mask is empty);
      - gold a strict prefix of the response (tokens after EOS) -> len(gold_ids), the first extra.
    CLIFF gives the negative advantage from this index on."""
    n = min(len(response_ids), len(gold_ids))
    for i in range(n):
        if response_ids[i] != gold_ids[i]:
            return i
    if len(response_ids) == len(gold_ids):
        return None
    if len(response_ids) < len(gold_ids):
        return max(len(response_ids) - 1, 0)
    return len(gold_ids)


def overlong_penalty(length: int, max_new_tokens: int, window: int) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025): -min(1, max(0, (length - (L - window)) / window)).

    length counts EOS; L = max_new_tokens. 0 up to L - window tokens, then a linear ramp down to -1
    at L; beyond L (cannot happen in sampling) it stays -1. L 20, window 4: 16 -> 0, 17 -> -0.25,
    18 -> -0.5, 20 -> -1. window <= 0 means no soft band: 0 up to L, -1 beyond."""
    if window <= 0:
        return 0.0 if length <= max_new_tokens else -1.0
    p = min(1.0, max(0.0, (length - (max_new_tokens - window)) / window))
    return -p if p > 0 else 0.0                 # 0.0, not -0.0


def exact_text(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` is exactly the string `gold` (with reverse=True, reversed back first),
    else 0.0: exact match for your own tasks whose answers are not integers."""
    if not isinstance(completion, str) or not isinstance(gold, str):
        return 0.0
    return float((completion[::-1] if reverse else completion) == gold)


# name -> f(completion, gold, reverse=False); a task picks one with sft.py --verifier=NAME (stored in
# the checkpoint, used by every eval and by rl.py's rewards). Your own: a function and one line here.
VERIFIERS = {"exact": exact_answer, "final": final_answer, "text": exact_text}
