"""Arithmetic tasks, generated in code (seeded) as plain text files, and the loaders for them.

    python -m data.tasks --task=mul  # data/mul/{train,val,test}.txt, pairs_*.jsonl, kto_*.jsonl

<split>.txt: one `a*b=c` per line, normal digit order; splits are disjoint by unordered operand
pair (23*47 goes with 47*23); tune on val, report test. pairs_*.jsonl: {"prompt", "chosen",
"rejected", "kind"}; kto_*.jsonl: {"prompt", "completion", "label"}, label true = desirable.
Your own task: a folder of {train,val,test}.txt, one `prompt=answer` per line (docs/guides.md).
"""
import json
import os
import random
import re
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
ALPHABET = "0123456789+*=-"  # the char tokenizer's alphabet, shared by every arithmetic task
TASKS = {  # name -> operator, operand range (inclusive), max unordered pairs, extra train lo
    "mul": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0),  # 2-digit x 2-digit: all 4,095
    "add": dict(op="+", lo=100, hi=999, max_pairs=20000, aux_lo=None),  # 3+3 digits: a subset
    "mul_text": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0, text=True),  # mul, in words
}
SPLITS = {"train": 0.85, "val": 0.05, "test": 0.1}
DATA_SEED = 1337
WRONG_KINDS = ["last_digit", "carry", "swap", "neighbour", "length"]  # pairs files take turns
RECORD_FIELDS = {"pairs": {"prompt": str, "chosen": str, "rejected": str},  # "kind" optional
                 "kto": {"prompt": str, "completion": str, "label": bool}}


class DataError(ValueError):
    """A task name or file that cannot be used; the message names the file and line."""


def compute(op, a, b):
    return a * b if op == "*" else a + b


def format_prompt(prompt, reverse):
    """Normal-order prompt -> what the model reads: reverse flips each operand too ("23*47=" ->
    "32*74="), so digit i of each operand lines up with the answer's."""
    return re.sub(r"\d+", lambda m: m.group()[::-1], prompt) if reverse else prompt


def format_answer(answer, reverse):
    """Normal-order answer -> the digits the model writes (reverse: least-significant first)."""
    return answer[::-1] if reverse else answer


parse_answer = format_answer  # what the model wrote -> normal order: reversing is its own inverse


def split_pairs(task, seed=DATA_SEED):
    """{split: [(a, b), ...]} of unordered operand pairs (a <= b), disjoint across splits."""
    t, rng = TASKS[task], random.Random(seed)
    lo, hi = t["lo"], t["hi"]
    if t["max_pairs"] is None:
        pairs = [(a, b) for a in range(lo, hi + 1) for b in range(a, hi + 1)]
    else:
        seen, n = set(), hi - lo + 1
        while len(seen) < min(t["max_pairs"], n * (n + 1) // 2):
            seen.add(tuple(sorted((rng.randint(lo, hi), rng.randint(lo, hi)))))
        pairs = sorted(seen)
    rng.shuffle(pairs)
    n_val, n_test = int(SPLITS["val"] * len(pairs)), int(SPLITS["test"] * len(pairs))
    # curriculum: problems with a shorter operand (e.g. 7*46) join train only, never held out
    aux_lo = lo if t["aux_lo"] is None else t["aux_lo"]
    aux = [(a, b) for a in range(aux_lo, lo) for b in range(a, hi + 1)]
    return {"val": pairs[:n_val], "test": pairs[n_val:n_val + n_test],
            "train": pairs[n_val + n_test:] + aux}


def problems_of(pairs, op):
    """Both orders of every pair: [(prompt, answer)], e.g. ("23*47=", "1081")."""
    orders = [(x, y) for a, b in pairs for x, y in (((a, b), (b, a)) if a != b else ((a, b),))]
    return [(f"{x}{op}{y}=", str(compute(op, x, y))) for x, y in orders]


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


def _write(path, lines):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)  # atomic: a half-written file never looks complete


