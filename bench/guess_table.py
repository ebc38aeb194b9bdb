"""
Guess the number to the optimum: for each seed the whole pipeline, SFT on the random consistent
player's games, then each RL row from that checkpoint; each run's last checkpoint plays every
secret 8 times at temperature 1 and once greedily (bench/guess.py), and the table reads it.

    python bench/guess_table.py --rows=gigpo,vine,pp,grpo --seeds=1337,1,2
    python bench/guess_table.py --rows=oracle,nsr,w_reinforce --seeds=1337,1,2 --threads=1
    python bench/guess_table.py --rows=vine_table --seeds=1337,1,2 --threads=1
    python bench/guess_table.py --fp32 ...    # as a CPU without bf16 runs (SFT --bf16=false, avx2)
    python bench/guess_table.py --report      # the table and plot of the runs already there

Each run is `python rl.py <the row's configs> --seed=S --sft_ckpt=...` under /usr/bin/time -v
(wall, peak RSS), one at a time on --threads; its record goes to out_dir/<mode>/s<seed>/<row>.json
(two invocations may run at once). Writes out_dir/table.md and win.png (held-out win within 7 at
T = 1, and the greedy policy's losing states, against steps: a line per row and seed) from every
record there. Losing states: the states whose modal move loses a winnable game (envs/guess.py's
oracle); all-lose groups: the share of the groups sampled in the last 25 steps that lost every game.
"""
import glob
import json
import os
import re
import subprocess
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from guess import play, table_row  # noqa: E402

PP = "configs/rl_guess_pp.py"
ROWS = {"grpo": ["configs/rl_guess.py"], "pp": [PP],  # their config files and flags
        "gigpo": ["configs/rl_guess.py", "configs/rl_guess_gigpo.py"],
        "vine": [PP, "configs/rl_guess_vine.py"], "vine_table": [PP, "configs/rl_guess_vine_table.py"],
        "oracle": [PP, "configs/rl_guess_oracle.py"],
        "oracle_hot": [PP, "configs/rl_guess_oracle.py", "--temperature_start=1.5", "--explore_iters=450",
                       "--max_iters=500"],
        "nsr": [PP, "--loss=nsr"], "w_reinforce": [PP, "--loss=w_reinforce"],
        "bonus": [PP, "--count_bonus=0.1"], "hot": [PP, "--temperature_start=1.5", "--explore_iters=180"]}
NAMES = {"grpo": "GRPO, the win", "pp": "REINFORCE++, process reward",
         "gigpo": "GiGPO, discounted win", "vine": "VinePPO, process reward",
         "vine_table": "VinePPO, values from a table of past returns",
         "oracle": "REINFORCE++, the oracle's reward (control)", "nsr": "NSR, process reward",
         "oracle_hot": "the oracle's reward, temperature 1.5 -> 1 by step 450 of 500",
         "w_reinforce": "W-REINFORCE, process reward", "bonus": "REINFORCE++, count bonus 0.1",
         "hot": "REINFORCE++, temperature 1.5 -> 1 by step 180"}


def timed(cmd, log, env):
    """Run cmd under /usr/bin/time -v, its output to log -> (wall s, peak RSS MiB)."""
    with open(log, "w") as f:
        subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                       cwd=ROOT, check=True)
    text = open(log).read()
    h, m, s = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)",
                        text).groups()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return int(h or 0) * 3600 + int(m) * 60 + float(s), rss / 1024


def curve(out):
    """The run's held-out evals -> [(step, win at T = 1, greedy win, train seconds, losing
    states)]."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [(r["step"], r["eval/pass@1"], r["eval/accuracy"], r["perf/train_s"],
             r.get("eval/losing_states")) for r in rows if "eval/pass@1" in r]


def all_lost(out, last=25):
    """The share of the groups sampled that were all lost, over the run's last `last` steps."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    shares = [r["rl/all_lost_frac"] for r in rows if "rl/all_lost_frac" in r][-last:]
    return sum(shares) / len(shares)


