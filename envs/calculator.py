"""
The calculator, an environment without state: the policy opens a call with `[`, writes an
expression and ends its turn with `]`; the environment answers `{result}`, reward 0, and the
episode goes on until the policy writes its answer and EOS (nanorl/episodes.py runs it).

    [123*6]{738}        a number times one digit
    [738+6150]{6888}    a sum of 2 to MAX_TERMS numbers
    [3+x]{?}            anything else, and every call past the 4th: the error token

Pure and total: it never runs eval, reads at most MAX_DIGITS digits a number and answers
whatever it cannot parse with `?`. The task mul3_tool (data.tasks.TASKS) names it; `demo` is that
task's worked answer, the SFT trace (numbers in normal order; the model reads them reversed):

    123*456=[123*6]{738}[123*5]{615}[123*4]{492}[738+6150+49200]{56088}56088
"""
import re

from verify import exact_answer

CHARS = "[]{}?"  # call, turn end; result, its end; error
MAX_DIGITS, MAX_TERMS, MAX_CALLS = 8, 4, 4
_MUL = re.compile(rf"([0-9]{{1,{MAX_DIGITS}}})\*([0-9])")
_SUM = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}(\+[0-9]{{1,{MAX_DIGITS}}}){{1,{MAX_TERMS - 1}}}")


def calculator(text):
    """The result of one call's text, "?" if it is not `a*d` (d one digit) or a sum of 2 to
    MAX_TERMS numbers of at most MAX_DIGITS ASCII digits."""
    if not isinstance(text, str):
        return "?"
    if m := _MUL.fullmatch(text):
        return str(int(m[1]) * int(m[2]))
    if _SUM.fullmatch(text):
        return str(sum(int(t) for t in text.split("+")))
    return "?"


class Env:
    """One answer's calls: `{result}` for each, the error past MAX_CALLS; its score is the exact
    match of the answer written after the last result. broken: every call answered `{?}`."""
    stops, max_turns, max_obs = ("]",), 2 * MAX_CALLS, 12  # an 8th call ends the episode

    def __init__(self, answer, broken=False):
        self.answer, self.broken, self.calls, self.invalid = answer, broken, 0, 0

    def step(self, turn):
        self.calls += 1
        call = turn.rpartition("[") if turn is not None else ("", "", "")
        ok = call[1] and self.calls <= MAX_CALLS and not self.broken
        result = calculator(call[2]) if ok else "?"
        self.invalid += result == "?"
        return "{" + result + "}", 0.0, False

    def score(self, final):
        return exact_answer(final, self.answer)


def demo(prompt, answer, rng=None):
    """The worked answer to "a*b=" -> (its calls, each before its `]`; the final answer)."""
    a, b = prompt[:-1].split("*")
    parts = [int(a) * int(d) for d in reversed(b)]  # a times each digit of b, units first
    total = "+".join(str(p * 10 ** i) for i, p in enumerate(parts))
    return [f"[{a}*{d}" for d in reversed(b)] + [f"[{total}"], answer
