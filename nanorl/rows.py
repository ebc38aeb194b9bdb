"""Rows: the Rollout record rl.py trains on, prompts and gold answers as token ids, sampled
responses, packed (prompt, answer) rows, a record's rows joined or taken, and the prompt sampler
that feeds rl.py."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.tasks import format_answer, format_prompt
from model import seeded


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

    def episode_return(self):
        """(N,) the score plus the turns' rewards: the reward without shaping."""
        return self.score if self.turn_rewards is None else self.score + self.turn_rewards.sum(1)


def to_dict(batch):
    """A queued rollout as plain tensors (weights_only checkpoints); None stays None."""
    return batch and {k: v for k, v in vars(batch).items() if v is not None}


def from_dict(d, dev):
    return d and Rollout(**{k: v.to(dev) for k, v in d.items()})


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(format_prompt(p, reverse)) for p in prompts]


def gold_rows(tok, problems, reverse):
    """[(prompt, answer)] in normal order -> [(prompt ids, answer ids + EOS)]."""
    answers = [tok.encode(format_answer(a, reverse)) + [tok.eos_id] for _, a in problems]
    return list(zip(encode_prompts(tok, [p for p, _ in problems], reverse), answers))


def responses(out):
    """The response ids of each row (the environment's too, EOS included, padding cut) of a
    `generate` result or of a Rollout (ids (N, P+L), lengths (N,))."""
    if isinstance(out, dict):
        ids, P, n = out["ids"], out["prompt_len"], out["response_mask"].sum(1)
    else:
        ids, P, n = out.ids, out.ids.size(1) - out.mask.size(1), out.length
    return [r[P:P + int(k)] for r, k in zip(ids.tolist(), n.tolist())]


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


def cat(parts):
    """One record (a dataclass of per-row tensors such as Rollout) from several: the ids'
    prompts left-padded to the longest (offsets follow), every (N, L) field right-padded."""
    P = max(p.ids.size(1) - p.mask.size(1) for p in parts)
    T = max(p.mask.size(1) for p in parts)

    def fit(p, k, v):  # a part's field, laid out as the joined record's
        left, right = P - (p.ids.size(1) - p.mask.size(1)), T - p.mask.size(1)
        if k == "ids":
            return F.pad(v, (left, right))
        return v + left if k == "offsets" else F.pad(v, (0, right)) if v.dim() == 2 else v
    return type(parts[0])(**{k: None if v is None else torch.cat([fit(p, k, getattr(p, k))
                                                                  for p in parts])
                             for k, v in vars(parts[0]).items()})


def take(record, rows):
    """The record of these rows (a bool mask (N,) or indices) of a record."""
    return type(record)(**{k: None if v is None else v[rows] for k, v in vars(record).items()})


class PromptSampler:
    """Epochs over n prompts, each in the order seeded by (key, epoch). With selection on, a
    prompt whose group was all right or all wrong at its last visit is skipped once."""

    def __init__(self, n, key, selection):
        self.n, self.key, self.selection = n, key, selection
        self.load_state_dict({"epoch": 0, "pos": 0, "saturated": []})

    def take(self, k):
        out = []
        while len(out) < k:
            if self.pos >= self.n:  # the next epoch, in its own order
                self.load_state_dict({"epoch": self.epoch + 1, "pos": 0,
                                      "saturated": self.saturated})
            i = self.order[self.pos]
            self.pos += 1
            if self.selection and i in self.saturated:
                self.saturated.discard(i)
            else:
                out.append(i)
        return out

    def record(self, idx, flat):
        """flat (len(idx),): the groups without signal, as dynamic sampling tests it."""
        self.saturated |= {i for i, f in zip(idx, flat.tolist()) if f}

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "saturated": sorted(self.saturated)}

    def load_state_dict(self, s):
        self.epoch, self.pos, self.saturated = s["epoch"], s["pos"], set(s["saturated"])
        self.order = torch.randperm(self.n, generator=seeded("cpu", self.key, self.epoch)).tolist()
