"""
Arithmetic tasks, generated in code and written as plain text files (seeded, quick).

    python -m data.tasks --task=mul       # writes data/mul/{train,val,test}.txt, pairs and KTO labels

Your own task is a folder with train.txt, val.txt and test.txt, one `prompt=answer` problem per line
(any characters except '=' in the answer): `python sft.py --task=path/to/folder --reverse=false
--verifier=text` (a name in verify.VERIFIERS; see docs/guides.md, "bring your own task").
Text tasks (`mul_text`) are for BPE tokenizers: their symbolic twin's problems and splits, asked
in words by gpt2.text_prompt (`load_split` words the prompts; the files stay `a*b=c`).

Each line of a split file is one problem `a*b=c`, answer in normal digit order. Problems are split
train/val/test **by unordered operand pair**: {23, 47} puts `23*47` and `47*23` in the same split,
so no held-out problem (nor its mirror) is ever trained on. The split depends only on the data
seed, never on a training seed. Tune on `val`, report `test`.

The model may read and write numbers least-significant digit first (`reverse=True`: it sees
`32*74=1801` for `23*47=1081`), which small transformers learn much faster; that is an encoding
detail (`format_prompt`/`format_answer`/`parse_answer`): files and everything a person sees stay
in normal order.

Preference data, JSONL:
  pairs_<split>.jsonl  {"prompt", "chosen", "rejected", "kind"}  chosen = the right answer,
                       rejected = a plausible wrong one of a fixed mix of kinds (WRONG_KINDS)
  kto_<split>.jsonl    {"prompt", "completion", "label"}          label true = desirable
"""
import json
import os
import random
import re
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
ALPHABET = "0123456789+*=-"  # the char tokenizer's alphabet, shared by every arithmetic task
TASKS = {  # name -> operator, operand range (inclusive), max number of unordered pairs, extra train lo
    "mul": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0),  # 2-digit x 2-digit: all 4,095 pairs
    "add": dict(op="+", lo=100, hi=999, max_pairs=20000, aux_lo=None),  # 3-digit + 3-digit: a seeded subset
    "mul_text": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0, text=True),  # mul's problems and splits, in words
}
SPLITS = {"train": 0.85, "val": 0.05, "test": 0.1}
DATA_SEED = 1337
WRONG_KINDS = ["last_digit", "carry", "swap", "neighbour", "length"]


class DataError(ValueError):
    pass


def compute(op, a, b):
    return a * b if op == "*" else a + b


