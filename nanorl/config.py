"""Typed config: a script's @dataclass, then config files (plain Python assignments), then
--key=value overrides, e.g. load_config(Config, ["configs/mul.py", "--lr=3e-4", "--wandb=true"])."""
import ast
import dataclasses
import difflib
import inspect
import json
import os
import re
import runpy
import sys
import typing
from dataclasses import asdict

import torch

from nanorl.checkpoint import CheckpointError, one_line
from data.tasks import DataError
from tokenizer import TokenizerError

BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


def run_cli(main, Config):
    """Run main(config from sys.argv) (--help: every flag); bad input, or a dead rank under
    torchrun, is one line."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        return print(usage(Config))
    try:
        return main(load_config(Config, sys.argv[1:]))
    except (UserError, DataError, CheckpointError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (RuntimeError, torch.distributed.DistError) as e:
        if not torch.distributed.is_initialized():
            raise
        print(f"error: rank {torch.distributed.get_rank()}: another rank died or did not answer in "
              f"time, stopping ({one_line(e, 300)})", file=sys.stderr)
        os._exit(1)  # skip the process group's teardown, which would wait on the dead rank


def _convert(name, value, tp):
    """A command-line string or a config-file value as the field's type; Optional[X] takes none."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base, text = (args[0] if args else tp), str(value).lower()
    if (args and text == "none") or (base is bool and text in BOOLS):
        return BOOLS.get(text)  # None for "none"
    try:
        if base is dict:  # a config file's dict, or --key='{"a": 1}' (JSON or a Python literal)
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except ValueError:  # a Python literal: {'broken': True}
                value = ast.literal_eval(value)
            if isinstance(value, dict):
                return value
            raise ValueError
        if type(value) in (bool, type(None)) or base is bool or (base is int and float(value) % 1):
            raise ValueError  # never None -> "None", True -> 1, 2.5 -> 2 or "maybe" -> a bool
        return int(float(value)) if base is int else base(value)  # int: "1e3" too
    except (TypeError, ValueError, SyntaxError):
        kind = "true or false" if base is bool else f"a {base.__name__}"
        raise UserError(f"config key {name!r} must be {kind}, got {value!r}") from None


def load_config(Config, argv):
    """Config files (positional args), then --key=value overrides; unknown keys name the closest."""
    hints = typing.get_type_hints(Config)  # {field name: type}
    values = {}

    def put(key, value, where=""):
        if key not in hints:
            close = difflib.get_close_matches(key, hints, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(sorted(hints))}"
            raise UserError(f"{where}unknown config key {key!r} ({hint})")
        values[key] = _convert(key, value, hints[key])

    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise UserError(f"expected --key=value, got {arg!r}")
            put(*arg[2:].split("=", 1))
            continue
        if not os.path.isfile(arg):
            raise UserError(f"config file {arg!r} not found")
        try:
            ns = runpy.run_path(arg)
        except Exception as e:
            raise UserError(f"config file {arg}: {one_line(e)}") from None
        for key, value in ns.items():
            if not key.startswith("_") and not isinstance(value, type(sys)):  # imports are no keys
                put(key, value, f"{arg}: ")
    return Config(**values)


def usage(Config):
    """Every flag of Config, its default and its comment, under the class that declares it."""
    out = ["config files, then --key=value; the flags, by the file that declares them:"]
    for cls in reversed(Config.__mro__):
        declared = vars(cls).get("__annotations__", {})
        own = [f for f in dataclasses.fields(cls) if f.name in declared] \
            if dataclasses.is_dataclass(cls) else []
        if own:
            comments = vars(cls).get("help") or source_comments(cls)
            out.append(f"{os.path.relpath(inspect.getfile(cls))} {cls.__name__}:")
            defaults = [f.default_factory() if callable(f.default_factory) else f.default
                        for f in own]
            out += [f"  --{f.name}={d}" + (f"  # {c}" if (c := comments.get(f.name)) else "")
                    for f, d in zip(own, defaults)]
    return "\n".join(out)


def source_comments(cls):
    """{field: its end-of-line comment, and the comment lines under it} of a class's source."""
    out, name = {}, None
    for line in inspect.getsource(cls).splitlines()[1:]:
        field, more = re.match(r"\s*(\w+)\s*:[^#]*(?:#\s*(.*))?$", line), \
            re.match(r"\s*#\s*(.*)$", line)
        if field:
            name, out[field[1]] = field[1], field[2] or ""
        elif more and name:
            out[name] += " " + more[1]
        else:
            name = None
    return out


def print_config(cfg):  # the keys not at their default (checkpoints and wandb hold them all)
    default = asdict(type(cfg)())
    print("config:", *(f"{k}={v}" for k, v in asdict(cfg).items() if v != default[k]), flush=True)


def check_bounds(cfg, *rules):
    """rules: "key key ... > 0" (or >=). The first key whose value (None passes) breaks its rule
    stops the run with one line: "{key} must be > 0, got {value}"."""
    for rule in rules:
        *keys, op, bound = rule.split()
        for k in keys:
            v = getattr(cfg, k)
            if v is not None and not (v > float(bound) if op == ">" else v >= float(bound)):
                raise UserError(f"{k} must be {op} {bound}, got {v}")
