"""
CLIFF (2025), `rl.py --loss=cliff`: a wrong answer's negative advantage starts at its first
wrong token, found against the gold answer's tokens, so only the exact verifier with the char
tokenizer fits it (check). Its row in losses.ALGOS: advantage "first_wrong".
"""
import torch

from nanorl.config import UserError
from model import responses
from tokenizer import CharTokenizer


def check(task):
    """One line unless the gold answer's tokens are the one right answer: the exact verifier,
    the char tokenizer, no environment."""
    if task.verifier_name != "exact" or not isinstance(task.tok, CharTokenizer) or task.env_module:
        env = " and the environment of " + task.name if task.env_module else ""
        raise UserError(f"cliff finds the first wrong token against the gold answer's tokens, "
                        f"which only the exact verifier with the char tokenizer and no environment "
                        f"makes unique; this checkpoint has verifier {task.verifier_name!r}, a "
                        f"{type(task.tok).__name__}{env}")


def first_wrong_token(response_ids: list[int], gold_ids: list[int]) -> int | None:
    """Index of the response's first wrong token (CLIFF's negative advantage starts there), None
    when it equals gold_ids (EOS last): the first difference; past gold's end len(gold_ids);
    for a strict prefix of gold (truncated) its last token, or 0 when empty."""
    n = min(len(response_ids), len(gold_ids))
    i = next((i for i in range(n) if response_ids[i] != gold_ids[i]), n)
    if i < n or len(response_ids) > n:
        return i
    return None if len(response_ids) == len(gold_ids) else max(n - 1, 0)


def first_wrong(batch, gold, G):
    """(N,) each row's first wrong token against its group's gold answer ids, -1 if none."""
    wrong = [first_wrong_token(ids, gold[r // G][1]) for r, ids in enumerate(responses(batch))]
    return torch.tensor([-1 if w is None else w for w in wrong], device=batch.ids.device)
