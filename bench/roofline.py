"""
A roofline for every stage of an RL step (issue 55): each stage's FLOPs, time and rate, against
the rate of its own matmul shapes and of a big GEMM, measured in the same run.

    python bench/roofline.py --config=all --threads=1     # the three configs, a table each
    python bench/roofline.py --config=grpo --steps=2 --warmup=1 --threads=1   # quick
    python bench/roofline.py --config=gpt2 --gpt2_prompts_per_step=8 --gpt2_group_size=4
    python bench/roofline.py --config=grpo --rl_flags=--sampler_bf16=true   # a candidate

The configs, each the real step: rl.py's own check, setup and pg_step. Dynamic sampling and prompt
selection are off, as in bench/rl_step.py, so that every step does the same work; fp32 (CPU).
  grpo   `python rl.py --loss=grpo`: rl.Config's defaults (mul, 64 prompts x 16, beta 0.04)
  guess  `python rl.py configs/rl_guess.py`: env:guess, 32 prompts x 8 games, beta 0
  gpt2   GPT-2-small's shape (configs/gpt2_mul.py: 12 layers x 768, 50,257 BPE tokens) on
         mul_text, 4 prompts x 4 samples, <= 6 new tokens, from out/sft-gpt2-mul/ckpt.pt if
         any; without tiktoken's gpt2 file (no network), a stand-in encoding of its size
Each starts from its SFT checkpoint when it exists (--fresh=true: never), else from a fresh model
of sft.py's config for it (shape, task, tokenizer), saved to a temporary checkpoint that
rl.setup loads as it would an SFT one.

Stages: wrappers installed for the run (unittest.mock.patch) time these calls, perf_counter:
  prefill            GPT.forward outside the other stages: generate's prompt forward
  decode             model.extend: a cached decode step (its prefix keying, KVCache.select of
                     the rows it extends, the one-token forward)
  reference forward  rl.logprobs on run.ref (the advantage stage's, with_reference); absent when beta = 0
  pi_old             offpolicy.logprobs (offpolicy.recompute: bf16, staleness); without it the
                     sampler's log-probs mu stand in for pi_old: not computed
  policy forward     rl.logprobs with grad on (rl.pg_step's micro-batches): the forward and token log-probs
  policy backward    torch.Tensor.backward (rl.pg_step's loss.backward())
  optimizer          model.optimizer_step: grad norm, finiteness check, clip, AdamW step
  host overhead      the step's wall time less the stages: sampling from the logits, episodes,
                     grading, advantages, the loss

FLOPs (formula), matmuls only (LayerNorm, GELU, softmax, embeddings not counted). A GPT.forward
of B rows x T tokens at cache position S (L = S + T keys), C = n_embd, V = vocab_size:
  linear layers  n_layer * 2*B*T*12*C^2   2*M*K*N a matmul, M = B*T: c_attn 3C^2, attn c_proj
                                          C^2, c_fc 4C^2, mlp c_proj 4C^2
  attention      n_layer * 2*2*B*nh*T*L*hd  q @ k^T and att @ v (= 4*B*T*L*C), the whole T x L
  lm_head        2*K*C*V                  logits at the K positions forward keeps (B*T: all)
  backward       2 x the forwards it differentiates (dX and dW of each matmul)
  optimizer      16 a parameter: grad norm 2, clip 1, AdamW 13 (m 3, v 4, sqrt, bias
                 correction and eps 3, the update 3)
FLOPs (counter): torch.utils.flop_counter.FlopCounterMode around the same calls. It counts mm,
addmm, bmm and GPU attention kernels: not the CPU SDPA of the decode's attention, nor optimizers.
Both FLOP columns come from one extra step after the timed ones (the same calls, so the ratio
compares like with like); ms, share and GFLOP/s (a timed step's formula FLOPs over its time) are
medians over the timed steps: shares of medians need not add up to 100%.

Peaks, at the same thread count:
  own-shape  the model's linear layers (n_layer x a block's four, then lm_head, each its own
             weights) as F.linear at the stage's M = rows x tokens (the FLOP-weighted median over
             its forwards), fp32; for the backward each one's dX and dW matmuls at the policy
             forward's M. Attention's small bmm are left out. The optimizer's is memory: a
             copy of its parameters' count of fp32 numbers, its GB/s as FLOPs at 16 FLOPs a
             28 bytes moved (AdamW's per parameter), so % = its bytes/s over the copy's.
  big-GEMM   2048 x 2048 @ 2048 x 2048 in fp32, and in bf16 where the CPU has it natively
Each the median of --repeats timings of a loop of at least 20 ms.
"""
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from unittest import mock

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
import rl  # noqa: E402
import sft  # noqa: E402
from data.tasks import TASKS  # noqa: E402
from model import GPT, seeded  # noqa: E402
from nanorl import bpe, offpolicy  # noqa: E402
from nanorl.checkpoint import save_checkpoint  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from nanorl.ddp import bf16_default  # noqa: E402
from tokenizer import TokenizerError  # noqa: E402


