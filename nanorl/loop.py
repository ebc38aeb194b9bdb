"""The training-loop bookkeeping sft.py, reward_model.py and rl.py share: the loop's settings,
lr schedule, the optimizer step (DDP sum, NaN check, clip), eval cadence, best.pt and ckpt.pt,
metrics and progress lines with an ETA, exact --resume, a clean stop on SIGINT/SIGTERM or at
max_seconds. rl.py runs its own loop from these pieces; `train` is the supervised one:

    dev, rank, world = start(cfg, positive=("n_layer",), non_negative=("eval_samples",))
    last_eval = train(cfg, model, tok, conf, train_step, run_eval, rank, "val/accuracy")
"""
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from model import seeded
from nanorl.checkpoint import load_checkpoint, restore, save_checkpoint
from nanorl.config import UserError, check_bounds, print_config
from nanorl.ddp import all_reduce, gather_objects, init_distributed, resolve_device, sync_grads
from nanorl.logger import Logger, StopFlag, fmt_time, nonfinite


@dataclass
class LoopConfig:  # the loop's settings (rl.py's defaults): each script's Config adds its own
    out_dir: str = "out/sft-mul"
    seed: int = 1337
    device: str = "auto"  # auto = cuda > mps > cpu
    threads: int = 0  # torch threads, 0 = torch's default
    max_iters: int = 300
    max_seconds: float = 0  # > 0: stop after the step at which training time passes this
    lr: float = 2e-4  # RL: a fresh optimizer at SFT's lr collapses the policy
    min_lr: Optional[float] = None  # end of the cosine decay; None = lr (constant after warmup)
    warmup_iters: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # 0 = off
    eval_interval: int = 25  # held-out eval this often, at step 0 and at the end
    ckpt_interval: int = 25  # ckpt.pt this often (and at every eval, and on SIGINT/SIGTERM)
    resume: bool = False  # continue exactly (weights, optimizer, state) from out_dir/ckpt.pt
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment (compare.py sets it)


@dataclass
class TrainConfig(LoopConfig):  # the supervised loop's (sft.py, reward_model.py)
    max_iters: int = 3000
    lr: float = 1e-3
    min_lr: Optional[float] = 1e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1
    eval_interval: int = 250
    ckpt_interval: int = 250
    batch_size: int = 256  # rows (or pairs) per optimizer step: the global batch
    val_interval: int = 50  # with target_val_accuracy: a val eval this often
    target_val_accuracy: Optional[float] = None  # stop once best.pt's val metric reaches this
    log_interval: int = 50


@dataclass
class State:  # what a checkpoint resumes besides weights and optimizer
    step: int = 0
    best_val: float = -1.0  # the best val metric so far: best.pt holds it
    train_s: float = 0.0  # seconds spent training (evals excluded): max_seconds, the ETA
    first_eval: dict = field(default_factory=dict)  # the held-out metrics at step 0
    last_eval: dict = field(default_factory=dict)


def start(cfg, positive=(), non_negative=()):
    """Reject out-of-range values of the loop's keys and of these; seed; print the config
    (rank 0). Returns (device, rank, world): under torchrun each rank takes its share."""
    check_bounds(cfg, (" ".join(("lr eval_interval ckpt_interval", *positive)), "> 0",
                       lambda v: v > 0),
                 (" ".join(("max_iters max_seconds warmup_iters weight_decay grad_clip min_lr",
                            *non_negative)), ">= 0", lambda v: v is None or v >= 0))
    dev = resolve_device(cfg.device)
    rank, world = init_distributed(dev)
    if rank == 0:
        print_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    return dev, rank, world


def lr_at(it, cfg):
    """Step it + 1's lr: linear warmup, then cosine decay from lr to min_lr (None: lr)."""
    min_lr = cfg.lr if cfg.min_lr is None else cfg.min_lr
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    frac = min(1.0, (it - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (cfg.lr - min_lr)


def adamw(model, lr, weight_decay, head_lr_scale=None):
    """AdamW (betas 0.9, 0.99), weight decay only on matrices (dim >= 2), not on biases and
    LayerNorm gains. With head_lr_scale the scalar head gets its own group at lr * it, no
    decay: PPO's value head starts at zero and must catch up with the returns."""
    head = set(model.score_head.parameters()) if head_lr_scale and model.score_head else set()
    params = [p for p in model.parameters() if p.requires_grad and p not in head]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if head:
        groups.append({"params": list(head), "weight_decay": 0.0, "lr_scale": head_lr_scale})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), fused=True)  # one kernel


