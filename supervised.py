"""The training loop sft.py and reward_model.py share: warmup and cosine lr, val/test evals, best.pt
and ckpt.pt, metrics and progress lines, exact --resume, a clean stop on SIGINT/SIGTERM.

    dev, rank, world = setup(cfg, positive=("n_layer",), non_negative=("eval_samples",))
    last_eval = train(cfg, model, tok, conf, train_step, run_eval, rank, "val/accuracy")
"""
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from checkpoint import load_checkpoint, restore, save_checkpoint
from config import UserError, check_bounds, print_config
from ddp import all_reduce, init_distributed, resolve_device
from logger import Logger, StopFlag, fmt_time
from model import seeded
from policy import optimizer_step


@dataclass
class TrainConfig:  # the loop's settings: each script's Config adds its own
    out_dir: str = "out/sft-mul"
    seed: int = 1337
    device: str = "auto"  # auto = cuda > mps > cpu
    threads: int = 0  # torch threads, 0 = torch's default
    batch_size: int = 256  # rows (or pairs) per optimizer step: the global batch
    lr: float = 1e-3
    min_lr: Optional[float] = 1e-4  # end of the cosine decay; None = lr (constant after warmup)
    warmup_iters: int = 100
    max_iters: int = 3000
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 = off
    eval_interval: int = 250  # val and test eval this often, at step 0 and at the end
    val_interval: int = 50  # with target_val_accuracy: a val eval this often
    target_val_accuracy: Optional[float] = None  # stop once the val metric of best.pt reaches this
    log_interval: int = 50
    ckpt_interval: int = 250  # ckpt.pt this often (and at every eval, and on SIGINT/SIGTERM)
    resume: bool = False  # continue exactly (weights, optimizer, step, best) from out_dir/ckpt.pt
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment


def setup(cfg, positive=(), non_negative=()):
    """Reject out-of-range values of the loop's keys and of these; seed; print the config (rank 0).
    Returns (device, rank, world): under torchrun each rank takes batch_size / world of a batch."""
    check_bounds(cfg, (" ".join(("lr batch_size eval_interval val_interval log_interval ckpt_interval",
                                 *positive)), "> 0", lambda v: v > 0),
                 (" ".join(("min_lr warmup_iters max_iters weight_decay grad_clip", *non_negative)),
                  ">= 0", lambda v: v is None or v >= 0))  # min_lr None: constant lr
    dev = resolve_device(cfg.device)
    rank, world = init_distributed(dev)
    if cfg.batch_size % world:
        raise UserError(f"batch_size={cfg.batch_size} must divide by the {world} ranks")
    if rank == 0:
        print_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    return dev, rank, world


