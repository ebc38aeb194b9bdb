"""
Does a change keep every algorithm's update bit for bit? Two steps of every ALGOS row from one
tiny SFT checkpoint, run by this tree and by another git ref, and their weights compared exactly;
then the rows of ENVIRONMENTS on tiny checkpoints of the game (process rewards) and the calculator.

    python bench/same_weights.py --base=HEAD~3        # every row, and the environments' rows
    python bench/same_weights.py --base=main grpo ppo  # these rows
    python bench/same_weights.py --base=main grpo@mul3_tool  # a row on an environment's task
    python bench/same_weights.py --base=014c1d6 "--new_rl=--sample_batch_size=256 --full_head=true"
                                           # this tree with its new defaults set back

The ref is checked out into a temporary folder (git worktree); each tree trains its own tiny SFT
checkpoints (--new_sft: more sft.py flags for this tree's, --new_rl: rl.py's), then runs each row
from them; each run is a fresh process with the same seeds, one thread, and a verifier (and a
calculator's score) that rewards answers starting with "1" (the tiny model is never right:
without it every group is flat and nothing moves).
Prints a line per row, "same" or "DIFFERENT" (the largest weight difference), and exits 1 if any
differs. Bit-identical holds on one machine and one torch; across machines compare nothing.
"""
import hashlib
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = """
import sys
sys.path.insert(0, sys.argv[1])
import verify
verify.VERIFIERS["exact"] = lambda text, gold, reverse=False: float(text[:1] == "1")
import envs.calculator  # its episodes' score too
envs.calculator.exact_answer = lambda text, gold: float((text or "")[:1] == "1")
import rl
from nanorl.config import load_config
rl.main(load_config(rl.Config, sys.argv[2:]))
"""
SFT = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=64", "--lr=3e-3", "--warmup_iters=5",
       "--max_iters=120", "--eval_interval=120", "--eval_samples=0", "--threads=1", "--bf16=false"]
ENVIRONMENTS = {  # task: (its tiny SFT's flags, its RL flags, its rows)
    "env:guess": (["--task=env:guess", "--reverse=false", "--block_size=48", "--max_new_tokens=40"],
                  ['--env_args={"process_reward": true}'], ["grpo", "reinforce_pp", "ppo"]),
    "mul3_tool": (["configs/mul3_tool.py", "--max_iters=60", "--eval_interval=60"], [], ["grpo", "dapo"]),
}
RL = ["--max_iters=2", "--eval_interval=100", "--eval_samples=0", "--prompts_per_step=8", "--group_size=4",
      "--pairs_per_step=8", "--threads=1", "--ckpt_interval=100"]


def sft(tree, task, sft_flags, out, extra):
    """Tree's sft.py on task (its flags; extra: this tree's own) -> the checkpoint's path."""
    subprocess.run([sys.executable, "sft.py", *sft_flags[:1], f"--out_dir={out}", *SFT,
                    *sft_flags[1:], *extra], cwd=tree, check=True, capture_output=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return os.path.join(out, "ckpt.pt")


def weights(tree, ckpt, name, out, extra=()):
    """Row `name` run by the tree at `tree` for two steps -> its final state dict."""
    teacher = [f"--teacher_ckpt={ckpt}"] if name in ("opd", "gkd") else []
    k = ["--pass_k=2"] if name == "pass_at_k" else []  # k below the group of 4
    cmd = [sys.executable, "-c", RUN, tree, f"--loss={name}", f"--sft_ckpt={ckpt}", f"--out_dir={out}",
           *RL, *teacher, *k, *extra]
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    if r.returncode:
        return None, (r.stderr.strip().splitlines() or ["?"])[-1]
    return torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["model"], ""


def compare(name, a, b, start):
    """One row's line: same or DIFFERENT, how far it moved, its weights' digest -> same."""
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    moved = max((a[k] - start[k]).abs().max().item() for k in a if k in start)
    gap = 0.0 if same else max((a[k] - b[k]).abs().max().item() for k in a if k in b)
    digest = hashlib.sha256(b"".join(a[k].numpy().tobytes() for k in sorted(a))).hexdigest()
    print(f"{name:24} {'same' if same else 'DIFFERENT'}  moved {moved:.2e}"
          + ("" if same else f", differs by {gap:.2e}") + f"  {digest[:12]}", flush=True)
    return same


def main(argv):
    opt = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
    base, new_sft, new_rl = opt.get("base", "HEAD"), opt.get("new_sft", ""), opt.get("new_rl", "")
    sys.path.insert(0, ROOT)
    import losses
    names = [a for a in argv if not a.startswith("--")]
    every = [n for n in losses.ALGOS] + [f"{n}@{task}" for task, (_, _, rows) in
                                         ENVIRONMENTS.items() for n in rows]
    runs = [(n.partition("@")[0], n.partition("@")[2]) for n in names or every]  # (row, task)
    runs = [(n, task, ENVIRONMENTS[task][1] if task else []) for n, task in runs]
    with tempfile.TemporaryDirectory(prefix="nanorl-same-") as tmp:
        old = os.path.join(tmp, "base")
        subprocess.run(["git", "worktree", "add", "--detach", old, base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            ckpts = {}  # task -> (this tree's checkpoint, the base's)
            for task, sft_flags in [("", [])] + [(t, f) for t, (f, _, _) in ENVIRONMENTS.items()]:
                where = "sft" + task.replace(":", "-")
                if any(t == task for _, t, _ in runs):
                    ckpts[task] = (sft(ROOT, task, sft_flags, os.path.join(tmp, "new", where),
                                       new_sft.split()),
                                   sft(old, task, sft_flags, os.path.join(tmp, "old", where), []))
            differ = []
            for name, task, flags in runs:
                label, (ckpt, old_ckpt) = f"{name}@{task}" if task else name, ckpts[task]
                a, why_a = weights(ROOT, ckpt, name, os.path.join(tmp, "new", label),
                                   flags + new_rl.split())
                b, why_b = weights(old, old_ckpt, name, os.path.join(tmp, "old", label), flags)
                if a is None or b is None:
                    print(f"{label:24} FAILED: {why_a or why_b}", flush=True)
                    differ.append(label)
                elif not compare(label, a, b, torch.load(ckpt, weights_only=True)["model"]):
                    differ.append(label)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT, capture_output=True)
    print(f"{len(runs) - len(differ)} of {len(runs)} rows bit-identical to {base}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
