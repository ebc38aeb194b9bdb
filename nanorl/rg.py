"""
reasoning-gym tasks (`pip install -r requirements-rg.txt`), opened by a task named rg:NAME:

    python sft.py configs/rg_chain_sum.py                 # task = "rg:chain_sum", rg = dict(...)
    python bench/rg_table.py chain_sum                    # SFT, GRPO, the README's row

The generator's questions are the prompts, verbatim; its own score_answer is the reward (partial
credit in [0, 1]; accuracy and pass@k count a 1). reasoning-gym draws item i from seed + i, so
two seeds give the same items shifted by one: here one pool of POOL items is drawn, duplicates
dropped, and each problem goes to one split by a hash of its key, so that no val or test question
is a train question in another order or wording ("Calculate 28 + 46." in test, "What is 46 + 28?"
in train). The key (data.tasks.problem_key) is the sorted numbers and words of the generator's own
statement of the problem, its metadata's `expression`, which no wording changes; else of the
question.
"""
import dataclasses
import hashlib

from data.tasks import DataError, problem_key

POOL, SEED = 40000, 1337  # items drawn for a task's splits
HELD_OUT = {"val": 500, "test": 1000}  # at most this many distinct questions each


def generator(name, config):
    """reasoning-gym's dataset class and config of NAME, or one line naming what is valid."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise DataError(f"task rg:{name} needs reasoning-gym: pip install -r requirements-rg.txt") \
            from None
    if name not in DATASETS:
        raise DataError(f"unknown reasoning-gym task {name!r}; valid: "
                        f"{', '.join(sorted(DATASETS))}")
    cls, config_cls = DATASETS[name]
    keys = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    bad = [k for k in config if k not in keys]
    if bad:
        raise DataError(f"rg:{name} has no config key {bad[0]!r}; valid: {', '.join(keys)}")
    return cls, config_cls


def splits(name, config):
    """{split: [(question, answer)]} of rg:NAME under config (the generator's keys), disjoint by
    question, and score(question, answer text) -> the generator's score."""
    cls, config_cls = generator(name, config)
    try:
        dataset = cls(config_cls(**config, seed=SEED, size=POOL))
    except (AssertionError, TypeError, ValueError) as e:
        raise DataError(f"rg:{name} config {config}: {e.__class__.__name__}: {e}") from None
    if not isinstance(dataset[0]["answer"], str):
        raise DataError(f"rg:{name} gives no gold answer (its answer is "
                        f"{dataset[0]['answer']!r}): nothing to imitate or score")
    entries, out = {}, {"train": [], "val": [], "test": []}  # entries: question -> its item
    for i in range(POOL):  # in the generator's order
        entry = dataset[i]
        q = entry["question"]
        if q in entries:
            continue  # a repeat: the question has its split
        entries[q] = entry
        key = problem_key(str(entry.get("metadata", {}).get("expression", q)))  # any order, wording
        h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % 40
        split = "test" if h < 2 else "val" if h == 2 else "train"  # 1/20 test, 1/40 val
        if split == "train" or len(out[split]) < HELD_OUT[split]:
            out[split].append((q, entry["answer"]))
    if not all(out.values()):  # a narrow config: an empty split would divide evals by 0
        sizes = ", ".join(f"{len(v)} {k}" for k, v in out.items())
        raise DataError(f"rg:{name} config {config} gives {len(entries)} distinct problems: "
                        f"{sizes}; every split needs at least one: widen the config")

    def score(question, answer):
        return float(dataset.score_answer(answer, entries[question]))
    return out, score