@dataclass
class Config:
    config: str = "grpo"  # grpo, guess, gpt2, or all: the three, a table each
    threads: int = 1  # torch threads, for the steps and the peaks
    steps: int = 5  # timed steps: each number is their median
    warmup: int = 2  # untimed steps first
    fresh: bool = False  # a fresh model even where the SFT checkpoint exists
    gpt2_prompts_per_step: int = 4  # gpt2's batch: a step takes seconds on one core
    gpt2_group_size: int = 4
    repeats: int = 5  # timings of each peak's matmul loop: their median
    rl_flags: str = ""  # more rl.py flags for every config, e.g. "--sampler_bf16=true"


# --config -> (rl.py's config files and flags, sft.py's config files of its fresh model)
RUNS = {"grpo": ([], []),
        "guess": (["configs/rl_guess.py"], ["configs/guess.py"]),
        "gpt2": (["--sft_ckpt=out/sft-gpt2-mul/ckpt.pt", "--max_new_tokens=6"],
                 ["configs/gpt2_mul.py"])}
SAME_WORK = ["--dynamic_sampling=false", "--prompt_selection=false", "--bf16=false"]
STAGES = ("prefill", "decode", "reference forward", "pi_old", "values forward",
          "policy forward", "policy backward", "optimizer")
ABSENT = {"reference forward": "not run (beta = 0)", "values forward": None,  # None: no row
          "pi_old": "not computed (old_logp = the sampler's log-probs mu)"}
OPT_FLOPS = 16  # a parameter: grad norm 2, clip 1, AdamW 13
OPT_BYTES = 28  # a parameter, fp32: AdamW reads the weight, its gradient, m, v; writes three


def forward_flops(c, B, T, S, K=None):
    """Matmul FLOPs of GPT.forward on (B, T) tokens at cache position S (the docstring's), its
    LM head at K positions (keep's; None: all B*T)."""
    M, L = B * T, S + T
    linear = c.n_layer * 2 * M * 12 * c.n_embd ** 2
    attention = c.n_layer * 4 * M * L * c.n_embd  # 2*2*B*nh*T*L*hd
    return linear + attention + 2 * (M if K is None else K) * c.n_embd * c.vocab_size


class Stages:
    """One step's seconds, formula FLOPs and counted FLOPs by stage, and its forwards' sizes."""

    def __init__(self):
        self.reset(counting=False)

    def reset(self, counting):
        self.counting, self.current, self.pending = counting, None, 0  # pending: for backward
        self.sec, self.flops, self.counted = Counter(), Counter(), Counter()
        self.sizes = defaultdict(list)  # stage -> [(M = rows x tokens, FLOPs)] a forward

    @contextmanager
    def timed(self, name):
        outer, self.current = self.current, name
        counter = FlopCounterMode(display=False) if self.counting else nullcontext()
        t0 = time.perf_counter()
        with counter:
            yield
        self.sec[name] += time.perf_counter() - t0
        self.current = outer
        if self.counting:
            self.counted[name] += counter.get_total_flops()


