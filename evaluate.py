"""Held-out evaluation (greedy accuracy, unbiased pass@k) and the row helpers training shares."""
import math

import torch

from config import UserError
from data.tasks import format_answer, format_prompt, parse_answer
from model import generate
from verify import VERIFIERS, exact_answer


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # C(n-c, k) = 0 when k > n-c


def pass_k_name(n_samples, k=8):
    """evaluate's pass@k metric name: pass@k, or pass@n_samples when fewer samples are drawn."""
    return f"pass@{min(k, n_samples)}"


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(format_prompt(p, reverse)) for p in prompts]


def gold_rows(tok, problems, reverse):
    """[(prompt, answer)] in normal order -> [(prompt ids, answer ids + EOS)]."""
    answers = [tok.encode(format_answer(a, reverse)) + [tok.eos_id] for _, a in problems]
    return list(zip(encode_prompts(tok, [p for p, _ in problems], reverse), answers))


def responses(out):
    """The sampled token ids of each row of a `generate` result, EOS included, padding cut."""
    P, lengths = out["prompt_len"], out["response_mask"].sum(1).tolist()  # the prompt's mask is 0
    return [ids[P:P + n] for ids, n in zip(out["ids"].tolist(), lengths)]


def record_rows(tok, recs, reverse):
    """Offline JSONL records -> (rows, labels): DPO pairs give chosen rows then rejected rows and
    labels None; KTO records give one row each and their desirable labels (N,)."""
    if "label" in recs[0]:  # KTO
        labels = torch.tensor([r["label"] for r in recs])  # (N,)
        return gold_rows(tok, [(r["prompt"], r["completion"]) for r in recs], reverse), labels
    pairs = [(r["prompt"], r[key]) for key in ("chosen", "rejected") for r in recs]
    return gold_rows(tok, pairs, reverse), None


def pack(rows, pad_id):
    """[(prompt ids, response ids)] -> ids (N, T) right-padded, each row from position 0 as in SFT,
    and the response mask (N, T), 1 on the response tokens."""
    T = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)  # (N, T)
    mask = torch.zeros(len(rows), T, dtype=torch.long)  # (N, T)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p):len(p) + len(r)] = 1
    return ids, mask


@torch.no_grad()
def evaluate(model, tok, problems, reverse, max_new_tokens, n_samples=0, temperature=1.0, k=8,
             batch_size=256, generator=None, prefix="eval", n_show=3, verifier=exact_answer):
    """Greedy accuracy on problems [(prompt, answer)] under `verifier`; with n_samples > 0 also
    pass@1 and pass@k (n_samples per problem at `temperature`; pass@n_samples when fewer than k),
    batch_size rows per sampler call at most. Returns (metrics, a few examples)."""
    n, prompts = len(problems), encode_prompts(tok, [p for p, _ in problems], reverse)

    def sample(G, temp):  # [(reward, completion)] of G samples per problem, problem-major
        scored, step = [], max(1, batch_size // G)  # prompts per call: at most batch_size rows
        for i in range(0, n, step):
            out = generate(model, prompts[i:i + step], max_new_tokens, tok.eos_id, tok.pad_id, G=G,
                           temperature=temp, generator=generator)
            gold = [a for _, a in problems[i:i + step] for _ in range(G)]
            scored += score_samples(tok, out, gold, reverse, verifier)
        return scored

    greedy = sample(1, 0)
    metrics = {f"{prefix}/accuracy": sum(r for r, _ in greedy) / n, f"{prefix}/n": n}
    examples = [{"prompt": p, "completion": text, "reward": r}
                for (p, _), (r, text) in zip(problems[:n_show], greedy)]
    if n_samples > 0:
        scored = sample(n_samples, temperature)
        right = torch.tensor([r for r, _ in scored]).view(n, n_samples).sum(1).tolist()  # (n,)
        for kk in (1, k):
            metrics[f"{prefix}/{pass_k_name(n_samples, kk)}"] = \
                sum(pass_at_k(n_samples, int(c), min(kk, n_samples)) for c in right) / n
    return metrics, examples


def score_samples(tok, out, gold, reverse, verifier=exact_answer):
    """[(reward, completion in normal order)] for each row of a `generate` result."""
    return [(grade(tok, ids, g, reverse, verifier), parse_answer(tok.decode(ids), reverse))
            for ids, g in zip(responses(out), gold)]


def grade(tok, ids, gold, reverse, verifier=exact_answer):
    """Reward of one response (its sampled ids): the verifier's score of its text if it ended with
    EOS, else 0; 0 too if a special token comes earlier (decoding would drop it: "10<pad>81")."""
    if not ids or ids[-1] != tok.eos_id or any(i in tok.special_ids for i in ids[:-1]):
        return 0.0
    return verifier(tok.decode(ids[:-1]), gold, reverse=reverse)


def verifier_of(name):
    """The reward function verify.VERIFIERS[name], or a UserError naming the valid ones."""
    if name not in VERIFIERS:
        raise UserError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]
