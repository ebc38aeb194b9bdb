"""
One prepared check of the CUDA paths (bf16 autocast, fused AdamW, CUDA generators, the SDPA branch
of attention, prefix sharing on the device, --compile, NCCL under torchrun, a GPT-2-size model):
at most 8 minutes on one GPU, one table of step, status (ok / FAIL / skipped), seconds, result.

    python bench/gpu_check.py                     # on a GPU; logs and runs in out/gpu-check/
    python bench/gpu_check.py --cpu_smoke         # the same steps at tiny sizes on the CPU, < 60 s
    python bench/gpu_check.py --peak_tflops=989   # MFU against this peak (default: PEAK_TFLOPS)

Each step runs in its own process (a failure, even a crashed CUDA context, stops no other one),
its output in out_dir/<step>.log, its time capped (TIMEOUT_S sums to 8 min):
  cuda-tests  python -m pytest -m cuda -q -s -rA tests/test_cuda.py (skipped without CUDA)
  sft         sft.py configs/mul.py: held-out accuracy, peak memory (capped: --max_seconds)
  rl-grpo     rl.py --loss=grpo from that checkpoint: the same
  rl-async    the same with --staleness=1 --async_rollouts=true: the sampler process on the same GPU
              (or its own, when there are two): steps per second, each side's idle share
  throughput  one GRPO step (generate, then rl.pg_step on it; random rewards) of a GPT-2-small
              shape (124M, vocab 50304, random init, bf16 autocast): tokens/s and MFU
  torchrun    torchrun --standalone --nproc_per_node=1 rl.py --loss=grpo: one step over NCCL
The smoke runs each at tiny sizes (torchrun over gloo) and reports the CUDA tests as skipped.
"""
import argparse
import copy
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from functools import partial

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import rl  # noqa: E402
import sft  # noqa: E402
from model import GPT, GPTConfig, generate, seeded  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from model import adamw  # noqa: E402

TIMEOUT_S = {"cuda-tests": 120, "sft": 100, "rl-grpo": 100, "rl-async": 60, "throughput": 40,
             "torchrun": 60}
TINY = ["--device=cpu", "--threads=1"]
SFT_ARGS = {"gpu": ["--max_seconds=55"],  # the real config, its training time capped
            "cpu": ["--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=32",
                    "--max_iters=10", "--eval_samples=0", *TINY]}
RL_ARGS = {"gpu": ["--max_seconds=60"],
           "cpu": ["--max_iters=2", "--eval_interval=2", "--prompts_per_step=4", "--group_size=4",
                   "--eval_samples=0", "--dynamic_sampling=false", *TINY]}
TORCHRUN_ARGS = ["--loss=grpo", "--max_iters=1", "--prompts_per_step=8", "--group_size=4",
                 "--eval_samples=0", "--dynamic_sampling=false"]  # an update even if all wrong
# the throughput step: the model's shape; prompts x G samples, prompt and response lengths
SHAPES = {"gpu": (dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=256),
                  (16, 8, 64, 128)),
          "cpu": (dict(n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=32),
                  (4, 4, 8, 8))}
# bf16 dense (no sparsity) TFLOPS; the first name inside torch.cuda.get_device_name() wins
PEAK_TFLOPS = [("H200 NVL", 835), ("H100 NVL", 835), ("H100 PCIe", 756), ("H200", 989),
               ("H100", 989), ("A100", 312), ("L40S", 362), ("L40", 181), ("L4", 121)]
PUBLISHED = ("published, for scale: prime-rl's trainer, Qwen3-0.6B full RL on 1x H100 80GB, "
             "seq_len 16384 (FA3, recompute): 11,896 tokens/s, MFU 11.1% (65536: 10,147, "
             "26.8%); https://github.com/PrimeIntellect-ai/prime-rl/blob/767aaad/benchmarks/"
             "baselines/benchmark-1xh100-Qwen--Qwen3-0.6B-rl-full-1gpu-Recompute-"
             "flash_attention_3-16384-cp1-ep1.json")
RESULT = "gpu_check result: "  # a child's last line


def mode(args):
    return "cpu" if args.cpu_smoke else "gpu"


def peak_memory(dev):
    """This process's peak: allocated GPU memory, or the CPU's resident set."""
    if dev.type == "cuda":
        return f"peak GPU mem {torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB"
    return f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"