def patches(stages, run):
    """The wrappers that time and count each stage (module docstring), for a with-block."""
    forward, extend, logprobs = GPT.forward, model.extend, rl.logprobs
    old_logprobs = offpolicy.logprobs
    backward, optimizer_step = torch.Tensor.backward, rl.optimizer_step

    def timed_forward(gpt, idx, offsets=None, cache=None, return_scalar=False, keep=None):
        (B, T), S = idx.shape, (cache.pos if cache is not None else 0)
        flops = forward_flops(gpt.config, B, T, S, None if keep is None else int(keep.sum()))
        name = stages.current or "prefill"  # no stage open: generate's prompt forward
        stages.flops[name] += flops
        stages.sizes[name].append((B * T, flops))
        stages.pending += flops if torch.is_grad_enabled() else 0
        with nullcontext() if stages.current else stages.timed(name):
            return forward(gpt, idx, offsets, cache, return_scalar, keep)

    def timed_logprobs(gpt, *args, **kw):
        name = "reference forward" if gpt is run.ref else \
            "policy forward" if torch.is_grad_enabled() else "values forward"  # PPO's
        with stages.timed(name):
            return logprobs(gpt, *args, **kw)

    def timed_extend(*args):
        with stages.timed("decode"):
            return extend(*args)

    def timed_old_logprobs(*args, **kw):
        with stages.timed("pi_old"):
            return old_logprobs(*args, **kw)

    def timed_backward(tensor, *args, **kw):
        stages.flops["policy backward"] += 2 * stages.pending
        stages.pending = 0
        with stages.timed("policy backward"):
            return backward(tensor, *args, **kw)

    def timed_optimizer_step(gpt, *args):
        n = sum(p.numel() for p in gpt.parameters() if p.requires_grad)
        stages.flops["optimizer"] += OPT_FLOPS * n
        with stages.timed("optimizer"):
            return optimizer_step(gpt, *args)

    stack = ExitStack()
    for obj, attr, new in [(GPT, "forward", timed_forward), (model, "extend", timed_extend),
                           (rl, "logprobs", timed_logprobs),
                           (offpolicy, "logprobs", timed_old_logprobs),
                           (torch.Tensor, "backward", timed_backward),
                           (rl, "optimizer_step", timed_optimizer_step)]:
        stack.enter_context(mock.patch.object(obj, attr, new))
    return stack

# -------------------- the runs


def fresh_checkpoint(sft_args, path, seed):
    """A fresh model of sft.py's config (its shape, task, tokenizer), saved as SFT saves one."""
    cfg = load_config(sft.Config, sft_args)
    if cfg.tokenizer != "char" and not cfg.tokenizer.startswith("bpe:"):
        bpe.load(cfg.tokenizer)  # tiktoken's: a TokenizerError now, before the task's data
    if cfg.reverse is None:  # as sft.main resolves it
        cfg = replace(cfg, reverse=cfg.task in TASKS)
    task = sft.load_task(cfg)[0]
    torch.manual_seed(seed)
    gpt, config = sft.build_model(cfg, task.tok), {**asdict(cfg), **task.settings()}  # sft's
    save_checkpoint(path, gpt, None, config, 0, task.tok)


def build_run(b, name, tmp):
    """rl.py's step for --config=name -> (its config, row, Run, the model's origin)."""
    rl_args, sft_args = RUNS[name]
    if name == "gpt2":
        rl_args = rl_args + [f"--prompts_per_step={b.gpt2_prompts_per_step}",
                             f"--group_size={b.gpt2_group_size}"]
    cfg, algo, hp = rl.check(load_config(rl.Config, rl_args + SAME_WORK + b.rl_flags.split()))
    origin = cfg.sft_ckpt
    if b.fresh or not os.path.exists(cfg.sft_ckpt):
        origin = f"a fresh model of sft.py {' '.join(sft_args) or 'defaults'}"
        fresh_checkpoint(sft_args, os.path.join(tmp, "fresh.pt"), cfg.seed)
        cfg = replace(cfg, sft_ckpt=os.path.join(tmp, "fresh.pt"))
    cfg, run = rl.setup(cfg, algo, hp, torch.device("cpu"), 0, 1)
    return cfg, algo, run, origin


def measure(b, cfg, algo, run):
    """warmup + steps steps, then one counted -> ([{stage: (s, FLOPs)}, each timed step],
    [wall s], [sampled tokens], the counted step's Stages)."""
    stages, timed, walls, tokens = Stages(), [], [], []
    with patches(stages, run):
        for i in range(b.warmup + b.steps + 1):
            stages.reset(counting=i == b.warmup + b.steps)
            gen = seeded(torch.device("cpu"), "rollout", cfg.seed, 0, i + 1)
            t0 = time.perf_counter()
            stats = rl.train_step(cfg)(cfg, algo, run, cfg.lr, gen)
            wall = time.perf_counter() - t0
            if b.warmup <= i < b.warmup + b.steps:
                timed.append({k: (stages.sec[k], stages.flops[k]) for k in stages.sec})
                walls.append(wall)
                tokens.append(stats["perf/rollout_tokens"])
    return timed, walls, tokens, stages

