"""
Preference optimisation (DPO, IPO, KTO; SimPO and ORPO without a reference) and the supervised
baselines (sft: continued SFT on gold answers; rft: rejection-sampling fine-tuning on the
verified-correct samples), opened by the algorithms of family pref and sft:

    python rl.py --loss=dpo                 # offline pairs from data/<task>/pairs_train.jsonl
    python rl.py --loss=kto --pairs=online  # a right and a wrong answer sampled from the policy
    python rl.py --loss=rft                 # does RL beat plain supervised training?

A step's data becomes (prompt ids, answer ids) rows, and the rows become the algorithm's loss.
Their losses (losses.py: dpo_loss, kto_loss, simpo_loss, orpo_loss, nll_loss) take (B,) sums
of response log-probs, the policy's (with grad) and the reference's.
"""
from dataclasses import dataclass

import json
import random

import torch

from data.tasks import (ALPHABET, DATA_DIR, DATA_SEED, TASKS, DataError, compute, ensure_data,
                        labelled, problems_of, read_jsonl, split_pairs, write)
from losses import add_stats, nll_loss
from model import logprobs, optimizer_step, responses
from nanorl.config import UserError
from nanorl.ddp import all_reduce, world_size
from nanorl.rows import pack, record_rows
from verify import episode_return


@dataclass
class Flags:  # rl.py's flags of the preference algorithms
    pairs: str = "offline"  # from the data files, or "online": from the policy's samples
    pairs_per_step: int = 256  # offline pairs per step (kto: 2x answers; sft: gold rows)


# ------------------------------------------ pairs data
WRONG_KINDS = ["last_digit", "carry", "swap", "neighbour", "length"]  # pairs files take turns
RECORD_FIELDS = {"pairs": {"prompt": str, "chosen": str, "rejected": str},  # "kind" optional
                 "kto": {"prompt": str, "completion": str, "label": bool}}


def wrong_answer(kind, a, b, op, rng):
    """A plausible wrong answer (normal order, no leading zero) of one of WRONG_KINDS."""
    if kind not in WRONG_KINDS:
        raise DataError(f"unknown wrong-answer kind {kind!r}; valid: {WRONG_KINDS}")
    ans = str(compute(op, a, b))
    for _ in range(100):
        if kind == "last_digit":  # last digit off by 1..3
            w = ans[:-1] + str((int(ans[-1]) + rng.choice([-3, -2, -1, 1, 2, 3])) % 10)
        elif kind == "carry":  # a dropped or extra carry: one higher digit off by one
            i = rng.randrange(max(1, len(ans) - 1))
            w = ans[:i] + str((int(ans[i]) + rng.choice([-1, 1])) % 10) + ans[i + 1:]
        elif kind == "swap":  # two adjacent digits swapped
            i = rng.randrange(len(ans) - 1) if len(ans) > 1 else 0
            w = ans[:i] + ans[i:i + 2][::-1] + ans[i + 2:]
        elif kind == "neighbour":  # the result of a neighbouring problem
            w = str(compute(op, a + rng.choice([-1, 1]), b))
        else:  # length: a digit dropped or repeated
            i, drop = rng.randrange(len(ans)), rng.random() < 0.5
            w = ans[:i] + ans[i + 1:] if drop and len(ans) > 1 else ans[:i + 1] + ans[i:]
        if w != ans and (w == "0" or w[0] != "0"):
            return w
    return str(int(ans) + 1)  # every kind failed (tiny answers): still plausible and wrong


def ensure_pairs(task, data_dir=DATA_DIR, seed=DATA_SEED):
    """A built-in task's folder with its preference files, generated once (seeded):
    pairs_<split>.jsonl {"prompt", "chosen", "rejected", "kind"}, one wrong answer of each
    kind in turn, and kto_<split>.jsonl {"prompt", "completion", "label"}, label true =
    desirable. Your own task (a folder) has none: use --pairs=online."""
    root = ensure_data(task, data_dir, seed)
    stamp = json.dumps({"seed": seed, "task": TASKS.get(task), "kinds": WRONG_KINDS})
    if task not in TASKS or (root / "pairs_done").exists() and \
            (root / "pairs_done").read_text() == stamp:
        return root
    op, rng = TASKS[task]["op"], random.Random(seed + 1)
    for split, pairs in split_pairs(task, seed).items():
        pref, kto = [], []
        for i, (prompt, ans) in enumerate(problems_of(pairs, op)):
            kind = WRONG_KINDS[i % len(WRONG_KINDS)]  # an even, fixed mix of kinds
            wrong = wrong_answer(kind, *map(int, prompt[:-1].split(op)), op, rng)
            pref.append(dict(prompt=prompt, chosen=ans, rejected=wrong, kind=kind))
            kto.append(dict(prompt=prompt, completion=wrong if i % 2 else ans, label=i % 2 == 0))
        write(root / f"pairs_{split}.jsonl", map(json.dumps, pref))
        write(root / f"kto_{split}.jsonl", map(json.dumps, kto))
    (root / "pairs_done").write_text(stamp)
    return root