def eval_rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "eval/accuracy" in r]


def run_sft(args, dev):
    """sft.py configs/mul.py in this process -> its result."""
    out = os.path.join(args.out_dir, "sft-mul")
    shutil.rmtree(out, ignore_errors=True)
    sft.main(load_config(sft.Config, ["configs/mul.py", f"--out_dir={out}",
                                      *SFT_ARGS[mode(args)]]))
    last = eval_rows(out)[-1]
    return f"held-out accuracy {last['eval/accuracy']:.3f} at step {last['step']}, " \
           f"{peak_memory(dev)}"


def run_rl(args, dev):
    """rl.py --loss=grpo from the sft step's checkpoint in this process -> its result."""
    out = os.path.join(args.out_dir, "rl-grpo")
    shutil.rmtree(out, ignore_errors=True)
    rl.main(load_config(rl.Config, ["--loss=grpo", f"--out_dir={out}",
                                    f"--sft_ckpt={args.out_dir}/sft-mul/ckpt.pt",
                                    *RL_ARGS[mode(args)]]))
    first, last = eval_rows(out)[0], eval_rows(out)[-1]
    return f"held-out accuracy {first['eval/accuracy']:.3f} -> {last['eval/accuracy']:.3f} " \
           f"in {last['step']} steps, {peak_memory(dev)}"


