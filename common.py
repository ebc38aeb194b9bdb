"""
Plumbing shared by the scripts: typed config loading, one-line errors, metrics logging, evaluation.

Config: each script has one @dataclass; `load_config(Config, argv)` applies a config file (plain
Python assignments) and then `--key=value` overrides. Unknown keys, in the file or on the command
line, fail naming the key and the closest valid one; values are converted by the field's type.

    cfg = load_config(Config, ["configs/mul.py", "--lr=3e-4", "--wandb=true"])
"""
import difflib
import json
import math
import os
import sys
import typing
from dataclasses import asdict, fields

import torch

from data.tasks import format_answer, format_prompt, parse_answer
from model import generate
from verify import exact_answer


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


def run_cli(main, Config):
    """Entry point of every script: parse the config, run main, turn user errors into one line."""
    from data.tasks import DataError
    from model import CheckpointError
    from tokenizer import TokenizerError
    try:
        return main(load_config(Config, sys.argv[1:]))
    except (UserError, DataError, CheckpointError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------------------- config

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


# ----------------------------------------------------------------------------- logging

class Logger:
    """Appends one JSON object per event to out_dir/metrics.jsonl, mirrors it to wandb if enabled.
    A wandb failure is reported once and never stops training."""

    def __init__(self, out_dir, cfg):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.wandb = None
        if cfg.wandb:
            try:
                import wandb
                self.wandb = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                                        config=asdict(cfg), dir=out_dir)
            except Exception as e:
                print(f"warning: wandb disabled ({e.__class__.__name__}: {e})", flush=True)

    def log(self, metrics):
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


# ----------------------------------------------------------------------------- evaluation

def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k)/C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(format_prompt(p, reverse)) for p in prompts]


def record_rows(tok, recs, reverse):
    """Offline JSONL records -> (rows, labels): DPO pairs give chosen rows then rejected rows (labels
    None); KTO records give one row each and their desirable labels (N,)."""
    def row(prompt, answer):
        return encode_prompts(tok, [prompt], reverse)[0], tok.encode(format_answer(answer, reverse)) + [tok.eos_id]
    if "label" in recs[0]:
        return [row(r["prompt"], r["completion"]) for r in recs], torch.tensor([r["label"] for r in recs])
    return [row(r["prompt"], r["chosen"]) for r in recs] + [row(r["prompt"], r["rejected"]) for r in recs], None


def pack(rows, pad_id):
    """[(prompt ids, response ids)] -> ids (N, T) right-padded, each row from position 0 as in SFT,
    and the response mask (N, T), 1 on the response tokens."""
    T = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p):len(p) + len(r)] = 1
    return ids, mask


@torch.no_grad()
def evaluate(model, tok, problems, reverse, max_new_tokens, n_samples=0, temperature=1.0, k=8,
             batch_size=64, generator=None, prefix="eval", n_show=3):
    """Greedy exact-match accuracy on `problems` [(prompt, answer)], and with n_samples > 0 the
    sampled pass@1 and pass@k (unbiased estimator, n_samples per problem at `temperature`).
    At most batch_size rows go through the sampler at once (memory: the KV cache grows with them).
    Returns (metrics, examples) where examples are a few (prompt, completion, reward)."""
    correct, passes1, passesk, examples = 0, 0.0, 0.0, []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = encode_prompts(tok, [p for p, _ in chunk], reverse)
        out = generate(model, prompts, max_new_tokens, tok.eos_id, tok.pad_id, temperature=0)
        for j, (rew, text) in enumerate(score_samples(tok, out, [a for _, a in chunk], reverse)):
            correct += rew
            if len(examples) < n_show:
                examples.append({"prompt": chunk[j][0], "completion": text, "reward": rew})
        step = max(1, batch_size // max(1, n_samples))  # prompts per sampled batch: at most batch_size rows
        for j in range(0, len(chunk) if n_samples > 0 else 0, step):
            out = generate(model, prompts[j:j + step], max_new_tokens, tok.eos_id, tok.pad_id, G=n_samples,
                           temperature=temperature, generator=generator)
            gold = [a for _, a in chunk[j:j + step] for _ in range(n_samples)]
            rew = torch.tensor([r for r, _ in score_samples(tok, out, gold, reverse)]).view(-1, n_samples)
            for c in rew.sum(1).tolist():
                passes1 += pass_at_k(n_samples, int(c), 1)
                passesk += pass_at_k(n_samples, int(c), min(k, n_samples))
    n = len(problems)
    metrics = {f"{prefix}/accuracy": correct / n, f"{prefix}/n": n}
    if n_samples > 0:
        metrics.update({f"{prefix}/pass@1": passes1 / n, f"{prefix}/pass@{k}": passesk / n})
    return metrics, examples


def score_samples(tok, out, gold, reverse):
    """[(reward, completion in normal order)] for each row of a `generate` result. A response that
    never emitted EOS (truncated) scores 0 whatever its text."""
    P = out["prompt_len"]
    res = []
    for ids, m, g in zip(out["ids"][:, P:].tolist(), out["response_mask"][:, P:].tolist(), gold):
        ids = ids[:sum(m)]
        res.append((grade(tok, ids, g, reverse), parse_answer(tok.decode(ids), reverse)))
    return res


def grade(tok, ids, gold, reverse, verifier=exact_answer):
    """Reward of one response (its sampled token ids): the verifier's score if it emitted EOS,
    0 for a truncated response whatever its text."""
    finished = len(ids) > 0 and ids[-1] == tok.eos_id
    return verifier(tok.decode(ids), gold, reverse=reverse) if finished else 0.0