def optimizer_step(model, opt, loss, lr, grad_clip, backward=True):
    """Backward (unless the caller accumulated the gradients; loss is then their total), sum
    the gradients over DDP ranks, refuse a NaN/inf (FloatingPointError naming the tensor),
    clip, step at lr (times a group's lr_scale). Returns the gradient norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if backward:
        opt.zero_grad()
        loss.backward()
    sync_grads(model)  # each rank divides by the global counts: the sum is the batch's
    params = [p for p in model.parameters() if p.grad is not None]
    gnorm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if not (torch.isfinite(loss) and torch.isfinite(gnorm)):
        raise FloatingPointError(nonfinite(loss, model))
    torch.nn.utils.clip_grads_with_norm_(params, grad_clip or math.inf, gnorm)
    opt.step()
    return gnorm


def resume(cfg, model, opt, tok, master, **same):
    """Load out_dir/ckpt.pt's weights and optimizer -> (its State, the checkpoint). It must
    hold this model and tokenizer, and its config these values (same: {key: value})."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    ck = load_checkpoint(path, hint="nothing to resume; drop --resume")
    found = {k: ck["config"].get(k) for k in same}
    if ck["model_args"] != asdict(model.config) or ck["tokenizer"] != tok.to_dict() \
            or found != same:
        raise UserError(f"{path}: cannot resume, it is not a run of this model and tokenizer "
                        f"with {same} (it has {found}, model {ck['model_args']})")
    restore(path, ck, model, opt, master)
    return State(**{k: ck[k] for k in asdict(State()) if k in ck}), ck


def save(cfg, name, model, opt, conf, state, tok, mine=None, **extra):
    """out_dir/name (ckpt.pt or best.pt), written by rank 0: weights, optimizer, config, state,
    extra, and as "ranks" every rank's own `mine` (ckpt.pt; best.pt holds rank 0's)."""
    ranks = gather_objects(mine) if name == "ckpt.pt" and mine is not None else [mine]
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_checkpoint(os.path.join(cfg.out_dir, name), model, opt, conf, state.step, tok,
                        **{k: v for k, v in asdict(state).items() if k != "step"},
                        **({"ranks": ranks} if mine is not None else {}), **extra)


def finish(logger):
    """Close the metrics (wandb) and, under torchrun, the process group."""
    logger.finish()
    if dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while another is still talking to it
        dist.destroy_process_group()


def summary(state, metric, pk, seconds, out_dir):
    """The run's last line: the held-out metric at the start and at the end."""
    m0, m = state.first_eval, state.last_eval
    gain = 100 * (m[metric] - m0[metric])
    line = f"{metric} {m0[metric]:.4f} -> {m[metric]:.4f} ({gain:+.1f} points)"
    if pk in m0:
        line += f", {pk} {m0[pk]:.4f} -> {m[pk]:.4f}"
    print(f"held-out {line} in {fmt_time(seconds)}; checkpoint {out_dir}/ckpt.pt", flush=True)


def stopping(cfg, state, stop):
    """(out of time, signalled), agreed by every rank so that all stop together."""
    flags = [0 < cfg.max_seconds <= state.train_s, stop.signal is not None]
    return tuple(bool(x) for x in (all_reduce(flags, "max") > 0).tolist())


def progress(cfg, state, line, t_step, elapsed):
    """The step's line: what it did, its time, and the ETA from the training time so far."""
    left = state.train_s / max(1, state.step) * (cfg.max_iters - state.step)
    left = min(left, cfg.max_seconds - state.train_s) if cfg.max_seconds > 0 else left
    return (f"step {state.step:5d}/{cfg.max_iters} | {line} | {t_step:.2f}s | "
            f"{fmt_time(elapsed)}, ETA {fmt_time(left)}")


def log_eval(logger, step, m, t0):
    """Log and print an eval's metrics (t0: when it began)."""
    logger.log({"step": step, **m})
    line = " ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float) and "/n" not in k)
    print(f"step {step:5d} | eval {line} | took {time.time() - t0:.1f}s", flush=True)


