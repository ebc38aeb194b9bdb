"""
The bookkeeping every training loop shares. sft.py, reward_model.py and rl.py each write their
own loop, top to bottom, and ask a Clock what to do at the top of each step:

    with Clock(cfg, state, rank) as clock:
        while True:
            now = clock.tick()                   # the same answer on every rank
            if now.evaluate and rank == 0 and clock.new_best(clock.log_eval(evaluate())):
                save("best.pt")                  # the best val/accuracy so far
            if now.save:
                save("ckpt.pt")
            if now.stop:
                break
            with clock.step():                   # timed; a NaN or inf stops the run here
                stats, line = one_step()
            clock.log(stats, line)

Also here: the loop's settings, the lr schedule, the supervised optimizer step (the DDP sum, then
model.optimizer_step), exact --resume, checkpoints, metrics.jsonl and wandb (Logger), progress
lines with an ETA, a clean stop on SIGINT / SIGTERM or at max_seconds.
"""
import contextlib
import json
import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from data.tasks import atomic_write
from nanorl.checkpoint import load_checkpoint, save_checkpoint
from nanorl.config import UserError, check_bounds, print_config
from model import optimizer_step
from nanorl.ddp import all_reduce, gather_objects, init_distributed, resolve_device, sync_grads


@dataclass
class LoopConfig:  # the settings every script's loop has (each script adds its own)
    seed: int = 1337
    device: str = "auto"  # auto = cuda > mps > cpu
    threads: int = 0  # torch threads, 0 = torch's default
    max_seconds: float = 0  # > 0: stop after the step at which training time passes this
    grad_clip: float = 1.0  # 0 = off
    ckpt_interval: int = 25  # ckpt.pt this often (and at every eval, and on SIGINT/SIGTERM)
    resume: bool = False  # continue exactly (weights, optimizer, state) from out_dir/ckpt.pt
    wandb: bool = False
    wandb_project: str = "nanorl"
    wandb_run_name: str = ""
    wandb_group: str = ""  # runs of one experiment (compare.py sets it)


@dataclass
class TrainConfig(LoopConfig):  # the supervised loop's (sft.py, reward_model.py)
    out_dir: str = "out/sft-mul"
    max_iters: int = 3000
    lr: float = 1e-3
    min_lr: Optional[float] = 1e-4  # end of the cosine decay; None = lr (constant after warmup)
    warmup_iters: int = 100
    weight_decay: float = 0.1
    eval_interval: int = 250  # held-out eval this often, at step 0 and at the end
    ckpt_interval: int = 250
    batch_size: int = 256  # rows (or pairs) per optimizer step: the global batch
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
    check_bounds(cfg, " ".join(("lr eval_interval ckpt_interval", *positive, "> 0")),
                 " ".join(("max_iters max_seconds warmup_iters weight_decay grad_clip min_lr",
                           *non_negative, ">= 0")))
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


def supervised_update(cfg, model, opt, state, stats, n_tok):
    """sft.py's and reward_model.py's step after their backward: this rank's stats (the loss
    first) and tokens summed over ranks, the optimizer step at this step's lr -> (the stats,
    with lr and gradient norm, every rank's tokens)."""
    total = all_reduce([float(v) for v in stats.values()] + [n_tok]).tolist()  # rank sums
    lr = lr_at(state.step, cfg)
    sync_grads(model)  # each rank divides by the global counts: the sum is the batch's
    gnorm = optimizer_step(model, opt, torch.tensor(total[0]), lr, cfg.grad_clip)
    return {**dict(zip(stats, total)), "train/lr": lr, "train/grad_norm": gnorm.item()}, total[-1]


# -------------------------------------------------------------- checkpoints


# what a resumed run may set anew: when it stops, evaluates, saves and logs, where it runs, memory
MAY_CHANGE = {"max_iters", "max_seconds", "eval_interval", "val_interval", "ckpt_interval",
              "log_interval", "eval_samples", "target_val_accuracy", "resume", "out_dir", "device",
              "threads", "compile", "micro_batch_size", "sample_batch_size", "log_rollouts",
              "log_every", "wandb", "wandb_project", "wandb_run_name", "wandb_group"}


