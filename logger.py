"""What a run reports and how it stops: metrics.jsonl (+ wandb), progress times, SIGINT/SIGTERM,
non-finite values.
"""
import json
import os
import signal
import threading
from dataclasses import asdict

import torch


class Logger:
    """Appends one JSON object per event to out_dir/metrics.jsonl, mirrors it to wandb if enabled
    (project, run name and group from cfg; the run config is cfg plus `resolved`, the values the
    script worked out, e.g. rl.py's out_dir and loss hyperparameters). Works with WANDB_MODE=offline.
    A fresh (not resumed) run moves an old metrics.jsonl to metrics.jsonl.prev rather than mixing
    two runs' rows; a DDP rank other than 0 (enabled=False) writes nothing. A wandb failure is
    reported once and never stops training."""


    def __init__(self, out_dir, cfg, resolved=None, enabled=True):
        self.path, self.wandb, self.enabled = os.path.join(out_dir, "metrics.jsonl"), None, enabled
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        if not getattr(cfg, "resume", False) and os.path.exists(self.path):  # a fresh run: keep the last one's rows
            os.replace(self.path, self.path + ".prev")
        if cfg.wandb:
            try:
                import wandb
                self.wandb = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                                        group=getattr(cfg, "wandb_group", "") or None,
                                        config={**asdict(cfg), **(resolved or {})}, dir=out_dir)
            except Exception as e:
                print(f"warning: wandb disabled ({e.__class__.__name__}: {e})", flush=True)


    def log(self, metrics):
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.wandb is not None:
            try:
                self.wandb.log(metrics, step=metrics["step"])
            except Exception as e:
                print(f"warning: wandb log failed, disabling ({e.__class__.__name__}: {e})", flush=True)
                self.wandb = None


    def finish(self):
        if self.wandb is not None:
            try:
                self.wandb.finish()
            except Exception:
                pass


def truncate_metrics(path, step):
    """On resume, drop rows logged after the checkpoint's step (and a broken last line, e.g. from a
    killed run) so that the resumed run appends without repeating a row."""
    if not os.path.exists(path):
        return
    keep = []
    for line in open(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", 0) <= step:
            keep.append(line if line.endswith("\n") else line + "\n")
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)


def fmt_time(seconds):
    """Seconds -> '42s', '3m05s' or '1h02m' for progress lines."""
    s = int(round(max(0.0, seconds)))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


class StopFlag:
    """SIGINT / SIGTERM set `.signal`; the training loop finishes its step, saves a checkpoint and
    returns (exit 0). A second signal stops at once (KeyboardInterrupt). `restore()` puts the old
    handlers back. Outside the main thread (where Python cannot take signals) it does nothing."""


    def __init__(self):
        self.signal, self.old = None, {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}


    def _handle(self, signum, frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        print(f"\n{self.signal}: finishing this step, then saving a checkpoint and exiting "
              "(send it again to stop at once)", flush=True)


    def restore(self):
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}


def nonfinite(loss, model):
    """Name of the first non-finite tensor (the loss, then gradients in parameter order), or ''."""
    if not torch.isfinite(loss):
        return f"loss ({loss.item()})"
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return f"gradient of {name}"
    return ""