def run_rl_async(args, dev):
    """rl.py --loss=grpo with the async sampler, from the sft step's checkpoint -> its result."""
    out = os.path.join(args.out_dir, "rl-async")
    shutil.rmtree(out, ignore_errors=True)
    limit = ["--max_seconds=25"] if mode(args) == "gpu" else []
    rl.main(load_config(rl.Config, ["--loss=grpo", "--staleness=1", "--async_rollouts=true",
                                    f"--out_dir={out}", f"--sft_ckpt={args.out_dir}/sft-mul/ckpt.pt",
                                    *RL_ARGS[mode(args)], *limit]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "perf/trainer_idle_frac" in r][1:]  # after the start
    if not steps:
        return f"no async step after the first in {out}/metrics.jsonl"
    mean = lambda k: sum(r[k] for r in steps) / len(steps)  # noqa: E731
    return f"{len(steps) + 1} steps, {1 / mean('perf/step_s'):.2f} steps/s, idle: trainer " \
           f"{mean('perf/trainer_idle_frac'):.2f} sampler {mean('perf/sampler_idle_frac'):.2f}, " \
           f"version lag max {max(r.get('rl/version_lag_max', 0) for r in steps):g}, " \
           f"{torch.cuda.device_count() if dev.type == 'cuda' else 0} GPU(s)"


def now(dev):
    """The time once the device has finished its queued work."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


def grpo_step(cfg, row, run, prompts, dev, step, seen):
    """rl.py's GRPO step on a model in hand: generate, random 0/1 rewards, rl.pg_step given that
    rollout, under bf16 autocast on CUDA as rl.py -> (rollout s, update s, sampled tokens,
    tokens of the no-grad forwards: rollout, reference; of the trained forwards)."""
    with torch.autocast(dev.type, torch.bfloat16, enabled=dev.type == "cuda"):
        seen.clear()
        t0 = now(dev)
        out = generate(run.model, prompts, cfg.max_new_tokens, 1, 0, G=cfg.group_size,
                       generator=seeded(dev, "throughput", step))  # EOS 1, pad 0
        t1 = now(dev)
        roll_tok = sum(n for _, n in seen)
        P, N = out["prompt_len"], len(out["ids"])
        mask = out["action_mask"][:, P:]  # (N, L)
        reward = torch.randint(0, 2, (N,), device=dev, generator=seeded(dev, "reward", step))
        b = rl.rows.Rollout(out["ids"], out["offsets"], mask, out["logps"], old_logp=out["logps"],
                            reward=reward.float(), score=reward.float(), length=mask.sum(1).float(),
                            finished=torch.ones(N, dtype=torch.bool, device=dev))
        seen.clear()
        rl.pg_step(cfg, row, run, 1e-5, seeded(dev, "update", step), (b, {}))
        t2 = now(dev)
    ref_tok, trained_tok = (sum(n for grad, n in seen if grad == g) for g in (False, True))
    return t1 - t0, t2 - t1, mask.sum().item(), roll_tok, ref_tok, trained_tok


def run_throughput(args, dev):
    """Steps 2 and 3 of three GRPO steps (the first warms up) of SHAPES' model -> tokens/s and
    MFU: 2 N FLOPs a token of a no-grad forward, 6 N of a trained one (forward + backward);
    N = the parameters less the position embeddings (the tied lm_head is a matmul), attention
    not counted. Tokens: those the forwards ran (a prompt once per group, a decode step once
    per distinct prefix)."""
    shape, (n_prompts, G, P, L) = SHAPES[mode(args)]
    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape)).to(dev).eval()  # as rl.py's policy
    ref = copy.deepcopy(model).requires_grad_(False)
    seen = []  # (grad enabled, tokens) of every forward of the policy and the reference
    for net in (model, ref):
        net.register_forward_pre_hook(lambda _, inputs: seen.append((torch.is_grad_enabled(),
                                                                     inputs[0].numel())))
    cfg, row, hp = rl.check(rl.Config(loss="grpo", group_size=G, max_new_tokens=L))
    run = rl.Run(model, model, ref, adamw(model, 1e-5, 0.0), None, None, hp,
                 advantages=rl.advantage_stage(cfg, row, hp, None))
    prompts = torch.randint(2, shape["vocab_size"], (n_prompts, P)).tolist()
    steps = [grpo_step(cfg, row, run, prompts, dev, s, seen) for s in range(3)][1:]
    roll_s, upd_s, sampled, roll_tok, ref_tok, trained_tok = (sum(x) for x in zip(*steps))
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    peak = args.peak_tflops or next((t for k, t in PEAK_TFLOPS if dev.type == "cuda"
                                     and k in torch.cuda.get_device_name(dev)), 0)

    def mfu(flops, seconds):
        return f"MFU {100 * flops / seconds / (peak * 1e12):.1f}%" if peak else "MFU n/a"
    return (f"{n / 1e6:.3g}M params, {n_prompts}x{G} rows, P {P}, L {L}: rollout "
            f"{sampled / roll_s:,.0f} sampled tok/s, {mfu(2 * n * roll_tok, roll_s)}; update "
            f"{trained_tok / upd_s:,.0f} trained tok/s, "
            f"{mfu(2 * n * ref_tok + 6 * n * trained_tok, upd_s)} "
            f"({f'of {peak:g} TFLOPS' if peak else 'no known peak: --peak_tflops'}); "
            f"{peak_memory(dev)}")


CHILDREN = {"sft": run_sft, "rl-grpo": run_rl, "rl-async": run_rl_async,
            "throughput": run_throughput}


def call(name, cmd, args):
    """Run cmd from the repo root in a process group of its own, its output to
    out_dir/<name>.log, at most TIMEOUT_S[name] -> (exit status, None if it timed out; output)."""
    log = os.path.join(args.out_dir, f"{name}.log")
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=TIMEOUT_S[name])
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # torchrun's workers too
            p.wait()
            rc = None
    with open(log) as f:
        return rc, f.read()


def failure(name, rc, output, args):
    """A failed step's result: its error line (the last "error: ..." or "...Error: ..." line
    other than torchrun's own report, else the last line) and where its log is."""
    lines = [line.strip() for line in output.splitlines() if line.strip()] or ["no output"]
    errors = [line for line in lines if "ChildFailedError" not in line and
              re.match(r"error: |[\w.]*(Error|Exception)\b", line)]
    what = f"timed out after {TIMEOUT_S[name]} s" if rc is None else (errors or lines)[-1]
    return f"{what} (log: {os.path.join(args.out_dir, name)}.log)"


def check_tests(args):
    """tests/test_cuda.py -> how many passed, what failed, the gaps the tests print. -rA lists
    every test in the summary (pytest.ini's -q and this -q print no counts). Only that file is
    collected: the others may import what requirements.txt does not install (transformers)."""
    name = "cuda-tests"
    if importlib.util.find_spec("pytest") is None:
        return "FAIL", "pytest is not installed: pip install -r requirements-test.txt"
    rc, out = call(name, [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-s", "-rA",
                          "-p", "no:cacheprovider", "tests/test_cuda.py"], args)
    if rc == 0 and not torch.cuda.is_available():
        return "skipped", "skipped (no CUDA)"
    measured = re.findall(r"^[.sFE]*((?:logp gap|compile:).*)$", out, re.M)  # after the dots
    if rc is None:  # what it measured before
        return "FAIL", "; ".join([failure(name, rc, out, args), *measured])
    lines = out.splitlines()
    passed = sum(line.startswith("PASSED ") for line in lines)
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    status = "ok" if rc == 0 and passed and not failed else "FAIL"
    return status, "; ".join([f"{passed} passed", *failed, *measured])


def check_child(name, args):
    """A step of CHILDREN, run by this script in a process of its own."""
    flags = [f"--out_dir={args.out_dir}", f"--peak_tflops={args.peak_tflops}"]
    rc, out = call(name, [sys.executable, os.path.abspath(__file__), f"--step={name}", *flags,
                          *(["--cpu_smoke"] if args.cpu_smoke else [])], args)
    results = [line[len(RESULT):] for line in out.splitlines() if line.startswith(RESULT)]
    return ("ok", results[-1]) if rc == 0 and results else ("FAIL", failure(name, rc, out, args))


def check_torchrun(args):
    """One GRPO step of rl.py under torchrun, one rank: NCCL on CUDA, gloo on the CPU."""
    name, out_dir = "torchrun", os.path.join(args.out_dir, "torchrun")
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           "rl.py", f"--sft_ckpt={args.out_dir}/sft-mul/ckpt.pt", f"--out_dir={out_dir}",
           *TORCHRUN_ARGS, *(TINY if args.cpu_smoke else [])]
    rc, out = call(name, cmd, args)
    if rc != 0:
        return "FAIL", failure(name, rc, out, args)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "rl/loss" in r]
    backend = "gloo" if args.cpu_smoke else "nccl"
    if not steps:
        return "FAIL", f"no update logged in {out_dir}/metrics.jsonl"
    return "ok", f"{len(steps)} GRPO step on 1 rank over {backend}, " \
                 f"grad_norm {steps[-1]['rl/grad_norm']:.4g}"


