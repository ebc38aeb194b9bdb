"""Arithmetic tasks, generated in code (seeded) as plain text files, and their loaders.

    python -m data.tasks --task=mul  # data/mul/{train,val,test}.txt

One `a*b=c` per line, normal digit order; splits are disjoint by unordered operand pair
(23*47 goes with 47*23): tune on val, report test. Your own task: a folder of the three
splits, JSONL ({"prompt": ..., "answer": ...} a line) or `prompt=answer` lines (docs/guides.md).
Preference files: nanorl/pref.py. A task may name an environment (envs/): mul3_tool the
calculator. What a name means (env:NAME, rg:NAME too): nanorl/evaluate.py routes it.
"""
import json
import os
import random
import re
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
ALPHABET = "0123456789+*=-"  # the char tokenizer's, shared by every arithmetic task
TASKS = {  # name -> operator, operand range (inclusive), max unordered pairs, extra train lo
    "mul": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0),  # 2-digit x 2-digit: all 4,095
    "add": dict(op="+", lo=100, hi=999, max_pairs=20000, aux_lo=None),  # 3+3 digits: a subset
    "mul_text": dict(op="*", lo=10, hi=99, max_pairs=None, aux_lo=0, text=True),  # mul, in words
    "mul3": dict(op="*", lo=100, hi=999, max_pairs=5000, aux_lo=None),  # 3 x 3 digits: a subset
    "mul3_tool": dict(op="*", lo=100, hi=999, max_pairs=5000, aux_lo=None, env="calculator"),
}
SPLITS = {"train": 0.85, "val": 0.05, "test": 0.1}
DATA_SEED = 1337
TEXT_OPS = {"*": "times", "+": "plus"}  # text_prompt's words


class DataError(ValueError):
    """A task name or file that cannot be used; the message names the file and line."""


class Row(tuple):
    """A problem (prompt, answer), unpacked as a pair, with its JSONL line's other fields (an
    environment's settings for that row: nanorl/episodes.py's make_env) and its source, the prompt
    before a template wrote it."""

    def __new__(cls, prompt, answer, fields=None, source=None):
        row = super().__new__(cls, (prompt, answer))
        row.fields, row.source = fields or {}, prompt if source is None else source
        return row

    def __getnewargs__(self):  # copies and pickles keep the fields
        return *self, self.fields, self.source


def compute(op, a, b):
    return a * b if op == "*" else a + b


def flip_numbers(text, reverse):
    """Each number of text written backwards when reverse: a prompt as the model reads it
    ("23*47=" -> "32*74=": digit i of each operand lines up with the answer's), an environment's
    text either way (its own inverse); text as it is otherwise."""
    return re.sub(r"\d+", lambda m: m.group()[::-1], text) if reverse else text


def format_answer(answer, reverse):
    """Normal-order answer -> the digits the model writes (reverse: least-significant first)."""
    return answer[::-1] if reverse else answer


parse_answer = format_answer  # what the model wrote -> normal order: its own inverse


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


def atomic_write(path, dump, mode="w"):
    """dump(f) into path.tmp.<pid> (open in mode, the folder made), fsynced, renamed to path: a
    reader finds the whole file or the one before, never half (a killed writer leaves its .tmp)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, mode) as f:
        dump(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write(path, lines):  # a text file, a line each, atomically
    atomic_write(path, lambda f: f.writelines(line + "\n" for line in lines))


def ensure_data(task, data_dir=DATA_DIR, seed=DATA_SEED):
    """The task's folder, its files generated if missing; a task not in TASKS is your own folder."""
    if task not in TASKS:
        missing = [f"{s}.jsonl" for s in SPLITS if not any((Path(task) / f"{s}.{x}").is_file()
                                                           for x in ("jsonl", "txt"))]
        if missing:
            raise DataError(f"unknown task {task!r}; valid: {sorted(TASKS)}, env:NAME, rg:NAME or "
                            f"a folder of train, val, test .jsonl or .txt ({task} lacks "
                            f"{', '.join(missing)})")
        return Path(task)
    root = Path(data_dir) / task
    stamp = json.dumps({"seed": seed, "task": TASKS[task], "splits": SPLITS})
    if (root / "done").exists() and (root / "done").read_text() == stamp:
        return root  # generated by this very recipe
    print(f"generating data for task {task!r} in {root} ...", flush=True)
    for split, pairs in split_pairs(task, seed).items():
        probs = problems_of(pairs, TASKS[task]["op"])
        write(root / f"{split}.txt", [p + a for p, a in probs])
        print(f"  {split}: {len(probs)} problems from {len(pairs)} operand pairs", flush=True)
    (root / "done").write_text(stamp)
    return root


