"""
CLIFF (2025), `rl.py --loss=cliff`: a wrong answer's negative advantage starts at its first
wrong token, found against the gold answer's tokens, so only the exact verifier with the char
tokenizer fits it (check). Its row in losses.ALGOS: advantage "first_wrong".
"""
import torch

from losses import masked_mean
from nanorl.config import UserError
from nanorl.rows import responses
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
    """(N,) each row of rollout b's first wrong token against its group's gold ids, -1 if none."""
    wrong = [first_wrong_token(ids, gold[r // G]) for r, ids in enumerate(responses(batch))]
    return torch.tensor([-1 if w is None else w for w in wrong], device=batch.ids.device)


def cliff_advantages(rewards, first_wrong, mask, lam=0.0):
    """CLIFF (2025) -> (P, G, T) from 0/1 rewards (P, G), first_wrong (P, G) (-1: none) and
    mask (P, G, T). With the group's mean mu, std sd: a correct answer gets (1-mu)/sd = a_good,
    a wrong one lam a_good before its first wrong token, -mu/sd from it; centred per group."""
    if not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError("cliff_advantages needs binary 0/1 rewards (the exact verifier)")
    m, rewards = mask.bool(), rewards.float()
    mu = rewards.mean(-1, keepdim=True)  # (P, 1)
    sd = rewards.std(-1, correction=0, keepdim=True)  # (P, 1)
    live = sd > 0  # (P, 1) groups with signal
    sd = torch.where(live, sd, 1.0)
    a_good, a_bad = ((1 - mu) / sd)[..., None], (-mu / sd)[..., None]  # (P, 1, 1)
    t = torch.arange(m.shape[-1], device=m.device)  # (T,)
    before = t < first_wrong.clamp_min(0)[..., None]  # (P, G, T)
    adv = torch.where(rewards[..., None] == 1, a_good, torch.where(before, lam * a_good, a_bad))
    adv = adv - masked_mean(adv.expand(m.shape), m, dim=(1, 2))[:, None, None]
    return torch.where(m & live[..., None], adv, 0.0)