def lr_at(it, cfg):
    """Linear warmup, then cosine decay from lr to min_lr (None: lr) at max_iters."""
    min_lr = cfg.lr if cfg.min_lr is None else cfg.min_lr
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    frac = min(1.0, (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (cfg.lr - min_lr)


def resume(cfg, model, opt, tok, master):
    """Load out_dir/ckpt.pt's weights and optimizer state; returns its (step, best)."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    ckpt = load_checkpoint(path, hint="nothing to resume; drop --resume")
    if ckpt["model_args"] != asdict(model.config) or ckpt["tokenizer"] != tok.to_dict():
        raise UserError(f"{path}: cannot resume, the checkpoint's model or tokenizer differs from "
                        f"this run's (model {ckpt['model_args']})")
    restore(path, ckpt, model, opt, master)
    return ckpt["step"], ckpt["best_val"]


def take_step(cfg, model, opt, train_step, step, rank):
    """Step step + 1: train_step's gradients, then policy.optimizer_step (DDP sum, NaN check, clip,
    AdamW at lr_at(step)). Returns its stats and token count, each summed over ranks."""
    model.train()
    opt.zero_grad()
    torch.manual_seed(seeded("cpu", "dropout", cfg.seed, rank, step).initial_seed())  # no RNG state
    stats, n_tok = train_step(seeded("cpu", "batch", cfg.seed, rank, step))
    total = all_reduce([v.item() for v in stats.values()] + [n_tok]).tolist()  # each rank's share
    lr = lr_at(step, cfg)
    try:
        gnorm = optimizer_step(model, opt, torch.tensor(total[0]), lr, cfg.grad_clip or math.inf,
                               backward=False)
    except FloatingPointError as e:  # nothing stepped or saved: ckpt.pt stays the last good one
        raise UserError(f"step {step + 1}: non-finite {e}; stopped, last good checkpoint kept at "
                        f"{os.path.join(cfg.out_dir, 'ckpt.pt')}") from None
    return {**dict(zip(stats, total)), "train/lr": lr, "train/grad_norm": gnorm.item()}, total[-1]


def log_eval(logger, run_eval, step, full, target, metric):
    """Val metrics, plus test's when full or when val's `metric` reaches target (so the last row
    has them); logged and printed. Returns (metrics, reached)."""
    t = time.time()
    m = run_eval("val", step)
    reached = target is not None and m[metric] >= target
    if full or reached:
        m.update(run_eval("test", step))
    logger.log({"step": step, **m})
    line = " ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float))
    print(f"step {step:5d} | eval {line} | took {time.time() - t:.1f}s", flush=True)
    return m, reached


def log_progress(cfg, logger, step, stats, dt, steps_done, tok_s):
    """A metrics row and a progress line; the ETA from the mean step time so far, evals included."""
    logger.log({"step": step, **stats, "perf/elapsed_s": dt, "perf/tok_s": tok_s})
    eta = dt / steps_done * (cfg.max_iters - step)
    line = " ".join(f"{k[6:]} {v:.4g}" for k, v in stats.items())  # keys without "train/"
    print(f"step {step:5d}/{cfg.max_iters} | {line} | {fmt_time(dt)}, ETA {fmt_time(eta)}",
          flush=True)


def train(cfg, model, tok, conf, train_step, run_eval, rank, metric):
    """Train `model` (the plain GPT: checkpoints hold it, with config conf) for max_iters steps.
    train_step(gen): forward and backward on this rank's share of a batch drawn with gen, each loss
    divided by the global batch's count (tokens, pairs); returns ({"train/loss": loss, ...}, n_tok).
    run_eval(split, step) -> metrics of split "val" or "test", rank 0 only; the val `metric` picks
    best.pt and meets target_val_accuracy. Returns the last eval's metrics."""
    master, target = rank == 0, cfg.target_val_accuracy
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (0.9, 0.99))
    step, best = resume(cfg, model, opt, tok, master) if cfg.resume else (0, -1.0)
    start, done = step, (step if cfg.resume else -1)  # done: this step's evals are logged already
    logger = Logger(cfg.out_dir, cfg, enabled=master)

    def save(name):
        save_checkpoint(os.path.join(cfg.out_dir, name), model, opt, conf, step, tok, best_val=best)

    t0, stop, m, train_s, tokens = time.time(), StopFlag(), {}, 0.0, 0
    try:
        while True:  # the checkpoint at the top of step s holds everything logged up to s
            last = step >= cfg.max_iters
            full = step % cfg.eval_interval == 0 or last
            evals = step != done and (full or target is not None and step % cfg.val_interval == 0)
            reached = False
            if evals and master:
                m, reached = log_eval(logger, run_eval, step, full, target, metric)
                if m[metric] > best:
                    best = m[metric]
                    save("best.pt")
            reached, stopping = (all_reduce([reached, stop.signal is not None], "max") > 0).tolist()
            if master and (stopping or evals or step % cfg.ckpt_interval == 0 and step != done):
                save("ckpt.pt")
            if master and reached:
                print(f"{metric} {m[metric]:.4f} >= target_val_accuracy: stopping", flush=True)
            if master and stopping:
                print(f"{stop.signal or 'a stop signal'}: saved ckpt.pt at step {step}; continue "
                      "with --resume=true", flush=True)
            if reached or stopping or last:
                break
            t = time.time()
            stats, n_tok = take_step(cfg, model, opt, train_step, step, rank)
            step, train_s, tokens = step + 1, train_s + time.time() - t, tokens + n_tok
            if master and (step % cfg.log_interval == 0 or step == 1):
                log_progress(cfg, logger, step, stats, time.time() - t0, step - start,
                             tokens / train_s)
                train_s, tokens = 0.0, 0
    finally:
        stop.restore()
    if master:
        print(f"done in {fmt_time(time.time() - t0)}; best {metric} {best:.4f}", flush=True)
    logger.finish()
    return m
