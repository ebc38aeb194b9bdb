"""
What a reader of one run must follow: the distinct lines of the project's functions that a command
executes, per file (module-level code, tests/ and bench/ left out). The README's reading path.

    python bench/executed_lines.py rl.py --loss=dapo --max_iters=2 --eval_samples=0
    python bench/executed_lines.py --within=rl.py:pg_step rl.py --loss=dapo --max_iters=2 --eval_samples=0

--within=FILE:FUNCTION counts only the lines run while that function is on the stack (the route of
one step), and also prints the project frames from it to the deepest line of losses.py (the loss,
how far down) and the distinct calls from a function of one file to a function of another under
it (a reader's trips between files). The script runs in this process under sys.settrace (slow:
keep the run short); prints a JSON object {file: lines}, most first, then the totals.
"""
import json
import os
import runpy
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = tuple(os.path.join(ROOT, d) + os.sep for d in ("tests", "bench"))
CO_OPTIMIZED = 0x1  # set on a function's code object, never on a module's or a class body's


def ours(code):
    """A function body of a project file outside tests/ and bench/ -> its path in the repo."""
    path = code.co_filename
    if path.startswith(ROOT + os.sep) and not path.startswith(SKIP) and code.co_flags & CO_OPTIMIZED:
        return os.path.relpath(path, ROOT)
    return None


def depth_below(frame, within):
    """The project frames from frame up to (not counting) the nearest frame of `within`, or None."""
    n = 0
    while frame is not None:
        rel = ours(frame.f_code)
        if rel and f"{rel}:{frame.f_code.co_name}" == within:
            return n
        n += rel is not None
        frame = frame.f_back
    return None


def main(argv):
    within = argv.pop(0).split("=", 1)[1] if argv[0].startswith("--within=") else None
    seen, calls, deepest, inside = {}, set(), [0], [0]  # inside: frames of `within` on the stack

    def on_call(frame, event, arg):
        rel = ours(frame.f_code)
        if rel is None:
            return None  # not ours, or not a function body: trace nothing inside
        here = f"{rel}:{frame.f_code.co_name}"
        is_within = here == within
        inside[0] += is_within
        if within and inside[0] and not is_within:  # a trip: the nearest project caller's file
            back = frame.f_back
            while back is not None and ours(back.f_code) is None:
                back = back.f_back
            if back is not None and ours(back.f_code) != rel:
                calls.add((f"{ours(back.f_code)}:{back.f_code.co_name}", here))
        lines = seen.setdefault(rel, set())

        def on_line(frame, event, arg):
            if event == "line" and (within is None or inside[0]):
                lines.add(frame.f_lineno)
                if within and rel == "losses.py":
                    deepest[0] = max(deepest[0], depth_below(frame, within) or 0)
            elif event == "return" and is_within:
                inside[0] -= 1
            return on_line
        return on_line

    sys.argv, sys.path[0] = argv, ROOT  # as `python rl.py ...` from the repo root
    if within is None:  # a sampler thread's lines too; --within follows one thread
        threading.settrace(on_call)
    sys.settrace(on_call)
    try:
        script = argv[0] if os.path.exists(argv[0]) else os.path.join(ROOT, argv[0])
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.settrace(None)
        counts = dict(sorted(((f, len(v)) for f, v in seen.items() if v), key=lambda kv: -kv[1]))
        print(json.dumps(counts))
        if within:
            print(f"within {within}: the loss's deepest line {deepest[0]} project frames down; "
                  f"{len(calls)} distinct calls across files")
        print(f"executed function-body lines: {sum(counts.values())} in {len(counts)} files")


if __name__ == "__main__":
    main(sys.argv[1:])
