"""
Tool use: a calculator the policy calls mid-answer. The policy opens a call with `[`, writes an
expression and closes it with `]`; the sampler (model.generate) then forces the environment's
answer `{result}` into that row, a token a decode step, with log-prob 0 and action 0, so that
losses, KL and every count see only the tokens the policy chose (the action mask).

    [321*6]{837}      a number times one digit (numbers as the task writes them: reversed)
    [837+0516]{3535}  a sum of at most 4 numbers
    [3+x]{?}          anything else, and every call past the 4th: the error token

The calculator is pure and total: it never runs eval, reads at most MAX_DIGITS digits a number
and answers whatever it cannot parse with `?`. counts() and metrics(): calls, errors and the
share of response tokens the environment wrote.
"""
import re

import torch

from data.tasks import TOOL_TOKENS

OPEN, CLOSE, RESULT, END, ERROR = TOOL_TOKENS
MAX_DIGITS, MAX_TERMS, MAX_CALLS = 8, 4, 4
_MUL = re.compile(rf"([0-9]{{1,{MAX_DIGITS}}})\*([0-9])")
_SUM = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}(\+[0-9]{{1,{MAX_DIGITS}}}){{1,{MAX_TERMS - 1}}}")


def calculator(text, reverse=False):
    """The result of one call's text, "?" if it is not `a*d` (d one digit) or a sum of 2 to
    MAX_TERMS numbers of at most MAX_DIGITS ASCII digits. reverse: numbers are written least
    significant digit first, the result too."""
    if not isinstance(text, str):
        return ERROR
    flip = (lambda s: s[::-1]) if reverse else (lambda s: s)
    if m := _MUL.fullmatch(text):
        return flip(str(int(flip(m[1])) * int(m[2])))
    if _SUM.fullmatch(text):
        return flip(str(sum(int(flip(t)) for t in text.split("+"))))
    return ERROR


class Calculator:
    """The environment model.generate runs: given a row's response ids that end with the
    close token, the ids to force, `{result}`, via the task's tokenizer and digit order."""

    def __init__(self, tok, reverse, broken=False):
        self.tok, self.reverse, self.broken = tok, reverse, broken  # broken: always the error
        self.open_id, self.close_id, self.result_id, self.end_id, self.error_id = (
            tok.encode(c)[0] for c in (OPEN, CLOSE, RESULT, END, ERROR))

    def __call__(self, ids):
        calls = ids.count(self.close_id)
        start = max((i for i, t in enumerate(ids[:-1]) if t == self.open_id), default=None)
        body = ids[start + 1:-1] if start is not None else []  # the call's text, in ids
        ok = not self.broken and calls <= MAX_CALLS and start is not None and \
            not self.tok.special_ids.intersection(body)  # decoding would drop a special
        out = calculator(self.tok.decode(body), self.reverse) if ok else ERROR
        return [self.result_id, *self.tok.encode(out), self.end_id]


def env_mask(ids, tool):
    """(L,) 1 on the ids a well-formed trace's author wrote, 0 on the environment's `{...}`
    results: the action mask of a gold trace (SFT). Sampled rows get theirs from the sampler."""
    mask, inside = [], False
    for t in ids:
        inside |= t == tool.result_id
        mask.append(0 if inside else 1)
        inside &= t != tool.end_id
    return mask


@torch.no_grad()
def counts(ids, action, length, tool):
    """Tool use in responses ids (N, L) with their action mask (N, L) and lengths (N,) -> a
    (5,) tensor to add up over batches: rows, calls, error results, env tokens, tokens."""
    act = action.bool()
    env = ~act & (torch.arange(ids.size(1), device=ids.device) < length[:, None])  # (N, L)
    return torch.tensor([len(ids), (act & (ids == tool.close_id)).sum().item(),
                         (env & (ids == tool.error_id)).sum().item(), env.sum().item(),
                         length.sum().item()], dtype=torch.float)


def metrics(c, prefix):
    """counts -> calls per answer, the share of calls answered with the error token, the share
    of response tokens the environment wrote."""
    rows, calls, errors, env, tokens = c.tolist()
    return {f"{prefix}/tool_calls": calls / max(1, rows),
            f"{prefix}/tool_error_frac": errors / max(1, calls),
            f"{prefix}/env_token_frac": env / max(1, tokens)}
