"""Arithmetic tasks, generated in code (seeded) as plain text files, and their loaders.

    python -m data.tasks --task=mul  # data/mul/{train,val,test}.txt, pairs_*.jsonl, kto_*.jsonl

A split file holds one problem `a*b=c` per line, in normal digit order; splits are disjoint by
unordered operand pair (`23*47` and `47*23` share one) and depend only on the data seed. Tune on
`val`, report `test`. reverse=True (least-significant digit first) is an encoding detail of
format_prompt / format_answer / parse_answer. `mul_text` words mul's prompts (gpt2.text_prompt).
pairs_<split>.jsonl: {"prompt", "chosen", "rejected", "kind"}, rejected one of WRONG_KINDS in
turn; kto_<split>.jsonl: {"prompt", "completion", "label"}, label true = desirable. Your own task:
a folder of train.txt, val.txt, test.txt, one `prompt=answer` per line (docs/guides.md).
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
WRONG_KINDS = ["last_digit", "carry", "swap", "neighbour", "length"]


class DataError(ValueError):
    pass


def compute(op, a, b):
    return a * b if op == "*" else a + b


def format_prompt(prompt, reverse):
    """Normal-order prompt -> what the model reads: with reverse, operands least-significant digit
    first too ("23*47=" -> "32*74="), so digit i of each operand lines up with the answer's."""
    return re.sub(r"\d+", lambda m: m.group()[::-1], prompt) if reverse else prompt


def format_answer(answer, reverse):
    """Normal-order answer -> the digits the model writes."""
    return answer[::-1] if reverse else answer


def parse_answer(text, reverse):
    """What the model wrote -> normal order (for people and the verifier)."""
    return text[::-1] if reverse else text


def split_pairs(task, seed=DATA_SEED):
    """{split: [(a, b), ...]} of unordered operand pairs (a <= b), disjoint across splits."""
    t = TASKS[task]
    rng = random.Random(seed)
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
    ans = str(compute(op, a, b))
    for _ in range(100):
        d = list(ans)
        if kind == "last_digit":  # last digit off by 1..3
            d[-1] = str((int(d[-1]) + rng.choice([-3, -2, -1, 1, 2, 3])) % 10)
        elif kind == "carry":  # a dropped or extra carry: one higher digit off by one
            i = rng.randrange(0, max(1, len(d) - 1))
            d[i] = str((int(d[i]) + rng.choice([-1, 1])) % 10)
        elif kind == "swap":  # two adjacent digits swapped
            i = rng.randrange(0, len(d) - 1) if len(d) > 1 else 0
            d[i:i + 2] = d[i:i + 2][::-1]
        elif kind == "neighbour":  # the result of a neighbouring problem
            d = list(str(compute(op, a + rng.choice([-1, 1]), b)))
        elif kind == "length":  # a digit dropped or repeated
            i = rng.randrange(len(d))
            d = d[:i] + d[i + 1:] if rng.random() < 0.5 and len(d) > 1 else d[:i] + [d[i]] + d[i:]
        else:
            raise DataError(f"unknown wrong-answer kind {kind!r}; valid: {WRONG_KINDS}")
        w = "".join(d)
        if w != ans and w and (w == "0" or w[0] != "0"):
            return w
    return str(int(ans) + 1)  # every kind failed (tiny answers): still plausible and wrong


def _write(path, lines):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)  # atomic: a half-written file never looks complete


