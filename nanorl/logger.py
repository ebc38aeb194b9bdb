"""What a run reports and how it stops: metrics.jsonl (+ wandb), times, SIGINT/SIGTERM, NaN/inf."""
import contextlib
import json
import os
import signal
import threading
from dataclasses import asdict

import torch


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
            def start():
                import wandb  # only when asked for: slow to import
                return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                                  group=getattr(cfg, "wandb_group", "") or None,
                                  config={**asdict(cfg), **(resolved or {})}, dir=out_dir)
            self.wandb = self._wandb(start)

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


def truncate_metrics(path, step):
    """On resume, drop the rows logged after the checkpoint's step so that none repeats."""
    keep = []
    for line in open(path) if os.path.exists(path) else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line half-written by a killed run
            if json.loads(line).get("step", 0) <= step:
                keep.append(line.rstrip("\n") + "\n")
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def fmt_time(seconds):
    """Seconds -> '42s', '3m05s' or '1h02m' for progress lines."""
    s = int(round(max(0.0, seconds)))
    h, m = divmod(s // 60, 60)
    return f"{s}s" if s < 60 else f"{m}m{s % 60:02d}s" if s < 3600 else f"{h}h{m:02d}m"


class StopFlag:
    """SIGINT / SIGTERM set `.signal`: the loop finishes its step, saves and exits 0; a second one
    stops at once. restore() puts the old handlers back. Outside the main thread: does nothing."""

    def __init__(self):
        self.signal, self.old = None, {}
        if threading.current_thread() is threading.main_thread():  # Python's signals go there
            self.old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        print(f"\n{self.signal}: saving and exiting after this step (again: stop now)", flush=True)

    def restore(self):
        for s, h in self.old.items():
            signal.signal(s, h)


def nonfinite(loss, model):
    """Name of the first non-finite tensor (the loss, then gradients in parameter order), or ''."""
    if not torch.isfinite(loss):
        return f"loss ({loss.item()})"
    grads = ((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
    return next((f"gradient of {n}" for n, g in grads if not torch.isfinite(g).all()), "")