def run(cfg, state, step, evaluate, save, rank, logger, metric):
    """The loop of every script, until max_iters, max_seconds, the val target or a stop signal.
    At the top of step s: evaluate(full) (rank 0) at step 0, every eval_interval and at the end
    (full: test too; with a target, val alone every val_interval) -> (metrics, target reached),
    logged and kept, best.pt when the val `metric` improves; save(name) ckpt.pt at each eval,
    every ckpt_interval and on a signal: it holds everything logged up to s, so a resume
    repeats nothing. step() trains one step -> (its stats to log, its progress line) or None."""
    stop, t0, done = StopFlag(), time.time(), state.step if cfg.resume else -1
    target = getattr(cfg, "target_val_accuracy", None)
    try:
        while True:
            out_of_time, signalled = stopping(cfg, state, stop)
            s, last = state.step, state.step >= cfg.max_iters or out_of_time
            full = s % cfg.eval_interval == 0 or last
            evals = s != done and (full or target is not None and s % cfg.val_interval == 0)
            reached = False
            if evals and rank == 0:
                t, (m, reached) = time.time(), evaluate(full)
                state.last_eval = {k: v for k, v in m.items() if isinstance(v, float)}
                state.first_eval = state.first_eval or state.last_eval
                log_eval(logger, s, m, t)
                if m[metric] > state.best_val:
                    state.best_val = m[metric]
                    save("best.pt")
            reached = bool(all_reduce(reached, "max"))
            if signalled or evals or s % cfg.ckpt_interval == 0 and s != done:
                save("ckpt.pt")
            if signalled and rank == 0:
                print(f"{stop.signal or 'a stop signal'}: saved {cfg.out_dir}/ckpt.pt at step "
                      f"{s}; continue with --resume=true", flush=True)
            if reached or signalled or last:
                return
            t = time.time()
            try:
                out = step()
            except FloatingPointError as e:  # nothing stepped: ckpt.pt is the last good one
                raise UserError(f"step {s + 1}: non-finite {e}; stopped, last good checkpoint "
                                f"kept at {os.path.join(cfg.out_dir, 'ckpt.pt')}") from None
            state.step, state.train_s = s + 1, state.train_s + time.time() - t
            if out is not None:
                logger.log({"step": s + 1, **out[0], "perf/step_s": time.time() - t})
                if rank == 0:
                    print(progress(cfg, state, out[1], time.time() - t, time.time() - t0),
                          flush=True)
    finally:
        stop.restore()


def train(cfg, model, tok, conf, train_step, run_eval, rank, metric):
    """The supervised loop (sft.py, reward_model.py): train `model` (checkpoints hold it, with
    config conf). train_step(gen): forward and backward on this rank's share of a batch drawn
    with gen, each loss divided by the global batch's count -> ({"train/loss": loss, ...},
    n_tok). run_eval(split, step) -> metrics of "val" or "test" (rank 0); the val `metric`
    picks best.pt and meets target_val_accuracy. Returns the last eval's metrics."""
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    state, t0, window = State(), time.time(), [0, 0.0]  # window: tokens, seconds since a log
    if cfg.resume:
        state = resume(cfg, model, opt, tok, rank == 0)[0]
    logger = Logger(cfg.out_dir, cfg, enabled=rank == 0)

    def step():  # one optimizer step; every log_interval its stats and tokens/s
        t = time.time()
        model.train()
        opt.zero_grad()
        torch.manual_seed(seeded("cpu", "dropout", cfg.seed, rank, state.step).initial_seed())
        stats, n_tok = train_step(seeded("cpu", "batch", cfg.seed, rank, state.step))
        total = all_reduce([v.item() for v in stats.values()] + [n_tok]).tolist()  # rank sums
        lr = lr_at(state.step, cfg)
        gnorm = optimizer_step(model, opt, torch.tensor(total[0]), lr, cfg.grad_clip, False)
        stats = {**dict(zip(stats, total)), "train/lr": lr, "train/grad_norm": gnorm.item()}
        window[:] = window[0] + total[-1], window[1] + time.time() - t
        if (state.step + 1) % cfg.log_interval and state.step:
            return None
        stats.update({"perf/elapsed_s": time.time() - t0, "perf/tok_s": window[0] / window[1]})
        window[:] = 0, 0.0
        return stats, " ".join(f"{k[6:]} {v:.4g}" for k, v in stats.items() if k[:6] == "train/")

    def evaluate(full):  # val, and test when full or once val reaches the target
        m = run_eval("val", state.step)
        reached = cfg.target_val_accuracy is not None and m[metric] >= cfg.target_val_accuracy
        if full or reached:
            m.update(run_eval("test", state.step))
        if reached:
            print(f"{metric} {m[metric]:.4f} >= target_val_accuracy: stopping", flush=True)
        return m, reached

    run(cfg, state, step, evaluate, lambda name: save(cfg, name, model, opt, conf, state, tok),
        rank, logger, metric)
    if rank == 0:
        print(f"done in {fmt_time(time.time() - t0)}; best {metric} {state.best_val:.4f}",
              flush=True)
    finish(logger)
    return state.last_eval