def resume(cfg, model, opt, tok, master, run_config):
    """Load out_dir/ckpt.pt's weights and optimizer -> (its State, the checkpoint). It must
    hold this model and tokenizer, and its config run_config's every value but MAY_CHANGE's (the
    rest changes what is trained); rank 0 drops the metrics.jsonl rows logged after its step, so
    that none repeats."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    ck = load_checkpoint(path, hint="nothing to resume; drop --resume")
    if ck["model_args"] != asdict(model.config) or ck["tokenizer"] != tok.to_dict():
        raise UserError(f"{path}: cannot resume, it is not a run of this model and tokenizer "
                        f"(it has model {ck['model_args']})")
    was = {k: ck["config"].get(k, v) for k, v in run_config.items() if k not in MAY_CHANGE}
    new = {k: run_config[k] for k in was if was[k] != run_config[k]}
    if new:
        raise UserError(f"{path}: cannot resume with " + ", ".join(f"{k}={v!r}" for k, v in
                        new.items()) + ": the run has " + ", ".join(f"{k}={was[k]!r}" for k in new)
                        + ", and a resumed run trains on what it did (set those, or a new out_dir)")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    if master:
        truncate_metrics(os.path.join(cfg.out_dir, "metrics.jsonl"), ck["step"])
        print(f"resumed from {path} at step {ck['step']}", flush=True)
    return State(**{k: ck[k] for k in asdict(State()) if k in ck}), ck


def save(cfg, name, model, opt, run_config, state, tok, rank_state=None, **extra):
    """out_dir/name (ckpt.pt or best.pt), written by rank 0: weights, optimizer, config, state,
    extra, and under "ranks" every rank's own rank_state (ckpt.pt; best.pt holds rank 0's)."""
    ranks = gather_objects(rank_state) if name == "ckpt.pt" and rank_state else [rank_state]
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_checkpoint(os.path.join(cfg.out_dir, name), model, opt, run_config, state.step, tok,
                        **{k: v for k, v in asdict(state).items() if k != "step"},
                        **({"ranks": ranks} if rank_state else {}), **extra)


def truncate_metrics(path, step):
    """On resume, drop the rows logged after the checkpoint's step so that none repeats."""
    keep = []
    for line in open(path) if os.path.exists(path) else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line half-written by a killed run
            if json.loads(line).get("step", 0) <= step:
                keep.append(line.rstrip("\n") + "\n")
    atomic_write(path, lambda f: f.writelines(keep))

# -------------------------------------------------------------- metrics, the clock


