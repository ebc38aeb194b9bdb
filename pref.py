"""
Preference optimisation (DPO, IPO, KTO; SimPO and ORPO without a reference) and the supervised
baselines (sft: continued SFT on the gold answers; rft: rejection-sampling fine-tuning on the
verified-correct samples), run by rl.py's loop like any other loss:

    python rl.py --loss=dpo                 # offline pairs from data/<task>/pairs_train.jsonl
    python rl.py --loss=kto --pairs=online  # a right and a wrong answer sampled from the policy
    python rl.py --loss=rft                 # does RL beat plain supervised training?

A step's data becomes (prompt ids, answer ids) rows here, and the rows become the loss.
"""
import torch

import losses as L
from ddp import all_reduce
from evaluate import gold_rows, pack, record_rows, responses


def offline_rows(loss, tok, items, reverse):
    """sft: train problems -> their gold rows; dpo/ipo: offline pairs -> chosen rows then rejected
    rows; kto: labelled answers -> (rows, labels (N,)). Returns (rows, labels or None)."""
    return (gold_rows(tok, items, reverse), None) if loss == "sft" else record_rows(tok, items, reverse)


def rollout_rows(batch, loss, G):
    """A rollout -> (rows, labels): rft keeps the verified-correct samples; a preference loss takes
    one (correct, wrong) pair per group (every group holds both): chosen rows then rejected rows,
    and KTO's labels mark the correct half desirable."""
    correct = batch["correct"].view(-1, G).cpu()  # (groups, G)
    if loss == "rft":
        picked = correct.flatten().nonzero().flatten().tolist()
    else:
        first = torch.arange(correct.size(0)) * G  # (groups,) each group's first row
        picked = (first + correct.argmax(1)).tolist() + (first + correct.argmin(1)).tolist()
    resp, P = responses(batch), batch["prompt_len"]
    rows = [(batch["ids"][r, int(batch["offsets"][r]):P].tolist(), resp[r]) for r in picked]
    return rows, (None if loss == "rft" else torch.arange(len(rows)) < len(rows) // 2)


def row_logps(model, rows, pad_id):
    """(logp, mask), both (N, T-1): the answer tokens' log-probs of (prompt ids, answer ids) rows."""
    ids, mask = (t.to(next(model.parameters()).device) for t in pack(rows, pad_id))  # (N, T) each
    return L.response_logps(model(ids), ids, mask)


def seq_logps(model, rows, pad_id):
    """(N,) sum of the answer tokens' log-probs of each (prompt ids, answer ids) row."""
    return L.masked_sum(*row_logps(model, rows, pad_id), dim=1)


def loss(model, ref, tok, rows, labels, name, hp):
    """One batch's loss and stats. The loss is a mean over every DDP rank's rows (sft, rft: answer
    tokens), so the ranks' summed gradients are the whole batch's. DPO/IPO/SimPO/ORPO rows are n
    chosen then n rejected; KTO's reference point z comes from mismatched pairs (answer i+1 after
    prompt i), per rank."""
    if L.ALGOS[name].family == "sft":  # the per-token NLL of the answers, at temperature 1
        lp, m = row_logps(model, rows, tok.pad_id)  # (N, T-1) each
        loss, st = L.nll_loss(lp, m, n_tokens=all_reduce(m.sum().item()).item())
        return loss, {"rl/nll": st["nll"].item(), "rl/n_seqs": len(rows), "rl/n_tokens": m.sum().item()}
    free = name in ("simpo", "orpo")  # reference-free: no reference forward
    with torch.no_grad():
        ref_lp = None if free else seq_logps(ref, rows, tok.pad_id)  # (N,)
        if name == "kto":
            mismatched = [(p, rows[(i + 1) % len(rows)][1]) for i, (p, _) in enumerate(rows)]
            mis = seq_logps(model, mismatched, tok.pad_id), seq_logps(ref, mismatched, tok.pad_id)
    pi = seq_logps(model, rows, tok.pad_id)  # (N,)
    length = torch.tensor([float(len(r)) for _, r in rows], device=pi.device)  # (N,) |y|, EOS included
    n = len(rows) // 2
    if name == "kto":
        loss, st = L.kto_loss(pi, ref_lp, labels.to(pi.device), *mis, length=length, **hp)
    elif free:
        loss, st = L.ALGOS[name].fn(pi[:n], pi[n:], length[:n], length[n:], **hp)
    else:
        loss, st = L.dpo_loss(pi[:n], pi[n:], ref_lp[:n], ref_lp[n:], chosen_len=length[:n], **hp)
    stats = {**{f"rl/{k}": float(v) for k, v in st.items()}, "rl/n_seqs": len(rows)}
    if not free:
        stats["rl/log_ratio"] = (pi.detach() - ref_lp).mean().item()  # mean log pi/ref of the answers
    return loss * len(rows) / all_reduce(float(len(rows))).item(), stats
