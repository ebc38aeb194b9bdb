"""Typed config for every script: a @dataclass per script, a config file of plain Python
assignments, then --key=value overrides; unknown keys or bad values fail naming the key.

    cfg = load_config(Config, ["configs/mul.py", "--lr=3e-4", "--wandb=true"])
"""
import difflib
import os
import sys
import typing
from dataclasses import asdict, fields

import torch


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


def run_cli(main, Config):
    """Entry point of every script: parse the config, run main, turn user errors into one line. Under
    torchrun, a collective that fails because another rank died or timed out is one line too (exit 1)."""
    from data.tasks import DataError
    from checkpoint import CheckpointError
    from tokenizer import TokenizerError
    try:
        return main(load_config(Config, sys.argv[1:]))
    except (UserError, DataError, CheckpointError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (RuntimeError, torch.distributed.DistError) as e:
        if not torch.distributed.is_initialized():
            raise
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else e.__class__.__name__
        print(f"error: rank {torch.distributed.get_rank()}: another rank died or did not answer in time, stopping "
              f"({first})", file=sys.stderr)
        os._exit(1)  # skip the process group's teardown, which would wait on the dead rank


def _convert(name, value, tp):
    """Convert a command-line string (or check a config-file value) to the field type."""
    origin_args = typing.get_args(tp)
    optional = type(None) in origin_args
    base = next((a for a in origin_args if a is not type(None)), tp) if optional else tp
    if isinstance(value, str) and optional and value.lower() == "none":
        return None
    if value is None:
        if optional:
            return None
        raise UserError(f"config key {name!r} must be a {base.__name__}, got None")
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise UserError(f"config key {name!r} must be true or false, got {value!r}")
    try:
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if isinstance(value, bool) and base is not bool:
            raise ValueError
        return base(float(value)) if base is int and isinstance(value, str) and "e" in value.lower() else base(value)
    except (TypeError, ValueError):
        raise UserError(f"config key {name!r} must be a {base.__name__}, got {value!r}") from None


def _unknown(key, valid):
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return UserError(f"unknown config key {key!r}{hint}")


def load_config(Config, argv):
    """Config file(s) first (positional args), then --key=value overrides; returns a Config."""
    hints = typing.get_type_hints(Config)
    valid = [f.name for f in fields(Config)]
    values = {}
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise UserError(f"expected --key=value, got {arg!r}")
            key, val = arg[2:].split("=", 1)
            if key not in valid:
                raise _unknown(key, valid)
            values[key] = _convert(key, val, hints[key])
        else:
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} not found")
            ns = {}
            try:
                exec(compile(open(arg).read(), arg, "exec"), ns)
            except Exception as e:
                raise UserError(f"config file {arg}: {e.__class__.__name__}: {e}") from None
            for key, val in ns.items():
                if key.startswith("_") or isinstance(val, type(sys)):
                    continue
                if key not in valid:
                    raise UserError(f"{arg}: " + str(_unknown(key, valid)))
                values[key] = _convert(key, val, hints[key])
    return Config(**values)


def print_config(cfg):
    print("config: " + " ".join(f"{k}={v}" for k, v in asdict(cfg).items()), flush=True)
