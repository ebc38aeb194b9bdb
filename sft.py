"""
Supervised fine-tuning (here: training from scratch) of the GPT on an arithmetic task.

    python sft.py configs/mul.py                 # ~4 min on a 2-core CPU -> out/sft-mul/ckpt.pt
    python sft.py configs/mul.py --lr=3e-4 --max_iters=500 --out_dir=out/try
    python sft.py --task=path/to/folder --reverse=false --verifier=text   # your own task (docs/guides.md)
    python sft.py configs/gpt2_mul.py            # GPT-2-small shape, tiktoken gpt2 BPE, the task in words
    python sft.py configs/gpt2_mul.py --init_from=gpt2   # from OpenAI's weights (needs transformers)

Loss on the response tokens (answer + EOS) by default, `--loss_on=all` for every token. AdamW with
linear warmup and cosine decay. Evaluates at step 0, every `eval_interval` and at the end: greedy
exact-match accuracy on val (`val/accuracy`, used for `best.pt` and `target_val_accuracy`) and on
test (`eval/accuracy`, `eval/n`, sampled `eval/pass@1`, `eval/pass@8`). Writes out_dir/ckpt.pt,
out_dir/best.pt and out_dir/metrics.jsonl; `--resume=true` continues from out_dir/ckpt.pt.
`--micro_batch_size` splits each batch into micro-batches whose gradients accumulate to the full
batch's (same global batch, less memory); `--tokenizer=gpt2` uses tiktoken's GPT-2 BPE;
`--init_from` loads Hugging Face GPT-2 weights (hub name or save_pretrained folder; gpt2.py).
"""
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from config import UserError, print_config, run_cli
from ddp import all_reduce, bf16_default, gather_objects, init_distributed, resolve_device
from evaluate import evaluate, gold_rows, verifier_of
from logger import Logger, StopFlag, fmt_time, nonfinite, truncate_metrics
from data.tasks import TASKS, load_split, task_alphabet
from checkpoint import load_checkpoint, save_checkpoint
from model import GPT, GPTConfig
from tokenizer import get_tokenizer


@dataclass
class Config:
    task: str = "mul"  # a name in data.tasks.TASKS, or a folder with train.txt, val.txt, test.txt (prompt=answer lines)
    verifier: str = "exact"  # a name in verify.VERIFIERS: the task's reward for every eval and for rl.py
    reverse: bool = True  # numbers least-significant digit first: 23*47=1081 is read as 32*74=1801
    tokenizer: str = "char"  # "char" (the task alphabet) or a tiktoken encoding, e.g. "gpt2"
    out_dir: str = "out/sft-mul"
    seed: int = 1337
    # model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 32
    dropout: float = 0.0
    init_from: str = "scratch"  # or Hugging Face GPT-2 weights: "gpt2", "gpt2-medium", ... or a save_pretrained folder
    # optimisation
    batch_size: int = 256  # rows per optimizer step (the global batch)
    micro_batch_size: int = 0  # rows per forward/backward, gradients accumulated over the batch; 0 = batch_size
    lr: float = 1e-3
    min_lr: float = 1e-4  # end of the cosine decay
    warmup_iters: int = 100
    max_iters: int = 3000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 = off
    bf16: Optional[bool] = None  # bf16 autocast of the training forward (fp32 weights and loss); None = if native
    device: str = "auto"  # auto = cuda > mps > cpu
    compile: bool = False  # torch.compile the training forward (checkpoints hold the plain model)
    loss_on: str = "response"  # "response" (answer + EOS) or "all" tokens
    # evaluation
    eval_interval: int = 250  # full eval: val and test greedy accuracy, test pass@1 / pass@8
    val_interval: int = 50  # with target_val_accuracy: a cheap val-only check this often
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8 (pass@n below 8; 0 = greedy only)
    eval_temperature: float = 1.0  # the RL sampling temperature
    max_new_tokens: int = 8
    target_val_accuracy: Optional[float] = None  # stop once val accuracy reaches this
    # io
    log_interval: int = 50
    ckpt_interval: int = 250  # ckpt.pt every this many steps (and at every eval, and on SIGINT/SIGTERM)
    resume: bool = False  # continue exactly (weights, optimizer, step, data order, RNGs) from out_dir/ckpt.pt
    threads: int = 0  # torch threads, 0 = torch's default
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment (compare.py sets it)