def main(args):
    args.out_dir = os.path.abspath(args.out_dir)
    if args.step:  # a child: one step in this process
        dev = torch.device("cpu" if args.cpu_smoke else "cuda")
        if args.cpu_smoke:
            torch.set_num_threads(1)  # as TINY's --threads=1: the smoke shares small machines
        print(RESULT + CHILDREN[args.step](args, dev), flush=True)
        return
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit("error: no CUDA device here; on a CPU run python bench/gpu_check.py --cpu_smoke")
    os.makedirs(args.out_dir, exist_ok=True)
    where = "CPU (smoke)" if args.cpu_smoke else f"{torch.cuda.get_device_name()}, " \
                                                 f"CUDA {torch.version.cuda}"
    print(f"gpu_check on {where}, torch {torch.__version__}; logs in {args.out_dir}", flush=True)
    steps = [("cuda-tests", check_tests), *((n, partial(check_child, n)) for n in CHILDREN),
             ("torchrun", check_torchrun)]
    rows = []
    for name, check in steps:
        t0 = time.time()
        try:  # a step's own bookkeeping failing stops no other step either
            status, result = check(args)
        except Exception as e:
            status, result = "FAIL", f"{type(e).__name__}: {e}"
        rows.append((name, status, time.time() - t0, result))
        print(f"  {name}: {status} ({rows[-1][2]:.0f} s)", flush=True)
    print(f"\n{'step':11s} {'status':8s} {'seconds':>7s}  result")
    for name, status, seconds, result in rows:
        print(f"{name:11s} {status:8s} {seconds:7.1f}  {result}")
    print(f"\n{PUBLISHED}")
    sys.exit(1 if any(status == "FAIL" for _, status, _, _ in rows) else 0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--cpu_smoke", action="store_true", help="tiny sizes on the CPU, < 60 s")
    p.add_argument("--out_dir", default="out/gpu-check", help="runs and logs")
    p.add_argument("--peak_tflops", type=float, default=0.0,
                   help="bf16 dense peak for MFU; 0 = from PEAK_TFLOPS by the GPU's name")
    p.add_argument("--step", default="", choices=["", *CHILDREN], help=argparse.SUPPRESS)
    main(p.parse_args())
