"""Checkpoints: one plain dict (weights, optimizer, config, step, tokenizer), written atomically,
loaded with weights_only=True; every failure is one CheckpointError line.
"""
import os
from dataclasses import asdict

import torch

import tokenizer as tokenizers
from model import GPT, GPTConfig


class CheckpointError(RuntimeError):
    pass


def unwrap(model):
    """The plain GPT inside a DDP and/or torch.compile wrapper."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def save_checkpoint(path, model, optimizer=None, config=None, step=0, tokenizer=None, **extra):
    """One plain dict (tensors, numbers, strings, lists, dicts): loadable with weights_only=True.
    Written to a temp file, fsynced, then renamed: a crash mid-write never leaves a broken ckpt."""
    raw = unwrap(model)
    ckpt = {"model": raw.state_dict(), "model_args": asdict(raw.config),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "config": dict(config or {}), "step": step,
            "tokenizer": tokenizer.to_dict() if tokenizer is not None else None, **extra}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path, hint="train one with: python sft.py configs/mul.py"):
    """Load a checkpoint dict with weights_only=True; every failure is one clear CheckpointError."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint ({hint})")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointError(f"{path}: not a readable nanorl checkpoint (truncated, corrupt or not ours: "
                              f"{e.__class__.__name__}: {msg})") from None
    missing = [k for k in ("model", "model_args", "config", "step", "tokenizer") if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a nanorl checkpoint (missing {', '.join(missing)})")
    return ckpt


def ckpt_settings(ckpt, path, *keys):
    """The values the writing script stored under these keys of a checkpoint's config (task,
    reverse, verifier, lik_coef): never a reader's own fallback, which could silently change the task."""
    missing = [k for k in keys if k not in ckpt["config"]]
    if missing:
        raise CheckpointError(f"{path}: its config lacks {', '.join(map(repr, missing))} "
                              f"(written by an older nanorl?); retrain it with the current scripts")
    return tuple(ckpt["config"][k] for k in keys)


def model_from_checkpoint(ckpt, path="checkpoint", scalar_head=None):
    """Build (model, tokenizer) from a loaded checkpoint dict; scalar_head=True adds a fresh head
    when the checkpoint has none (reward model / value head initialised from the SFT policy)."""
    try:
        cfg = GPTConfig(**ckpt["model_args"])
        tok = tokenizers.from_dict(ckpt["tokenizer"])
    except (TypeError, tokenizers.TokenizerError) as e:
        raise CheckpointError(f"{path}: incompatible checkpoint ({e})") from None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model {cfg.vocab_size}")
    has_head = cfg.scalar_head
    if scalar_head is not None:
        cfg.scalar_head = scalar_head
    model = GPT(cfg)
    state = ckpt["model"]
    if scalar_head and not has_head:  # keep the fresh head
        state = {**state, **{f"score_head.{k}": v for k, v in model.score_head.state_dict().items()}}
    if scalar_head is False and has_head:
        state = {k: v for k, v in state.items() if not k.startswith("score_head.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"{path}: weights do not fit the model it describes ({first})") from None
    return model, tok