def first_at(points, level):
    """(steps, minutes) of the first eval at win >= level, or (None, None)."""
    return next(((s, t / 60) for s, w, _, t, _ in points if w >= level), (None, None))


def run_one(args, mode, seed, row, env):
    """One seed's SFT (once) and one row's RL -> its record."""
    base = os.path.join(args["out_dir"], mode, f"s{seed}")
    sft = os.path.join(base, "sft")
    extra = ["--bf16=false"] if mode == "fp32" else []
    threads = f"--threads={args['threads']}"
    if not os.path.exists(os.path.join(sft, "ckpt.pt")):
        os.makedirs(sft, exist_ok=True)
        timed([sys.executable, "sft.py", "configs/guess.py", f"--seed={seed}", f"--out_dir={sft}",
               threads, *extra], os.path.join(base, "sft.log"), env)
    out = os.path.join(base, row)
    wall, rss = timed([sys.executable, "rl.py", *ROWS[row], f"--seed={seed}", threads,
                       f"--sft_ckpt={sft}/ckpt.pt", f"--out_dir={out}", *args["rl_args"]],
                      os.path.join(base, f"{row}.log"), env)
    record = {"row": row, "seed": seed, "mode": mode, "threads": int(args["threads"]),
              "wall_s": wall, "rss_mib": rss, **measure(out)}
    json.dump(record, open(out + ".json", "w"))
    return record


def measure(out):
    """A run's last checkpoint played (8 games a secret at T = 1, and greedily) and its curve."""
    games, _, _ = play(os.path.join(out, "ckpt.pt"), 8, 1.0)
    greedy, _, lost = play(os.path.join(out, "ckpt.pt"), 1, 0.0)
    t1, g = table_row(games), table_row(greedy)
    points = curve(out)
    return {"win": t1["win"], "greedy": g["win"], "turns_won": t1["turns_won"],
            "binary": t1["binary"], "first": Counter(x.guesses[0] for x in games if x.guesses),
            "losing": len(lost), "losing_states": lost, "all_lost": all_lost(out),
            "steps": points[-1][0], "train_min": points[-1][3] / 60, "curve": points,
            "to95": first_at(points, 0.95), "to99": first_at(points, 0.99)}


