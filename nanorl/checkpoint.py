"""Checkpoints: one plain dict (weights, optimizer, config, step, tokenizer), written atomically,
loaded with weights_only=True; every failure is one CheckpointError line."""
import os
from dataclasses import asdict, replace

import torch

import tokenizer as tokenizers
from data.tasks import atomic_write
from model import GPT, CheckpointError, GPTConfig, one_line  # the errors: from_pretrained's too
from nanorl import bpe


def save_checkpoint(path, model, optimizer=None, config=None, step=0, tokenizer=None, **extra):
    """Plain data only (weights_only-loadable): the plain GPT's (never torch.compile's) and extra
    entries (run state, ...), by atomic_write: a crash mid-write leaves the previous one whole."""
    ckpt = {"model": model.state_dict(), "model_args": asdict(model.config), "step": step,
            "optimizer": optimizer and optimizer.state_dict(), "config": dict(config or {}),
            "tokenizer": tokenizer and tokenizer.to_dict(), **extra}
    atomic_write(path, lambda f: torch.save(ckpt, f), "wb")


def load_checkpoint(path, hint="train one with: python sft.py configs/mul.py"):
    """The checkpoint dict at path; hint says how to make one when there is none."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint ({hint})")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable nanorl checkpoint (truncated, corrupt or "
                              f"not ours: {one_line(e)})") from None
    keys = ("model", "model_args", "config", "step", "tokenizer")
    missing = [k for k in keys if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: not a nanorl checkpoint (missing {', '.join(missing)})")
    return ckpt


def ckpt_settings(ckpt, path, *keys):
    """The values the writing script stored under these config keys (task, reverse, verifier, ...):
    never a reader's own default, which could silently change the task."""
    missing = [k for k in keys if k not in ckpt["config"]]
    if missing:
        raise CheckpointError(f"{path}: its config lacks {', '.join(map(repr, missing))} (written "
                              "by an older nanorl?); retrain it with the current scripts")
    return tuple(ckpt["config"][k] for k in keys)


def model_from_checkpoint(ckpt, path="checkpoint", scalar_head=None):
    """(model, tokenizer) from a loaded checkpoint; scalar_head=True adds a fresh scalar head if
    it has none (a reward model or value head started from the SFT policy)."""
    try:
        cfg = GPTConfig(**ckpt["model_args"])  # one written before gelu was saved: tanh
        model = GPT(replace(cfg, scalar_head=cfg.scalar_head or bool(scalar_head)))  # a bad gelu
        d = ckpt["tokenizer"]
        tok = bpe.from_dict(d) if d.get("kind") == "bpe" else tokenizers.from_dict(d)
    except (TypeError, KeyError, tokenizers.TokenizerError) as e:
        raise CheckpointError(f"{path}: incompatible checkpoint ({e})") from None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model "
                              f"{cfg.vocab_size}")
    state = dict(ckpt["model"])
    if scalar_head and not cfg.scalar_head:  # keep the fresh head
        state.update({f"score_head.{k}": v for k, v in model.score_head.state_dict().items()})
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit its model_args: {one_line(e)}") from None
    return model, tok
