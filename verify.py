"""Rewards: VERIFIERS[name](completion, gold, reverse=False) -> 1.0 or 0.0, DAPO's
overlong_penalty, a task's grade and an episode's return. Pure and total: garbage, unicode,
nested tags, 5,000-digit numbers give 0, never an exception; numbers compare as digit strings,
never via int(). An answer is canonical: "0", or an optional '-' then ASCII digits, no leading
zero. gold is canonical, in normal order ("1081"). The caller passes the text the policy wrote
after the environment's last token (an observation), EOS stripped (no EOS or a special inside: 0).
"""
import re

_CANONICAL = re.compile(r"0|-?[1-9][0-9]*")  # no leading zeros, no "-0"; [0-9] is ASCII only
_FINAL = re.compile(r"<final>([+-]?[0-9]+)</final>")


def _matches(answer, gold):
    """1.0 iff answer is canonical and equals gold (a string, or an int), else 0.0."""
    if isinstance(gold, int) and not isinstance(gold, bool):
        try:
            gold = str(gold)
        except ValueError:  # str() refuses ints of more than 4,300 digits
            return 0.0
    return float(_CANONICAL.fullmatch(answer) is not None and answer == gold)  # fullmatch: no "\n"


def exact_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` is exactly the canonical answer `gold`. reverse=True: written least
    significant digit first, so reversed back first ("1801" -> "1081", "21-" -> "-12")."""
    if not isinstance(completion, str):
        return 0.0
    return _matches(completion[::-1] if reverse else completion, gold)


def final_answer(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` holds exactly one `<final>N</final>` (any text outside) and N, a '+'
    dropped, is canonical and equals `gold`. `reverse` is ignored: N is in normal order."""
    if not isinstance(completion, str):
        return 0.0
    if completion.count("<final>") != 1 or completion.count("</final>") != 1:
        return 0.0
    m = _FINAL.search(completion)  # None: tags out of order, or junk inside
    return 0.0 if m is None else _matches(m[1].removeprefix("+"), gold)


def overlong_penalty(length: int, max_new_tokens: int, window: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), L = max_new_tokens, length with EOS:
    -min(1, max(0, (length - (L - window)) / window)). L 20, window 4: 16 -> 0, 17 -> -0.25,
    20 -> -1. window <= 0: no soft band, 0 up to L, -1 beyond."""
    if window <= 0:
        return 0.0 if length <= max_new_tokens else -1.0
    p = min(1.0, max(0.0, (length - (max_new_tokens - window)) / window))
    return -p if p > 0 else 0.0  # 0.0, not -0.0


def exact_text(completion: str, gold: str, reverse: bool = False) -> float:
    """1.0 iff `completion` (reversed back with reverse=True) is exactly `gold`: your own
    tasks whose answers are not integers."""
    if not isinstance(completion, str) or not isinstance(gold, str):
        return 0.0
    return float((completion[::-1] if reverse else completion) == gold)


# name -> f(completion, gold, reverse=False), picked by sft.py --verifier=NAME (stored in the
# checkpoint for every eval and rl.py's rewards). Your own: a function and one line here.
VERIFIERS = {"exact": exact_answer, "final": final_answer, "text": exact_text}


def grade(verifier, reverse, text, problem):
    """A task's score of the text the policy wrote for problem (prompt, gold): 0 if it never
    ended (text None), else VERIFIERS[verifier]'s (bound once per task: Task.grade)."""
    return 0.0 if text is None else VERIFIERS[verifier](text, problem[1], reverse=reverse)


def episode_return(score, turn_rewards=None):
    """(N,) an episode's return: its final score (N,) plus its turns' rewards (N, L) if an
    environment paid any; the reward without DAPO's shaping."""
    return score if turn_rewards is None else score + turn_rewards.sum(1)