def labelled(problems, n):
    """The first n problems of a seeded shuffle (a smaller n: a subset of a larger); 0 = all."""
    order = random.Random(DATA_SEED + 2).sample(range(len(problems)), len(problems))
    return [problems[i] for i in order[:n]] if n else problems


def read_lines(path, what):
    """[("path:n:", line)] of a UTF-8 file's non-blank lines, stripped (BOM and CRLF are fine).
    Lines end at "\n" only: JSON strings may hold a raw U+2028, U+2029 or U+0085."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read {what} ({e.__class__.__name__}: {e})") from None
    out = [(f"{path}:{n}:", s.strip()) for n, s in enumerate(text.split("\n"), 1) if s.strip()]
    if not out:
        raise DataError(f"{path}: no {what} in file")
    return out


def check_chars(text, alphabet, where):  # alphabet None: any character
    bad = [c for c in text if c not in alphabet] if alphabet else []
    if bad:
        raise DataError(f"{where} character {bad[0]!r}, not in the task alphabet {alphabet!r}")


def read_jsonl(path, fields, alphabet=None, what="records"):
    """One JSON object a line -> [dict]; fields {name: type} must be there (answer may be named
    ground_truth), strings within alphabet; a bad line is one error naming path:line."""
    out = []
    for where, line in read_lines(path, what):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where} expected a JSON object with fields {list(fields)}")
        for k, typ in fields.items():
            rec[k] = rec.get(k, rec.get("ground_truth") if k == "answer" else None)
            if not isinstance(rec[k], typ):
                raise DataError(f"{where} field {k!r} missing or not a "
                                f"{'string' if typ is str else typ.__name__}")
            if typ is str and not rec[k]:
                raise DataError(f"{where} field {k!r} is empty")
            if typ is str:
                check_chars(rec[k], alphabet, f"{where} field {k!r} has")
        out.append(rec)
    return out


def load_problems(path, alphabet=ALPHABET):
    """`prompt=answer` lines -> [(prompt, answer)]. alphabet None: any character."""
    out = []
    for where, line in read_lines(path, "problems"):
        check_chars(line, alphabet, where)
        if line.count("=") != 1 or line.endswith("="):
            raise DataError(f"{where} expected one 'prompt=answer' problem per line, got {line!r}")
        prompt, answer = line.split("=")
        out.append((prompt + "=", answer))
    return out


def problem_key(text):
    """A problem's numbers and words, sorted: the same for any order and spacing ("28 + 46",
    "46+28"), so that a split by it keeps a problem's reorderings together."""
    return " ".join(sorted(re.findall(r"\w+", text)))


def line_of(task, split, i):
    """'path:n:' of problem i of your own task's split: each non-blank line holds one."""
    path = ensure_data(task) / f"{split}.jsonl"
    return read_lines(path if path.is_file() else path.with_suffix(".txt"), "problems")[i][0]


def load_split(task, split, alphabet=None):
    """[(prompt, answer)] of a split: generated on first use, or your folder's JSONL
    ({"prompt": ..., "answer": ...} a line, any other fields a Row's) or `prompt=answer` text.
    alphabet: the characters your task may use (None: any)."""
    path = ensure_data(task) / f"{split}.jsonl"
    if path.is_file():
        fields, own = {"prompt": str, "answer": str}, ("prompt", "answer", "ground_truth")
        return [Row(r["prompt"], r["answer"], {k: v for k, v in r.items() if k not in own})
                for r in read_jsonl(path, fields, alphabet, "problems")]
    problems = load_problems(path.with_suffix(".txt"), ALPHABET if task in TASKS else alphabet)
    if TASKS.get(task, {}).get("text"):
        problems = [(text_prompt(p), a) for p, a in problems]
    return problems


def text_prompt(prompt):
    """A symbolic prompt in words: "23*47=" -> "What is 23 times 47?"."""
    m = re.fullmatch(r"(\d+)([*+])(\d+)=", prompt)
    if m is None:
        raise DataError(f"cannot word the prompt {prompt!r}: expected 'a*b=' or 'a+b='")
    return f"What is {m[1]} {TEXT_OPS[m[2]]} {m[3]}?"


if __name__ == "__main__":
    print(ensure_data(sys.argv[1].removeprefix("--task=") if sys.argv[1:] else "mul"))