def load_records(path, kind, alphabet=ALPHABET):
    """Preference pairs (kind "pairs") or KTO labels ("kto") from JSONL -> [dict]."""
    return read_jsonl(path, RECORD_FIELDS[kind], alphabet, f"{kind} records")


def check(cfg, algo):
    if cfg.pairs not in ("offline", "online"):
        raise UserError(f"pairs must be offline or online, got {cfg.pairs}")
    if cfg.pairs == "online" and algo.family != "pref":
        raise UserError(f"--pairs picks a preference algorithm's data; {cfg.loss} has no pairs")
    if cfg.pairs == "online" and not cfg.dynamic_sampling:
        raise UserError("online pairs keep only groups with a right and a wrong answer: dynamic "
                        "sampling is always on for them (drop --dynamic_sampling=false)")


def offline(cfg, algo):
    """Whether the algorithm trains on a step's worth of data files rather than on fresh samples."""
    return algo.data == "gold" or algo.family == "pref" and cfg.pairs == "offline"


def data(cfg, algo, task):
    """What a step draws from: gold problems (sft: only the labels SFT saw), offline pairs or
    KTO answers, else the train prompts."""
    if algo.data == "gold":
        return labelled(task.train, task.n_train)
    if offline(cfg, algo):
        if task.env_module:
            raise UserError(f"{task.name}'s answers are episodes, its pairs files have none: "
                            "use --pairs=online")
        kind = "kto" if algo.data == "labels" else "pairs"  # the files: pairs_*, kto_*.jsonl
        return load_records(ensure_pairs(task.name) / f"{kind}_train.jsonl", kind)
    return task.train


def step(cfg, algo, run, batch, lr):
    """One preference or supervised step on this rank's rows: offline ones drawn from the data
    files, online ones picked from the rollout batch (None: no group had a right and a wrong
    answer) -> its stats (none when some rank has no rows)."""
    task = run.task
    if offline(cfg, algo):
        n = cfg.pairs_per_step // world_size() * (2 if algo.data == "labels" else 1)
        items = [task.train[i] for i in run.prompts.draw(n)]
        rows, labels = (task.gold_rows(items), None) if algo.data == "gold" \
            else record_rows(task.tok, items, task.reverse)
    else:
        rows, labels = rollout_rows(batch, algo, cfg.group_size) if batch else ([], None)
    if all_reduce(float(not rows), "max").item():  # on any rank: no update
        return {}
    run.opt.zero_grad()
    loss, stats = rows_loss(run.compiled, run.ref, task.tok.pad_id, rows, labels, algo, run.hp,
                            cfg.micro_batch_size)
    run.ranks.sync(run.model)  # each rank divided by the global counts: the sum is the batch's
    gnorm = optimizer_step(run.model, run.opt, loss, lr, cfg.grad_clip)
    return {**stats, "rl/loss": loss.item(), "rl/grad_norm": gnorm.item(), "rl/lr": lr}