# -------------------- peaks


def median_time(fn, repeats):
    """Seconds a call of fn: the median of repeats loops of at least 20 ms each."""
    fn()
    t0 = time.perf_counter()
    fn()
    n = max(1, math.ceil(0.02 / (time.perf_counter() - t0)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def big_gemm_peak(dtype, repeats, n=2048):
    """GFLOP/s of an n x n @ n x n matmul in dtype."""
    a, c = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / median_time(lambda: a @ c, repeats) / 1e9


def own_shape_peak(c, M, backward, repeats):
    """GFLOP/s, fp32, of a forward's linear layers at M rows x tokens, each its own weights as in
    the model: n_layer x (c_attn, c_proj, c_fc, mlp c_proj), lm_head; backward: each one's
    dX = dY @ W (M, N) @ (N, K) and dW = dY^T @ X (N, M) @ (M, K)."""
    C = c.n_embd
    block = [(3 * C, C, True), (C, C, True), (4 * C, C, True), (C, 4 * C, True)]
    shapes = block * c.n_layer + [(c.vocab_size, C, False)]  # (N out, K in, bias) a weight
    calls, flops = [], 0
    for N, K, bias in shapes:
        x, w, dy = torch.randn(M, K), torch.randn(N, K), torch.randn(M, N)
        bias = torch.randn(N) if bias else None
        if backward:
            calls += [lambda dy=dy, w=w: dy @ w, lambda dy=dy, x=x: dy.t() @ x]
        else:
            calls.append(lambda x=x, w=w, bias=bias: F.linear(x, w, bias))
        flops += 2 * M * N * K * (2 if backward else 1)
    return flops / median_time(lambda: [f() for f in calls], repeats) / 1e9


def typical_m(sizes):
    """The FLOP-weighted median M of a stage's forwards [(M, FLOPs)]."""
    sizes, half, seen = sorted(sizes), sum(f for _, f in sizes) / 2, 0
    for M, f in sizes:
        seen += f
        if seen >= half:
            return M


def cpu_name():
    """The CPU's model name from /proc/cpuinfo."""
    text = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = re.search(r"model name\s*:\s*(.*)", text)
    return name[1] if name else "unknown CPU"

# -------------------- the table


def si(x):
    """FLOPs as 3 significant digits and a unit: 1.23 G."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def copy_peak(n, repeats):
    """GB/s of copying n fp32 numbers: the optimizer's limit is memory, not matmuls."""
    a, b = torch.randn(n), torch.empty(n)
    return 8 * n / median_time(lambda: b.copy_(a), repeats) / 1e9


def own_peaks(gpt, timed, counted, repeats):
    """{stage: (own peak GFLOP/s, what it is)}: each stage that ran matmuls at its own shapes;
    the optimizer at the copy bandwidth, as the FLOPs it would do moving OPT_BYTES a parameter."""
    peaks, c = {}, gpt.config
    for name in STAGES[:-1]:
        if all(name in t for t in timed):
            backward = name == "policy backward"
            M = typical_m(counted.sizes["policy forward" if backward else name])
            peaks[name] = own_shape_peak(c, M, backward, repeats), f"M={M}"
    if all("optimizer" in t for t in timed):
        bw = copy_peak(sum(p.numel() for p in gpt.parameters()), repeats)
        peaks["optimizer"] = bw * OPT_FLOPS / OPT_BYTES, f"copy {bw:.0f} GB/s"
    return peaks


def stage_row(name, timed, step_s, counted, own, big):
    """A stage's cells: its FLOPs both ways, ms, share, GFLOP/s, % of each peak."""
    sec = statistics.median(t[name][0] for t in timed)
    rate = statistics.median(t[name][1] / t[name][0] / 1e9 for t in timed)
    formula, count = counted.flops[name], counted.counted[name]
    ratio = f" ({count / formula:.2f}x)" if count else " (no matmul counted)"
    own_cell = f"{100 * rate / own[0]:.0f}% ({own[1]})" if own else "-"
    return [name, si(formula), si(count) + ratio, f"{1e3 * sec:.1f}",
            f"{100 * sec / step_s:.0f}%", f"{rate:.1f}", own_cell, f"{100 * rate / big:.1f}%"]


def table(timed, walls, counted, own, big):
    """The markdown rows of one config: a row a stage, host overhead, the whole step."""
    step_s, rows = statistics.median(walls), []
    for name in STAGES:
        if all(name in t for t in timed):
            rows.append(stage_row(name, timed, step_s, counted, own.get(name), big))
        elif ABSENT.get(name):
            rows.append([name, ABSENT[name]] + ["-"] * 6)
    host = statistics.median(w - sum(s for s, _ in t.values()) for t, w in zip(timed, walls))
    rows.append(["host overhead", "-", "-", f"{1e3 * host:.1f}", f"{100 * host / step_s:.0f}%",
                 "-", "-", "-"])
    rate = statistics.median(sum(f for _, f in t.values()) / w / 1e9 for t, w in zip(timed, walls))
    rows.append(["whole step", si(sum(counted.flops.values())), si(sum(counted.counted.values())),
                 f"{1e3 * step_s:.1f}", "100%", f"{rate:.1f}", "-", f"{100 * rate / big:.1f}%"])
    return rows


def standin_gpt2(name):
    """GPT-2's vocabulary size where tiktoken's gpt2 file is not here (no network): 256 bytes,
    50,000 merges no text uses, EOS 50,256. The matmuls have GPT-2's shapes; a number is a token
    a digit, so rows are longer than with GPT-2's merges."""
    import tiktoken
    ranks = {bytes([i]): i for i in range(256)} | {f"~{i}".encode(): 256 + i for i in range(50000)}
    return bpe.BPETokenizer(tiktoken.Encoding(name, pat_str=bpe.PATTERN, mergeable_ranks=ranks,
                                              special_tokens={"<|endoftext|>": 50256}))


def report(b, name, big):
    """Build config name's step, time it, print its table (or one line: why it is skipped)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg, algo, run, origin = build_run(b, name, tmp)
        except TokenizerError as e:
            if name != "gpt2":
                return print(f"\n## {name}: skipped, its tokenizer is not here: {e}\n")
            print(f"\n{e}\n-> gpt2 runs with a stand-in of GPT-2's 50,257 ids (standin_gpt2)")
            with mock.patch.object(bpe, "load", standin_gpt2):
                cfg, algo, run, origin = build_run(b, name, tmp)
            origin += ", a stand-in encoding"
    timed, walls, tokens, counted = measure(b, cfg, algo, run)
    c = run.model.config
    own = own_peaks(run.model, timed, counted, b.repeats)
    params = sum(p.numel() for p in run.model.parameters()) / 1e6
    print(f"\n## {name}: {cfg.prompts_per_step} prompts x {cfg.group_size} samples, <= "
          f"{cfg.max_new_tokens} new tokens, beta {run.hp.get('beta')}, from {origin} "
          f"({c.n_layer} x {c.n_embd}, vocab {c.vocab_size}, {params:.2f}M parameters); "
          f"median of {b.steps} steps after {b.warmup}: {1e3 * statistics.median(walls):.0f} "
          f"ms a step, {statistics.median(tokens):,.0f} sampled tokens\n")
    header = ["stage", "FLOPs (formula)", "FLOPs (counter)", "ms", "share", "GFLOP/s",
              "% own-shape peak", "% big-GEMM peak"]
    for row in [header, ["---"] * len(header)] + table(timed, walls, counted, own, big):
        print("| " + " | ".join(row) + " |")


def main(b):
    torch.set_num_threads(b.threads)
    names = list(RUNS) if b.config == "all" else [b.config]
    if any(n not in RUNS for n in names):
        raise SystemExit(f"--config must be one of {', '.join(RUNS)} or all, got {b.config!r}")
    bf16, capability = bf16_default(torch.device("cpu")), torch.backends.cpu.get_cpu_capability()
    big = big_gemm_peak(torch.float32, b.repeats)
    big_bf16 = f", bf16 {big_gemm_peak(torch.bfloat16, b.repeats):.0f} GFLOP/s" if bf16 else ""
    print(f"CPU: {cpu_name()}; native bf16: {'yes' if bf16 else 'no'} (nanorl.ddp.bf16_default), "
          f"torch capability {capability}; {b.threads} thread(s); torch {torch.__version__}; "
          f"big-GEMM peak (2048^3): fp32 {big:.0f} GFLOP/s{big_bf16}. The steps run in fp32.")
    for name in names:
        report(b, name, big)


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