def lr_at(it, cfg):
    """Linear warmup, then cosine decay from lr to min_lr at max_iters."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    frac = min(1.0, (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (cfg.lr - cfg.min_lr)


def accumulate_grads(model, x, y, mask, micro_batch_size, bf16=False, n_tok=None):
    """Forward and backward over micro-batches of at most micro_batch_size rows of x, y, mask (N, T).
    Each micro-batch's summed token loss is divided by the target-token count of the whole batch
    (n_tok; default this batch's: under DDP the caller passes every rank's count / world_size), so the
    accumulated gradients equal the full batch's. Returns that batch's mean token loss
    (detached); the caller zeroes the gradients before and steps after."""
    n_tok, total = (mask.sum() if n_tok is None else n_tok), torch.zeros((), device=x.device)
    for i in range(0, len(x), micro_batch_size):
        rows = slice(i, i + micro_batch_size)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x[rows])  # (b, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), y[rows].flatten(), reduction="none")  # (b*T,)
        loss = (nll * mask[rows].flatten()).sum() / n_tok
        loss.backward()
        total += loss.detach()
    return total


def encode_split(tok, problems, reverse, block_size, loss_on):
    """Tokenise [(prompt, answer)] -> x, y (N, T) and the loss mask on the targets (N, T)."""
    rows = gold_rows(tok, problems, reverse)  # [(prompt ids, answer ids + EOS)]
    T = max(len(p) + len(r) for p, r in rows) - 1
    if T + 1 > block_size:
        i = next(i for i, (p, r) in enumerate(rows) if len(p) + len(r) > block_size)
        raise UserError(f"problem {i + 1} ({''.join(problems[i])}) is {len(rows[i][0]) + len(rows[i][1])} tokens with EOS; "
                        f"block_size={block_size} does not fit it")
    x = torch.full((len(rows), T), tok.pad_id, dtype=torch.long)
    y = torch.full((len(rows), T), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    for i, (p, r) in enumerate(rows):
        seq = p + r
        x[i, :len(seq) - 1] = torch.tensor(seq[:-1])
        y[i, :len(seq) - 1] = torch.tensor(seq[1:])
        start = len(p) - 1 if loss_on == "response" else 0  # target index of the first answer token
        mask[i, start:len(seq) - 1] = 1.0  # EOS is a target: stopping gets a gradient
    return x, y, mask


def check_config(cfg):
    """Reject bad values before any work starts."""
    if cfg.loss_on not in ("response", "all"):
        raise UserError(f"loss_on must be 'response' or 'all', got {cfg.loss_on!r}")
    positive = ("lr", "batch_size", "n_layer", "n_head", "n_embd", "block_size", "max_new_tokens", "eval_interval",
                "val_interval", "log_interval", "ckpt_interval")
    for k in positive:
        if getattr(cfg, k) <= 0:
            raise UserError(f"{k} must be > 0, got {getattr(cfg, k)}")
    for k in ("min_lr", "warmup_iters", "max_iters", "weight_decay", "grad_clip", "eval_samples", "dropout", "micro_batch_size"):
        if getattr(cfg, k) < 0:
            raise UserError(f"{k} must be >= 0, got {getattr(cfg, k)}")
    if not 0 <= cfg.dropout < 1 or not 0 <= cfg.beta1 < 1 or not 0 <= cfg.beta2 < 1:
        raise UserError("dropout, beta1 and beta2 must be in [0, 1)")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"n_embd={cfg.n_embd} must be divisible by n_head={cfg.n_head}")
    if TASKS.get(cfg.task, {}).get("text") and cfg.tokenizer == "char":
        raise UserError(f"task {cfg.task!r} is asked in words: it needs a BPE tokenizer (--tokenizer=gpt2)")


def main(cfg):
    check_config(cfg)
    verifier = verifier_of(cfg.verifier)
    dev = resolve_device(cfg.device)
    rank, world = init_distributed(dev)  # torchrun: each rank draws batch_size / world_size rows, DDP averages
    master = rank == 0  # rank 0 alone evaluates, prints, saves and logs
    if cfg.batch_size % world:
        raise UserError(f"batch_size={cfg.batch_size} must divide by the {world} ranks")
    if master:
        print_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    # a built-in task's files are generated on first use; your own task's folder is read as is (any characters)
    train, val, test = (load_split(cfg.task, s) for s in ("train", "val", "test"))
    tok = get_tokenizer(cfg.tokenizer, task_alphabet(cfg.task, train + val + test))
    x, y, lmask = (t.to(dev) for t in encode_split(tok, train, cfg.reverse, cfg.block_size, cfg.loss_on))
    if master:
        print(f"{cfg.task}: {len(train)} train / {len(val)} val / {len(test)} test problems", flush=True)

    if cfg.init_from == "scratch":
        model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=tok.vocab_size, n_layer=cfg.n_layer,
                              n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout))
    else:  # Hugging Face GPT-2 weights: n_layer, n_head and n_embd are theirs
        from gpt2 import from_pretrained  # the GPT-2-size extras, only for --init_from
        model = from_pretrained(cfg.init_from, cfg.block_size, cfg.dropout)
        if model.config.vocab_size != tok.vocab_size:
            raise UserError(f"init_from={cfg.init_from!r} has {model.config.vocab_size} tokens, the tokenizer "
                            f"{cfg.tokenizer!r} {tok.vocab_size}: use the model's own (--tokenizer=gpt2)")
    model.to(dev)
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    fwd = torch.compile(model) if cfg.compile else model
    ddp = torch.nn.parallel.DistributedDataParallel(fwd) if world > 1 else fwd  # all-reduces gradients in backward
    gen = torch.Generator().manual_seed(cfg.seed + 1000 * rank)  # batch order, per rank
    eval_gen = torch.Generator(dev).manual_seed(cfg.seed + 1)  # pass@k samples
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    step, best, resumed_at = 0, -1.0, None
    if cfg.resume:
        ckpt = load_checkpoint(ckpt_path, hint="nothing to resume; drop --resume")
        if ckpt["model_args"] != asdict(model.config) or ckpt["tokenizer"] != tok.to_dict() or len(ckpt.get("ranks", [])) != world:
            raise UserError(f"{ckpt_path}: cannot resume, the checkpoint's model, tokenizer or number of ranks "
                            f"({len(ckpt.get('ranks', []))}) differs from this run's (model {ckpt['model_args']})")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, best = ckpt["step"], ckpt.get("best_val", -1.0)
        resumed_at = step  # its eval is already logged
        gen.set_state(ckpt["ranks"][rank]["batch"])
        torch.set_rng_state(ckpt["ranks"][rank]["torch"])
        eval_gen.set_state(ckpt["eval_rng"])
        if master:
            truncate_metrics(os.path.join(cfg.out_dir, "metrics.jsonl"), step)
            print(f"resumed from {ckpt_path} at step {step}", flush=True)
    # native bf16 matmuls (AVX512-BF16 / AMX, CUDA) make a CPU step ~1.5x faster; elsewhere bf16 is emulated
    use_bf16 = cfg.bf16 if cfg.bf16 is not None else bf16_default(dev)
    if master:
        print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters on {dev}, bf16 autocast "
              f"{use_bf16}, compile {cfg.compile}, {world} rank(s)",
              flush=True)
    logger = Logger(cfg.out_dir, cfg, enabled=master)

    def run_eval(full):
        """Val greedy accuracy; with full, also test greedy accuracy and sampled pass@1/pass@8."""
        t_eval = time.time()
        if full:
            print(f"step {step:5d} | evaluating: {len(val)} val, {len(test)} test problems x {cfg.eval_samples} samples", flush=True)
        model.eval()
        m, _ = evaluate(model, tok, val, cfg.reverse, cfg.max_new_tokens, prefix="val", verifier=verifier)
        if full:
            mt, examples = evaluate(model, tok, test, cfg.reverse, cfg.max_new_tokens, n_samples=cfg.eval_samples,
                                    temperature=cfg.eval_temperature, generator=eval_gen, verifier=verifier)
            m.update(mt)
            m["eval/examples"] = examples
        model.train()
        logger.log({"step": step, **m})
        print(f"step {step:5d} | eval " + " ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float))
              + f" | took {time.time() - t_eval:.1f}s", flush=True)
        return m["val/accuracy"]

    def rank_state():
        return {"batch": gen.get_state(), "torch": torch.get_rng_state()}

    def save(name, ranks):  # ranks: every rank's generators (gather_objects), so that resume is exact
        if master:
            save_checkpoint(os.path.join(cfg.out_dir, name), model, opt, asdict(cfg), step, tok, ranks=ranks,
                            eval_rng=eval_gen.get_state(), best_val=best)

    tokens_per_step = cfg.batch_size // world * x.size(1)  # every position of a row is computed
    t0, stop, train_s, train_steps = time.time(), StopFlag(), 0.0, 0
    model.train()
    try:
        while True:  # the checkpoint at the top of step s holds everything logged up to s
            last = step >= cfg.max_iters
            full = step % cfg.eval_interval == 0 or last
            check = cfg.target_val_accuracy is not None and step % cfg.val_interval == 0
            reached = False
            if (full or check) and step != resumed_at and master:
                acc = run_eval(full)
                reached = cfg.target_val_accuracy is not None and acc >= cfg.target_val_accuracy
                if reached and not full:
                    run_eval(full=True)  # the run's last row always has the full held-out metrics
                if acc > best:
                    best = acc
                    save("best.pt", [rank_state()])
            reached, stopping = (all_reduce([float(reached), float(stop.signal is not None)], "max") > 0).tolist()
            if step != resumed_at and ((full or check) or step % cfg.ckpt_interval == 0) or stopping:
                save("ckpt.pt", gather_objects(rank_state()))
            if reached:
                if master:
                    print(f"val accuracy {acc:.4f} >= target_val_accuracy {cfg.target_val_accuracy}: stopping", flush=True)
                break
            if stopping:
                if master:
                    print(f"{stop.signal or 'stop signal'}: saved {ckpt_path} at step {step}; continue with "
                          "--resume=true", flush=True)
                break
            if last:
                break
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            t_step = time.time()
            idx = torch.randint(len(x), (cfg.batch_size // world,), generator=gen).to(dev)
            n_targets = all_reduce(lmask[idx].sum()).item() / world  # every rank's: DDP averages, so / world
            opt.zero_grad()
            loss = accumulate_grads(ddp, x[idx], y[idx], lmask[idx], cfg.micro_batch_size or cfg.batch_size, use_bf16, n_targets)
            bad = nonfinite(loss, model)
            if bad:  # nothing is stepped or saved: the last checkpoint stays the last good one
                raise UserError(f"step {step + 1}: non-finite {bad}; stopped, last good checkpoint kept at {ckpt_path}")
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            opt.step()
            step += 1
            train_s, train_steps = train_s + time.time() - t_step, train_steps + 1
            if step % cfg.log_interval == 0 or step == 1:
                dt = time.time() - t0
                eta = dt / (step - (resumed_at or 0)) * (cfg.max_iters - step)  # mean step time so far, evals included
                tok_s = tokens_per_step * train_steps / train_s  # this rank's training tokens/s since the last log
                loss = all_reduce(loss.item()).item() / world  # the mean over every rank's target tokens
                logger.log({"step": step, "train/loss": loss, "train/lr": lr, "train/grad_norm": gnorm.item(),
                            "perf/elapsed_s": dt, "perf/tok_s": tok_s * world})
                train_s, train_steps = 0.0, 0
                if master:
                    print(f"step {step:5d}/{cfg.max_iters} | loss {loss:.4f} | lr {lr:.2e} | {fmt_time(dt)}, "
                          f"ETA {fmt_time(eta)}", flush=True)
    finally:
        stop.restore()
    if master:
        print(f"done in {time.time() - t0:.0f}s; best val accuracy {best:.4f}; checkpoint {ckpt_path}", flush=True)
    logger.finish()
    return model


if __name__ == "__main__":
    run_cli(main, Config)