def spread(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "never"
    lo, hi, mean = min(xs), max(xs), sum(xs) / len(xs)
    return fmt.format(mean) if lo == hi else f"{fmt.format(mean)} ({fmt.format(lo)}–{fmt.format(hi)})"


def table(runs):
    """Markdown: a line per (mode, row), each number the mean (range) over its seeds."""
    head = ("| mode | row | seeds | win at T = 1 | greedy | losing states | all-lose groups | turns when won "
            "| steps to 0.95 | min to 0.95 | steps to 0.99 | binary search | first guess | RL wall | peak RSS |")
    lines = [head, "|" + "---|" * 15]
    for mode, row in dict.fromkeys((r["mode"], r["row"]) for r in runs):
        rs = [r for r in runs if (r["mode"], r["row"]) == (mode, row)]
        reached = lambda k, i: [r[k][i] for r in rs]  # noqa: E731
        first = Counter()
        for r in rs:
            first.update({int(k): v for k, v in r["first"].items()})
        n = sum(first.values())
        top = ", ".join(f"{g} ({c / n:.0%})" for g, c in first.most_common(3))
        def never(k):  # runs that never got there, when some did
            n = sum(x is None for x in reached(k, 0))
            return f" [{n} of {len(rs)} never]" if 0 < n < len(rs) else ""
        threads = "/".join(sorted({str(r["threads"]) for r in rs}))
        lines.append(f"| {mode}, {threads} thr. | {NAMES[row]} | {', '.join(str(r['seed']) for r in rs)} | "
                     f"{spread([r['win'] for r in rs], '{:.3f}')} | "
                     f"{spread([r['greedy'] for r in rs], '{:.3f}')} | "
                     f"{spread([r['losing'] for r in rs], '{:.1f}')} | "
                     f"{spread([r['all_lost'] for r in rs], '{:.1%}')} | "
                     f"{spread([r['turns_won'] for r in rs], '{:.2f}')} | "
                     f"{spread(reached('to95', 0), '{:.0f}')}{never('to95')} | "
                     f"{spread(reached('to95', 1), '{:.1f}')} | "
                     f"{spread(reached('to99', 0), '{:.0f}')}{never('to99')} | "
                     f"{spread([r['binary'] for r in rs], '{:.3f}')} | {top} | "
                     f"{spread([r['wall_s'] / 60 for r in rs], '{:.1f}')} min | "
                     f"{spread([r['rss_mib'] for r in rs], '{:.0f}')} MiB |")
    return "\n".join(lines)


def plot(runs, path):
    """win.png: held-out win at T = 1 and the greedy policy's losing states against steps, a
    colour per row, a line per seed."""
    import matplotlib
    import matplotlib.figure  # not pyplot: no GUI backend
    fig = matplotlib.figure.Figure(figsize=(11, 4.5), layout="tight")
    win_ax, lost_ax = fig.subplots(1, 2)
    colours = {row: matplotlib.colormaps["tab20"](i) for i, row in enumerate(ROWS)}  # 20 at most
    for r in runs:
        steps, win, lost = zip(*[(p[0], p[1], p[4]) for p in r["curve"]])
        label = f"{NAMES[r['row']]}" if r["seed"] == min(x["seed"] for x in runs
                                                          if x["row"] == r["row"]) else None
        style = dict(color=colours[r["row"]], alpha=0.8, ls="-" if r["mode"] == "bf16" else "--")
        win_ax.plot(steps, win, label=label, **style)
        if None not in lost:  # runs from before the oracle have no losing states
            lost_ax.plot(steps, lost, **style)
    win_ax.axhline(0.99, color="black", lw=0.8, ls=":", label="the target, 0.99")
    win_ax.set(xlabel="RL step", ylabel="held-out win within 7 at T = 1", ylim=(0.3, 1.01),
               title="Guess the number from random demonstrations (a line per seed)")
    lost_ax.set(xlabel="RL step", ylabel="states whose greedy move loses a winnable game",
                title="Losing states (a line per seed)")
    win_ax.legend(loc="lower right", fontsize=7)
    fig.savefig(path, dpi=110)


def main(argv):
    args = {"rows": "gigpo,vine,pp,grpo", "seeds": "1337,1,2", "out_dir": "out/guess_table",
            "threads": "2", "rl_args": []}
    for a in argv:
        k, _, v = a[2:].partition("=")
        if k == "rl_args":
            args[k] = v.split()
        elif k in args or k in ("fp32", "report"):
            args[k] = v
        else:
            sys.exit(f"unknown flag --{k}; valid: {', '.join([*args, 'fp32', 'report'])}")
    mode = "fp32" if "fp32" in args else "bf16"
    env = dict(os.environ, **({"ATEN_CPU_CAPABILITY": "avx2"} if mode == "fp32" else {}))
    if "report" not in args:
        for seed in [int(s) for s in args["seeds"].split(",")]:
            for row in args["rows"].split(","):
                print(table([run_one(args, mode, seed, row, env)]).splitlines()[-1], flush=True)
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(args["out_dir"], "*", "s*",
                                                                      "*.json")))]
    runs.sort(key=lambda r: (r["mode"], list(ROWS).index(r["row"]), r["seed"]))
    open(os.path.join(args["out_dir"], "table.md"), "w").write(table(runs) + "\n")
    plot(runs, os.path.join(args["out_dir"], "win.png"))
    print(table(runs))


if __name__ == "__main__":
    main(sys.argv[1:])