class Logger:
    """metrics.jsonl rows, and wandb's when cfg.wandb (run config: cfg + `resolved`; a failure there
    warns, never stops). A fresh run moves an old metrics.jsonl to .prev; enabled=False: nothing."""

    def __init__(self, out_dir, cfg, resolved=None, enabled=True):
        self.path, self.enabled, self.wandb = os.path.join(out_dir, "metrics.jsonl"), enabled, None
        if enabled:
            os.makedirs(out_dir, exist_ok=True)
            if not getattr(cfg, "resume", False) and os.path.exists(self.path):
                os.replace(self.path, self.path + ".prev")
        if enabled and cfg.wandb:
            def start_wandb():
                import wandb  # only when asked for: slow to import
                return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                                  group=getattr(cfg, "wandb_group", "") or None,
                                  config={**asdict(cfg), **(resolved or {})}, dir=out_dir)
            self.wandb = self._wandb(start_wandb)

    def _wandb(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except Exception as e:
            print(f"warning: wandb disabled ({e.__class__.__name__}: {e})", flush=True)
            self.wandb = None

    def log(self, metrics):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
        if self.wandb is not None:
            self._wandb(self.wandb.log, metrics, step=metrics["step"])

    def finish(self):
        if self.wandb is not None:
            self._wandb(self.wandb.finish)


@dataclass
class Now:  # what the loop does at the top of a step
    evaluate: bool  # rank 0 evaluates
    full: bool  # every split (not only val)
    save: bool  # ckpt.pt
    stop: bool


class Clock:
    """One run's step counter and schedule: at the top of step s (tick), evaluate at 0, every
    eval_interval and at the end, save ckpt.pt at each eval, every ckpt_interval and on a signal,
    stop at max_iters, max_seconds or a signal; a resumed run repeats nothing its checkpoint holds.
    It logs an eval (log_eval), says if it is the best so far (new_best), times a step (step), logs
    it with an ETA (log); on exit it restores the signal handlers, closes wandb and DDP."""

    def __init__(self, cfg, state, rank, resolved=None):
        self.cfg, self.state, self.rank = cfg, state, rank
        self.logger = Logger(cfg.out_dir, cfg, resolved, enabled=rank == 0)  # resolved: wandb's
        self.resumed = state.step if cfg.resume else -1  # that step's eval and save are done
        self.t0, self.signal, self.signalled = time.time(), None, False
        self.handlers = {}
        if threading.current_thread() is threading.main_thread():  # Python's signals go there
            self.handlers = {s: signal.signal(s, self.handle)
                             for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame):
        """SIGINT / SIGTERM: finish the step, save, exit 0; another a second or more later stops
        at once. One stop sent twice is one (`timeout` signals the run, then its group)."""
        if self.signal is not None:
            if time.time() - self.signal_t >= 1.0:
                raise KeyboardInterrupt
            return
        self.signal, self.signal_t = signal.Signals(signum).name, time.time()
        print(f"\n{self.signal}: saving and exiting after this step (again: stop now)", flush=True)

    def tick(self, val=False):
        """-> Now at the top of step state.step, agreed by every rank. val: a val-only eval is
        due as well (sft.py's target)."""
        cfg, s = self.cfg, self.state.step
        out_of_time, signalled = (all_reduce([0 < cfg.max_seconds <= self.state.train_s,
                                              self.signal is not None], "max") > 0).tolist()
        full = s % cfg.eval_interval == 0 or s >= cfg.max_iters or out_of_time
        self.signalled, self.t_eval = signalled, time.time()
        evaluate = s != self.resumed and (full or val)
        save = signalled or evaluate or s % cfg.ckpt_interval == 0 and s != self.resumed
        return Now(evaluate, full, save, signalled or s >= cfg.max_iters or out_of_time)

    def log_eval(self, metrics):
        """Log an eval (rank 0), print its line, keep it as the last (and first) eval -> metrics."""
        self.state.last_eval = {k: v for k, v in metrics.items() if isinstance(v, float)}
        self.state.first_eval = self.state.first_eval or self.state.last_eval
        self.logger.log({"step": self.state.step, **metrics})
        line = " ".join(f"{k} {v:.4f}" for k, v in self.state.last_eval.items() if "/n" not in k)
        print(f"step {self.state.step:5d} | eval {line} | took {time.time() - self.t_eval:.1f}s",
              flush=True)
        return metrics

    def new_best(self, metrics, metric="val/accuracy"):
        """Whether `metric` beats every earlier eval (a tie does not); kept as state.best_val."""
        best = metrics[metric] > self.state.best_val
        self.state.best_val = max(metrics[metric], self.state.best_val)
        return best

    @contextlib.contextmanager
    def step(self):
        """One training step, timed into state.train_s; a non-finite loss or gradient stops
        the run with one line, the last checkpoint the good one."""
        t = time.time()
        try:
            yield
        except FloatingPointError as e:  # nothing stepped: ckpt.pt is the last good one
            raise UserError(f"step {self.state.step + 1}: non-finite {e}; stopped, last good "
                            f"checkpoint kept at {os.path.join(self.cfg.out_dir, 'ckpt.pt')}") \
                from None
        self.t_step = time.time() - t
        self.state.step += 1
        self.state.train_s += self.t_step

    def log(self, stats, line):
        """The step's stats to metrics.jsonl, and (rank 0) its line: what it did, its time,
        and the ETA from the training time so far."""
        s, cfg = self.state.step, self.cfg
        self.logger.log({"step": s, **stats, "perf/step_s": self.t_step})
        left = self.state.train_s / s * (cfg.max_iters - s)
        left = min(left, cfg.max_seconds - self.state.train_s) if cfg.max_seconds > 0 else left
        if self.rank == 0:
            print(f"step {s:5d}/{cfg.max_iters} | {line} | {self.t_step:.2f}s | "
                  f"{fmt_time(time.time() - self.t0)}, ETA {fmt_time(left)}", flush=True)

    def __enter__(self):
        return self

    def summary(self, metric, pass_k):
        """The run's last line: the held-out metric at the start and at the end."""
        m0, m = self.state.first_eval, self.state.last_eval
        line = f"{metric} {m0[metric]:.4f} -> {m[metric]:.4f} " \
               f"({100 * (m[metric] - m0[metric]):+.1f} points)"
        line += f", {pass_k} {m0[pass_k]:.4f} -> {m[pass_k]:.4f}" if pass_k in m0 else ""
        print(f"held-out {line} in {fmt_time(time.time() - self.t0)}; checkpoint "
              f"{self.cfg.out_dir}/ckpt.pt", flush=True)

    def __exit__(self, *exc):
        for s, h in self.handlers.items():
            signal.signal(s, h)
        if exc[0] is None and self.signalled and self.rank == 0:
            print(f"{self.signal or 'a stop signal'}: saved {self.cfg.out_dir}/ckpt.pt at step "
                  f"{self.state.step}; continue with --resume=true", flush=True)
        self.logger.finish()
        if dist.is_initialized() and exc[0] is None:
            dist.barrier()  # no rank tears gloo down while another is still talking to it
            dist.destroy_process_group()


def fmt_time(seconds):
    """Seconds -> '42s', '3m05s' or '1h02m' for progress lines."""
    s = int(round(max(0.0, seconds)))
    h, m = divmod(s // 60, 60)
    return f"{s}s" if s < 60 else f"{m}m{s % 60:02d}s" if s < 3600 else f"{h}h{m:02d}m"
