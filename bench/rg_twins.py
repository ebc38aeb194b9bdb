"""
Do reasoning-gym's held-out questions leak? For each task config: the split sizes, and how many val
and test questions have a twin in train: the same problem in another order or wording
("Calculate 28 + 46." in test, "Calculate 46 + 28." or "What is 28 + 46?" in train), by this
script's own parse of the question (a op b; + and * commute), not by the key nanorl/rg.py splits with.

    python bench/rg_twins.py          # basic_arithmetic, chain_sum, basic_arithmetic in words; ~5 s
"""
import os
import re
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanorl import rg  # noqa: E402


def twin(question):
    """One problem of 2 terms, whatever the wording: (op, its operands, sorted if op commutes)."""
    a, op, b = re.search(r"(-?\d+) ([-+*/]) (-?\d+)", question).groups()
    return op, tuple(sorted((int(a), int(b))) if op in "+*" else (int(a), int(b)))


def main():
    base = runpy.run_path(os.path.join(ROOT, "configs/rg_basic_arithmetic.py"))["rg"]
    tasks = [("basic_arithmetic", base), ("chain_sum", runpy.run_path(os.path.join(ROOT, "configs/rg_chain_sum.py"))["rg"]),
             ("basic_arithmetic", {**base, "format_style": "natural"})]
    print("| task | train / val / test | test questions with a train twin | val's |")
    print("|---|---|---|---|")
    for name, config in tasks:
        splits, _ = rg.splits(name, config)
        train = {twin(q) for q, _ in splits["train"]}
        n = {k: sum(twin(q) in train for q, _ in splits[k]) for k in ("test", "val")}
        words = " (natural wording)" if config.get("format_style") == "natural" else ""
        print(f"| {name}{words} | {' / '.join(str(len(v)) for v in splits.values())} | "
              f"{n['test']} of {len(splits['test'])} | {n['val']} of {len(splits['val'])} |")


if __name__ == "__main__":
    main()
