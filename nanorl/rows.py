"""Rows: the Rollout record rl.py trains on (and the dict a checkpoint or a pipe carries), prompts
and gold answers as token ids, and packed (prompt, answer) rows."""
from dataclasses import dataclass

import torch

from data.tasks import format_answer, flip_numbers


@dataclass
class Rollout:  # N = prompts x G samples, responses aligned at 0
    ids: torch.Tensor  # (N, P+L) left-padded prompt, response, right padding
    offsets: torch.Tensor  # (N,) left-pad count of each row
    mask: torch.Tensor  # (N, L) 1 on the policy's tokens (EOS included), not the env's
    mu: torch.Tensor  # (N, L) the sampler's log-probs
    old_logp: torch.Tensor = None  # (N, L) pi_old: mu unless offpolicy.py recomputes it
    reward: torch.Tensor = None  # (N,) what advantages read (docs/guides.md#words)
    score: torch.Tensor = None  # (N,) the final score: the verifier's or the episode's
    first_wrong: torch.Tensor = None  # (N,) CLIFF's first wrong token, or -1
    length: torch.Tensor = None  # (N,) response tokens with EOS, the environment's too
    finished: torch.Tensor = None  # (N,) ended with EOS
    values: torch.Tensor = None  # (N, L) V_old: PPO's value head, VinePPO's branches
    baseline: torch.Tensor = None  # (N,) ReMax: the greedy answer's reward
    rm_reward: torch.Tensor = None  # (N,) the RM's raw score
    turn_rewards: torch.Tensor = None  # (N, L) an environment's, at its turns' ends
    turns: torch.Tensor = None  # (N,) an environment's turns
    invalid: torch.Tensor = None  # (N,) the turns it could not take
    version: torch.Tensor = None  # (N, L) async: each token's policy version
    states: torch.Tensor = None  # (N, L) GiGPO: the state each turn starts from (an id)
    ref_logp: torch.Tensor = None  # (N, L) the frozen reference's log-probs, with a KL term


def to_dict(batch):
    """A queued rollout as plain tensors (weights_only checkpoints); None stays None."""
    return batch and {k: v for k, v in vars(batch).items() if v is not None}


def from_dict(d, dev):
    return d and Rollout(**{k: v.to(dev) for k, v in d.items()})


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(flip_numbers(p, reverse)) for p in prompts]


def gold_rows(tok, problems, reverse):
    """[(prompt, answer)] in normal order -> [(prompt ids, answer ids + EOS)]."""
    answers = [tok.encode(format_answer(a, reverse)) + [tok.eos_id] for _, a in problems]
    return list(zip(encode_prompts(tok, [p for p, _ in problems], reverse), answers))


def record_rows(tok, recs, reverse):
    """Offline JSONL records -> (rows, labels): DPO pairs give chosen rows then rejected rows and
    labels None; KTO records give one row each and their desirable labels (N,)."""
    if "label" in recs[0]:  # KTO
        labels = torch.tensor([r["label"] for r in recs])  # (N,)
        return gold_rows(tok, [(r["prompt"], r["completion"]) for r in recs], reverse), labels
    pairs = [(r["prompt"], r[key]) for key in ("chosen", "rejected") for r in recs]
    return gold_rows(tok, pairs, reverse), None


def pack(rows, pad_id, left=False):
    """[(prompt ids, response ids[, its action mask])] -> ids (N, T), each row's left pads (N,)
    and the mask, 1 on the response tokens the policy writes: rows from position 0 as SFT reads
    them (mask (N, T)), or (left) prompts ending at P, as the sampler lays them out (N, T - P)."""
    P = max(len(p) for p, *_ in rows) if left else 0
    pads = [P - len(p) if left else 0 for p, *_ in rows]
    T = max(k + len(p) + len(r) for k, (p, r, *_) in zip(pads, rows))
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)  # (N, T)
    mask = torch.zeros(len(rows), T, dtype=torch.long)  # (N, T)
    for i, (k, (p, r, *m)) in enumerate(zip(pads, rows)):
        ids[i, k:k + len(p) + len(r)] = torch.tensor(p + r)
        mask[i, k + len(p):k + len(p) + len(r)] = torch.tensor(m[0] if m else [1] * len(r))
    return ids, torch.tensor(pads), mask[:, P:]
