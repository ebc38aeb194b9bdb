"""Held-out evaluation (greedy accuracy, unbiased pass@k) and the row helpers it shares with
training: encode a (prompt, answer), cut a response out of a rollout, grade it.
"""
import math

import torch

from config import UserError
from data.tasks import format_answer, format_prompt, parse_answer
from model import generate
from verify import exact_answer


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k)/C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_k_name(n_samples, k=8):
    """evaluate's pass@k metric name: pass@k, or pass@n_samples when fewer samples are drawn."""
    return f"pass@{min(k, n_samples)}"


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(format_prompt(p, reverse)) for p in prompts]


def gold_rows(tok, problems, reverse):
    """[(prompt, answer)] in normal order -> [(prompt ids, answer ids + EOS)]: what the model reads and
    what it should write."""
    prompts = encode_prompts(tok, [p for p, _ in problems], reverse)
    return [(p, tok.encode(format_answer(a, reverse)) + [tok.eos_id]) for p, (_, a) in zip(prompts, problems)]


def responses(out):
    """The sampled token ids of each row of a `generate` result, EOS included, padding cut."""
    P = out["prompt_len"]
    return [ids[:n] for ids, n in zip(out["ids"][:, P:].tolist(), out["response_mask"][:, P:].sum(1).tolist())]


def record_rows(tok, recs, reverse):
    """Offline JSONL records -> (rows, labels): DPO pairs give chosen rows then rejected rows (labels
    None); KTO records give one row each and their desirable labels (N,)."""
    if "label" in recs[0]:
        labels = torch.tensor([r["label"] for r in recs])  # (N,)
        return gold_rows(tok, [(r["prompt"], r["completion"]) for r in recs], reverse), labels
    pairs = [(r["prompt"], r["chosen"]) for r in recs] + [(r["prompt"], r["rejected"]) for r in recs]
    return gold_rows(tok, pairs, reverse), None


def pack(rows, pad_id):
    """[(prompt ids, response ids)] -> ids (N, T) right-padded, each row from position 0 as in SFT,
    and the response mask (N, T), 1 on the response tokens."""
    T = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p):len(p) + len(r)] = 1
    return ids, mask


@torch.no_grad()
def evaluate(model, tok, problems, reverse, max_new_tokens, n_samples=0, temperature=1.0, k=8,
             batch_size=64, generator=None, prefix="eval", n_show=3, verifier=exact_answer):
    """Greedy accuracy on `problems` [(prompt, answer)] under `verifier` (the task's, default exact
    match), and with n_samples > 0 the sampled pass@1 and pass@k (unbiased estimator, n_samples per
    problem at `temperature`; with fewer than k samples the key says pass@n_samples). At most batch_size
    rows go through the sampler at once (memory: the KV cache grows with them). Returns (metrics,
    examples) where examples are a few (prompt, completion, reward)."""
    correct, passes1, passesk, examples = 0, 0.0, 0.0, []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = encode_prompts(tok, [p for p, _ in chunk], reverse)
        out = generate(model, prompts, max_new_tokens, tok.eos_id, tok.pad_id, temperature=0)
        for j, (rew, text) in enumerate(score_samples(tok, out, [a for _, a in chunk], reverse, verifier)):
            correct += rew
            if len(examples) < n_show:
                examples.append({"prompt": chunk[j][0], "completion": text, "reward": rew})
        step = max(1, batch_size // max(1, n_samples))  # prompts per sampled batch: at most batch_size rows
        for j in range(0, len(chunk) if n_samples > 0 else 0, step):
            out = generate(model, prompts[j:j + step], max_new_tokens, tok.eos_id, tok.pad_id, G=n_samples,
                           temperature=temperature, generator=generator)
            gold = [a for _, a in chunk[j:j + step] for _ in range(n_samples)]
            rew = torch.tensor([r for r, _ in score_samples(tok, out, gold, reverse, verifier)]).view(-1, n_samples)
            for c in rew.sum(1).tolist():
                passes1 += pass_at_k(n_samples, int(c), 1)
                passesk += pass_at_k(n_samples, int(c), min(k, n_samples))
    n = len(problems)
    metrics = {f"{prefix}/accuracy": correct / n, f"{prefix}/n": n}
    if n_samples > 0:
        metrics.update({f"{prefix}/pass@1": passes1 / n, f"{prefix}/{pass_k_name(n_samples, k)}": passesk / n})
    return metrics, examples


def score_samples(tok, out, gold, reverse, verifier=exact_answer):
    """[(reward, completion in normal order)] for each row of a `generate` result. A response that
    never emitted EOS (truncated) scores 0 whatever its text."""
    return [(grade(tok, ids, g, reverse, verifier), parse_answer(tok.decode(ids), reverse))
            for ids, g in zip(responses(out), gold)]


def grade(tok, ids, gold, reverse, verifier=exact_answer):
    """Reward of one response (its sampled token ids): the verifier's score of its text if it ended
    with EOS, 0 for a truncated response whatever its text, and 0 when a special token (PAD, a
    second EOS) comes before the end: decode drops those, so "10<pad>81" would read as "1081"."""
    if not ids or ids[-1] != tok.eos_id or any(i in tok.special_ids for i in ids[:-1]):
        return 0.0
    return verifier(tok.decode(ids[:-1]), gold, reverse=reverse)


def verifier_of(name):
    """The reward function verify.VERIFIERS[name], or a UserError naming the valid ones."""
    from verify import VERIFIERS
    if name not in VERIFIERS:
        raise UserError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]