def ensure_data(task, data_dir=DATA_DIR, seed=DATA_SEED):
    """The task's folder, its files generated if missing; a task not in TASKS is your own folder."""
    if task not in TASKS:
        missing = [f"{s}.txt" for s in SPLITS if not (Path(task) / f"{s}.txt").is_file()]
        if missing:
            raise DataError(f"unknown task {task!r}; valid: {sorted(TASKS)}, or a folder holding "
                            f"train.txt, val.txt, test.txt ({task} lacks {', '.join(missing)})")
        return Path(task)
    root = Path(data_dir) / task
    stamp = json.dumps({"seed": seed, "task": TASKS[task], "splits": SPLITS, "kinds": WRONG_KINDS})
    if (root / "done").exists() and (root / "done").read_text() == stamp:
        return root  # generated by this very recipe
    root.mkdir(parents=True, exist_ok=True)
    print(f"generating data for task {task!r} in {root} ...", flush=True)
    op, rng = TASKS[task]["op"], random.Random(seed + 1)
    for split, pairs in split_pairs(task, seed).items():
        probs = problems_of(pairs, op)
        pref, kto = [], []
        for i, (prompt, ans) in enumerate(probs):
            kind = WRONG_KINDS[i % len(WRONG_KINDS)]  # an even, fixed mix of kinds
            wrong = wrong_answer(kind, *map(int, prompt[:-1].split(op)), op, rng)
            pref.append(dict(prompt=prompt, chosen=ans, rejected=wrong, kind=kind))
            kto.append(dict(prompt=prompt, completion=wrong if i % 2 else ans, label=i % 2 == 0))
        _write(root / f"{split}.txt", [p + a for p, a in probs])
        _write(root / f"pairs_{split}.jsonl", map(json.dumps, pref))
        _write(root / f"kto_{split}.jsonl", map(json.dumps, kto))
        print(f"  {split}: {len(probs)} problems from {len(pairs)} operand pairs", flush=True)
    (root / "done").write_text(stamp)
    return root


def labelled(problems, n):
    """The first n problems of a seeded shuffle (a smaller n keeps a subset of a larger); 0 = all."""
    order = random.Random(DATA_SEED + 2).sample(range(len(problems)), len(problems))
    return [problems[i] for i in order[:n]] if n else problems


def task_alphabet(task, problems):
    """The char tokenizer's alphabet: ALPHABET, plus for your own task every other character of its
    problems, sorted (the same files always give the same ids)."""
    text = "" if task in TASKS else "".join(p + a for p, a in problems)
    return ALPHABET + "".join(sorted(set(text) - set(ALPHABET)))


def _lines(path, what):
    """[("path:n:", line)] of a UTF-8 file's non-blank lines, stripped (BOM and CRLF are fine)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read {what} ({e.__class__.__name__}: {e})") from None
    out = [(f"{path}:{n}:", s.strip()) for n, s in enumerate(text.splitlines(), 1) if s.strip()]
    if not out:
        raise DataError(f"{path}: no {what} in file")
    return out


def _check_chars(text, alphabet, where):  # alphabet None: any character
    bad = [c for c in text if c not in alphabet] if alphabet else []
    if bad:
        raise DataError(f"{where} character {bad[0]!r}, not in the task alphabet {alphabet!r}")


def load_problems(path, alphabet=ALPHABET):
    """`prompt=answer` lines -> [(prompt, answer)]. alphabet None: any character."""
    out = []
    for where, line in _lines(path, "problems"):
        _check_chars(line, alphabet, where)
        if line.count("=") != 1:
            raise DataError(f"{where} expected one 'prompt=answer' problem per line, got {line!r}")
        prompt, answer = line.split("=")
        out.append((prompt + "=", answer))
    return out


def load_split(task, split):
    """[(prompt, answer)] of a split (generated on first use); your own task's, any characters."""
    path = ensure_data(task) / f"{split}.txt"
    problems = load_problems(path, ALPHABET if task in TASKS else None)
    if TASKS.get(task, {}).get("text"):
        from gpt2 import text_prompt  # the GPT-2-size extras, imported only for a text task
        problems = [(text_prompt(p), a) for p, a in problems]
    return problems


def load_records(path, kind, alphabet=ALPHABET):
    """Preference pairs (kind "pairs") or KTO labels ("kto") from JSONL -> [dict]."""
    fields, out = RECORD_FIELDS[kind], []
    for where, line in _lines(path, f"{kind} records"):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where} expected a JSON object with fields {sorted(fields)}")
        for k, typ in fields.items():
            if not isinstance(rec.get(k), typ):
                raise DataError(f"{where} field {k!r} missing or not a {typ.__name__}")
            if typ is str:
                _check_chars(rec[k], alphabet, f"{where} field {k!r} has")
        out.append(rec)
    return out


if __name__ == "__main__":
    print(ensure_data(sys.argv[1].removeprefix("--task=") if sys.argv[1:] else "mul"))