def rollout_rows(batch, algo, G):
    """A rollout -> (rows, labels): rft keeps the verified-correct samples (a score of 1, as
    accuracy counts it: partial credit is not correct); a pair algorithm takes each group's best and
    worst sample by episode return, the score plus an environment's turn rewards (what dynamic
    sampling tests: it kept only groups whose returns differ): chosen rows, then rejected rows,
    and KTO's labels mark the chosen half desirable."""
    if algo.data == "samples":
        picked = (batch.score == 1).nonzero().flatten().tolist()
    else:
        ret = episode_return(batch.score, batch.turn_rewards).view(-1, G).cpu()  # (groups, G)
        first = torch.arange(ret.size(0)) * G  # (groups,) each group's first row
        picked = (first + ret.argmax(1)).tolist() + (first + ret.argmin(1)).tolist()
    resp, P = responses(batch), batch.ids.size(1) - batch.mask.size(1)
    rows = [(batch.ids[r, int(batch.offsets[r]):P].tolist(), resp[r],
             batch.mask[r, :len(resp[r])].tolist())
            for r in picked]  # (prompt, response, its action mask)
    return rows, (None if algo.data == "samples" else torch.arange(len(rows)) < len(rows) // 2)


def row_logps(model, rows, pad_id, max_rows=None):
    """(logp, mask), both (N, L): the answer tokens' log-probs of (prompt, answer) rows, at most
    max_rows rows a forward."""
    dev = next(model.parameters()).device
    ids, offsets, mask = (t.to(dev) for t in pack(rows, pad_id, left=True))
    return logprobs(model, ids, offsets, mask, max_rows=max_rows)[0], mask


def seq_logps(model, rows, pad_id, max_rows=None):
    """(N,) the sum of the answer tokens' log-probs of each (prompt, answer) row."""
    return row_logps(model, rows, pad_id, max_rows)[0].sum(1)  # 0 off the mask


def rows_loss(model, ref, pad_id, rows, labels, algo, hp, max_rows=None):
    """Backward of one batch's loss, at most max_rows rows a forward (memory) -> (the loss,
    detached; stats). The loss is a mean over every DDP rank's units, pairs, answers (kto) or
    answer tokens (sft, rft), so micro-batches and ranks add up to the whole batch's gradient.
    Pair rows are n chosen then n rejected; KTO's reference point z comes from mismatched
    pairs (answer i+1 after prompt i), per rank."""
    pairs = algo.data == "pairs"
    n = len(rows) // 2 if pairs else len(rows)  # this rank's units
    length = pack(rows, pad_id, left=True)[2].sum(1).float()  # (N,) |y|: the policy's tokens
    with torch.no_grad():
        ref_lp = seq_logps(ref, rows, pad_id, max_rows) if "ref" in algo.needs else None  # (N,)
        if algo.data == "labels":
            mismatched = [(p, *rows[(i + 1) % len(rows)][1:]) for i, (p, *_) in enumerate(rows)]
            labels = (labels, seq_logps(model, mismatched, pad_id, max_rows),
                      seq_logps(ref, mismatched, pad_id, max_rows))
    total = all_reduce(float(length.sum() if algo.family == "sft" else n)).item()
    size = max(1, (max_rows or len(rows)) // (2 if pairs else 1))  # units per forward
    loss, stats = 0.0, {}
    for i in range(0, n, size):
        unit = torch.arange(i, min(i + size, n))
        idx = torch.cat([unit, unit + n]) if pairs else unit  # its rows
        lp, m = row_logps(model, [rows[k] for k in idx.tolist()], pad_id)  # (r, L) each
        part, part_stats = unit_loss(algo, hp, lp, m, idx, ref_lp, length.to(lp.device), labels,
                                     total)
        part.backward()
        loss += part.detach()
        w = 1 if algo.family == "sft" else len(unit) / n  # sft's stats add up, others average
        add_stats(stats, part_stats, w)
    return loss, {**stats, "rl/n_seqs": len(rows)}


def unit_loss(algo, hp, lp, m, idx, ref_lp, length, labels, total):
    """The algorithm's loss of some units (their rows idx, log-probs lp and mask m (r, L)), as its
    share of the batch's mean over `total` units (tokens for sft, rft) -> (loss, stats)."""
    if algo.family == "sft":  # the per-token NLL of the answers, at temperature 1
        loss, part_stats = nll_loss(lp, m, n_tokens=total)
        return loss, {"rl/nll": part_stats["nll"], "rl/n_tokens": m.sum()}
    pi, length, k = lp.sum(1), length[idx], len(idx) // (2 if algo.data == "pairs" else 1)
    ref = None if ref_lp is None else ref_lp[idx]  # (r,)
    if algo.data == "labels":
        desirable, *mis = labels
        loss, part_stats = algo.objective(pi, ref, desirable[idx].to(pi.device), *mis,
                                          length=length, **hp)
    elif ref is not None:
        loss, part_stats = algo.objective(pi[:k], pi[k:], ref[:k], ref[k:], chosen_len=length[:k],
                                          **hp)
    else:
        loss, part_stats = algo.objective(pi[:k], pi[k:], length[:k], length[k:], **hp)
    stats = {f"rl/{key}": v for key, v in part_stats.items()}
    if ref is not None:
        stats["rl/log_ratio"] = (pi.detach() - ref).mean()  # mean log pi/ref
    return loss * k / total, stats