def format_prompt(prompt, reverse):
    """Normal-order prompt -> what the model reads: with reverse, every operand least-significant
    digit first too ("23*47=" -> "32*74="), so digit i of each operand lines up with digit i of
    the answer. (Measured here: reversed answers alone plateau near 40% held-out; reversed
    operands as well reach 80%+ in the same number of steps.)"""
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
    n = t["hi"] - t["lo"] + 1
    if t["max_pairs"] is None:
        pairs = [(a, b) for a in range(t["lo"], t["hi"] + 1) for b in range(a, t["hi"] + 1)]
    else:
        seen = set()
        while len(seen) < min(t["max_pairs"], n * (n + 1) // 2):
            a, b = sorted((rng.randint(t["lo"], t["hi"]), rng.randint(t["lo"], t["hi"])))
            seen.add((a, b))
        pairs = sorted(seen)
    rng.shuffle(pairs)
    n_val, n_test = int(SPLITS["val"] * len(pairs)), int(SPLITS["test"] * len(pairs))
    # curriculum: problems with a shorter operand (e.g. 7*46) join train only; they are never held out
    aux = [(a, b) for a in range(t["aux_lo"], t["lo"]) for b in range(a, t["hi"] + 1)] if t["aux_lo"] is not None else []
    return {"val": pairs[:n_val], "test": pairs[n_val:n_val + n_test], "train": pairs[n_val + n_test:] + aux}


def problems_of(pairs, op):
    """Both orders of every pair: [(prompt, answer)], e.g. ("23*47=", "1081")."""
    out = []
    for a, b in pairs:
        for x, y in ((a, b), (b, a)) if a != b else ((a, b),):
            out.append((f"{x}{op}{y}=", str(compute(op, x, y))))
    return out


def wrong_answer(kind, a, b, op, rng):
    """A plausible wrong answer (normal order, no leading zero) of one documented kind."""
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
    """Generate the task's files if they are missing; returns the task folder. A task that is not a
    name in TASKS but a folder holding train.txt, val.txt and test.txt is your own: returned as is."""
    if task not in TASKS:
        if Path(task).is_dir():
            missing = [f"{s}.txt" for s in SPLITS if not (Path(task) / f"{s}.txt").is_file()]
            if missing:
                raise DataError(f"task folder {task} lacks {', '.join(missing)} (one 'prompt=answer' problem per line)")
            return Path(task)
        raise DataError(f"unknown task {task!r}; valid: {sorted(TASKS)}, or a folder holding train.txt, val.txt, test.txt")
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
            a, b = map(int, prompt[:-1].split(op))
            kind = WRONG_KINDS[i % len(WRONG_KINDS)]  # an even, fixed mix of kinds
            wrong = wrong_answer(kind, a, b, op, rng)
            pref.append(json.dumps({"prompt": prompt, "chosen": ans, "rejected": wrong, "kind": kind}))
            kto.append(json.dumps({"prompt": prompt, "completion": ans if i % 2 == 0 else wrong, "label": i % 2 == 0}))
        _write(root / f"pairs_{split}.jsonl", pref)
        _write(root / f"kto_{split}.jsonl", kto)
        print(f"  {split}: {len(probs)} problems from {len(pairs)} operand pairs", flush=True)
    (root / "done").write_text(stamp)
    return root


def task_alphabet(task, problems):
    """The char tokenizer's alphabet: ALPHABET for a built-in task; for your own task ALPHABET plus
    every other character of its problems, sorted (so the same files always give the same ids)."""
    if task in TASKS:
        return ALPHABET
    return ALPHABET + "".join(sorted(set("".join(p + a for p, a in problems)) - set(ALPHABET)))


def load_problems(path, alphabet=ALPHABET):
    """Read `prompt=answer` lines -> [(prompt, answer)]. Tolerates a BOM, CRLF and blank lines;
    anything else malformed is an error naming the file and line. alphabet None: any character."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read problems file ({e.__class__.__name__}: {e})") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        bad = next((c for c in line if alphabet is not None and c not in alphabet), None)
        if bad is not None:
            raise DataError(f"{path}:{n}: character {bad!r} is not in the task alphabet {alphabet!r}")
        if line.count("=") != 1:
            raise DataError(f"{path}:{n}: expected one 'prompt=answer' problem per line, got {line!r}")
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
    """Read preference pairs (kind "pairs") or KTO labels ("kto") from JSONL -> [dict]. Bad JSON, a
    missing or mistyped field, a character outside the alphabet, or an empty file is an error
    naming the file and line."""
    fields = RECORD_FIELDS[kind]
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read {kind} file ({e.__class__.__name__}: {e})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a JSON object with fields {sorted(fields)}")
        for k, typ in fields.items():
            if not isinstance(rec.get(k), typ):
                raise DataError(f"{path}:{n}: field {k!r} missing or not a {typ.__name__} (fields: {sorted(fields)})")
            bad = next((c for c in rec[k] if c not in alphabet), None) if typ is str else None
            if bad is not None:
                raise DataError(f"{path}:{n}: field {k!r} has character {bad!r}, not in the task alphabet {alphabet!r}")
        out.append(rec)
    if not out:
        raise DataError(f"{path}: no {kind} records in file")
    return out


if __name__ == "__main__":
    task = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--task=")), "mul")
    print(ensure_data(task))