def ensure_data(task, data_dir=DATA_DIR, seed=DATA_SEED):
    """The task's folder, its files generated if missing. A task not in TASKS is your own folder
    holding train.txt, val.txt and test.txt, returned as is."""
    if task not in TASKS:
        if not Path(task).is_dir():
            raise DataError(f"unknown task {task!r}; valid: {sorted(TASKS)}, or a folder holding "
                            f"train.txt, val.txt, test.txt")
        missing = [f"{s}.txt" for s in SPLITS if not (Path(task) / f"{s}.txt").is_file()]
        if missing:
            raise DataError(f"task folder {task} lacks {', '.join(missing)} "
                            f"(one 'prompt=answer' problem per line)")
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
        _write(root / f"{split}.txt", [p + a for p, a in probs])
        pref, kto = [], []
        for i, (prompt, ans) in enumerate(probs):
            kind = WRONG_KINDS[i % len(WRONG_KINDS)]  # an even, fixed mix of kinds
            wrong = wrong_answer(kind, *map(int, prompt[:-1].split(op)), op, rng)
            pref.append({"prompt": prompt, "chosen": ans, "rejected": wrong, "kind": kind})
            kto.append({"prompt": prompt, "completion": wrong if i % 2 else ans,
                        "label": i % 2 == 0})
        _write(root / f"pairs_{split}.jsonl", map(json.dumps, pref))
        _write(root / f"kto_{split}.jsonl", map(json.dumps, kto))
        print(f"  {split}: {len(probs)} problems from {len(pairs)} operand pairs", flush=True)
    (root / "done").write_text(stamp)
    return root


def task_alphabet(task, problems):
    """The char tokenizer's alphabet: ALPHABET for a built-in task; for your own task ALPHABET plus
    every other character of its problems, sorted (so the same files always give the same ids)."""
    if task in TASKS:
        return ALPHABET
    return ALPHABET + "".join(sorted(set("".join(p + a for p, a in problems)) - set(ALPHABET)))


def _lines(path, what):
    """[(line number, stripped line)] of a UTF-8 file's non-blank lines (BOM and CRLF are fine)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read {what} file ({e.__class__.__name__}: {e})") from None
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _check_chars(text, alphabet, where):
    bad = next((c for c in text if alphabet is not None and c not in alphabet), None)
    if bad is not None:
        raise DataError(f"{where} character {bad!r}, not in the task alphabet {alphabet!r}")


def load_problems(path, alphabet=ALPHABET):
    """`prompt=answer` lines -> [(prompt, answer)]; a malformed line is an error naming the file
    and line. alphabet None: any character."""
    out = []
    for n, line in _lines(path, "problems"):
        _check_chars(line, alphabet, f"{path}:{n}:")
        if line.count("=") != 1:
            raise DataError(f"{path}:{n}: expected one 'prompt=answer' problem per line, "
                            f"got {line!r}")
        prompt, answer = line.split("=")
        out.append((prompt + "=", answer))
    if not out:
        raise DataError(f"{path}: no problems in file")
    return out


def load_split(task, split):
    """[(prompt, answer)] of one split of a task (generated on first use); a text task's prompts in
    words; your own task's folder read as is, any characters allowed."""
    if task not in TASKS:
        return load_problems(ensure_data(task) / f"{split}.txt", alphabet=None)
    problems = load_problems(ensure_data(task) / f"{split}.txt")
    if TASKS[task].get("text"):
        from gpt2 import text_prompt  # the GPT-2-size extras, imported only for a text task
        problems = [(text_prompt(p), a) for p, a in problems]
    return problems


RECORD_FIELDS = {"pairs": {"prompt": str, "chosen": str, "rejected": str},  # "kind" optional
                 "kto": {"prompt": str, "completion": str, "label": bool}}


def load_records(path, kind, alphabet=ALPHABET):
    """Preference pairs (kind "pairs") or KTO labels ("kto") from JSONL -> [dict]. Bad JSON, a
    missing or mistyped field, a character outside the alphabet or an empty file is an error
    naming the file and line."""
    fields, out = RECORD_FIELDS[kind], []
    for n, line in _lines(path, kind):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a JSON object with fields {sorted(fields)}")
        for k, typ in fields.items():
            if not isinstance(rec.get(k), typ):
                raise DataError(f"{path}:{n}: field {k!r} missing or not a {typ.__name__} "
                                f"(fields: {sorted(fields)})")
            if typ is str:
                _check_chars(rec[k], alphabet, f"{path}:{n}: field {k!r} has")
        out.append(rec)
    if not out:
        raise DataError(f"{path}: no {kind} records in file")
    return out


if __name__ == "__main__":
    task = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--task=")), "mul")
    print(ensure_data(task))
