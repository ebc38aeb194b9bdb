"""Rewards: VERIFIERS[name](completion, gold, reverse=False) -> 1.0 or 0.0, first_wrong_token
(CLIFF) and overlong_penalty (DAPO). Pure and total: garbage, any unicode, nested tags and
5,000-digit numbers give 0, never an exception; numbers compare as digit strings, never via
int(). An answer is canonical: "0", or an optional '-' then ASCII digits, no leading zero
("0012", "-0", " 12" are wrong). gold is canonical, in normal order ("1081", "-12"). The
caller strips EOS and gives 0 to a response without EOS or with a special token inside.
"""
import re

_CANONICAL = re.compile(r"0|-?[1-9][0-9]*")     # no leading zeros, no "-0"; [0-9] is ASCII only
_FINAL = re.compile(r"<final>([+-]?[0-9]+)</final>")


def _matches(answer, gold):
    """1.0 iff answer is canonical and equals gold (a string, or an int), else 0.0."""
    if isinstance(gold, int) and not isinstance(gold, bool):
        try:
            gold = str(gold)
        except ValueError:                      # str() refuses ints of more than 4,300 digits
            return 0.0
    return float(_CANONICAL.fullmatch(answer) is not None and answer == gold)  # fullmatch: no "\n"


def exact_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` is exactly the canonical answer `gold`. reverse=True: the model wrote
    the answer least-significant digit first, so the whole completion is reversed back first
    ("1801" -> "1081", "21-" -> "-12"; for gold 12 "2100" -> "0012" scores 0)."""
    if not isinstance(completion, str):
        return 0.0
    return _matches(completion[::-1] if reverse else completion, gold)


def final_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` holds exactly one `<final>N</final>` (case-sensitive; any text outside)
    and N ([+-]? then ASCII digits) is canonical after dropping a '+' and equals `gold`. A second
    "<final>" or "</final>" anywhere scores 0. `reverse` is ignored: N is in normal order."""
    if not isinstance(completion, str):
        return 0.0
    if completion.count("<final>") != 1 or completion.count("</final>") != 1:
        return 0.0
    m = _FINAL.search(completion)               # None: tags out of order, or junk inside
    return 0.0 if m is None else _matches(m[1].removeprefix("+"), gold)


def first_wrong_token(response_ids: list[int], gold_ids: list[int]) -> int | None:
    """Index of the response's first wrong token (CLIFF's negative advantage starts there), None
    when it equals gold_ids (the gold tokens as they should be emitted, EOS last): the first
    difference; past the end of gold (tokens after EOS) len(gold_ids); for a strict prefix of gold
    (truncated) the last emitted token, len(response) - 1, or 0 for an empty response."""
    n = min(len(response_ids), len(gold_ids))
    i = next((i for i in range(n) if response_ids[i] != gold_ids[i]), n)
    if i < n or len(response_ids) > n:
        return i
    return None if len(response_ids) == len(gold_ids) else max(n - 1, 0)


def overlong_penalty(length: int, max_new_tokens: int, window: int) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025):
    -min(1, max(0, (length - (L - window)) / window)).

    length counts EOS; L = max_new_tokens. 0 up to L - window tokens, then a linear ramp down to -1
    at L; beyond L (cannot happen in sampling) it stays -1. L 20, window 4: 16 -> 0, 17 -> -0.25,
    18 -> -0.5, 20 -> -1. window <= 0 means no soft band: 0 up to L, -1 beyond."""
    if window <= 0:
        return 0.0 if length <= max_new_tokens else -1.0
    p = min(1.0, max(0.0, (length - (max_new_tokens - window)) / window))
    return -p if p > 0 else 0.0                 # 0.0, not -0.0


def exact_text(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` (reversed back first with reverse=True) is exactly the string `gold`:
    exact match for your own tasks whose answers are not integers."""
    if not isinstance(completion, str) or not isinstance(gold, str):
        return 0.0
    return float((completion[::-1] if reverse else completion) == gold)


# name -> f(completion, gold, reverse=False), picked by sft.py --verifier=NAME (stored in the
# checkpoint for every eval and rl.py's rewards). Your own: a function and one line here.
VERIFIERS = {"exact": exact_answer, "final": final_answer, "text": exact_text}
