"""
What a reader of one run must follow: the distinct lines of the project's functions that a command
executes, per file (module-level code, tests/ and bench/ left out). The README's reading path.

    python bench/executed_lines.py rl.py --loss=dapo --max_iters=2 --eval_samples=0
    python bench/executed_lines.py rl.py --loss=ppo --max_iters=2 --eval_samples=0

The script runs in this process under sys.settrace (slow: keep the run short); prints a JSON
object {file: lines}, most first, then the total.
"""
import json
import os
import runpy
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = tuple(os.path.join(ROOT, d) + os.sep for d in ("tests", "bench"))
CO_OPTIMIZED = 0x1  # set on a function's code object, never on a module's or a class body's


def main(argv):
    seen = {}  # file -> the line numbers executed inside its functions

    def on_call(frame, event, arg):
        code = frame.f_code
        path = code.co_filename
        if not path.startswith(ROOT + os.sep) or path.startswith(SKIP) \
                or not code.co_flags & CO_OPTIMIZED:
            return None  # not ours, or not a function body: trace nothing inside
        lines = seen.setdefault(os.path.relpath(path, ROOT), set())

        def on_line(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return on_line
        return on_line

    sys.argv, sys.path[0] = argv, ROOT  # as `python rl.py ...` from the repo root
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
        print(f"executed function-body lines: {sum(counts.values())} in {len(counts)} files")


if __name__ == "__main__":
    main(sys.argv[1:])
