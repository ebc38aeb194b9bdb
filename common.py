"""
Plumbing shared by the scripts: typed config loading, one-line errors, metrics logging, evaluation.

Config: each script has one @dataclass; `load_config(Config, argv)` applies a config file (plain
Python assignments) and then `--key=value` overrides. Unknown keys, in the file or on the command
line, fail naming the key and the closest valid one; values are converted by the field's type.

    cfg = load_config(Config, ["configs/mul.py", "--lr=3e-4", "--wandb=true"])
"""
import datetime
import difflib
import json
import math
import os
import signal
import sys
import threading
import time
import typing
from dataclasses import asdict, fields

import torch

from data.tasks import format_answer, format_prompt, parse_answer
from model import generate
from verify import exact_answer


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


def run_cli(main, Config):
    """Entry point of every script: parse the config, run main, turn user errors into one line. Under
    torchrun, a collective that fails because another rank died or timed out is one line too (exit 1)."""
    from data.tasks import DataError
    from model import CheckpointError
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


# ----------------------------------------------------------------------------- distributed (torchrun)

def resolve_device(name):
    """--device: "auto" = cuda > mps > cpu, else a torch device string; under torchrun "cuda" means
    this process's GPU, cuda:LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}") from None
    if (dev.type == "cuda" and not torch.cuda.is_available()) or (dev.type == "mps" and not torch.backends.mps.is_available()):
        raise UserError(f"device {name!r} is not available on this machine (try --device=auto)")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def init_distributed(device, timeout_s=120):
    """(rank, world_size) from torchrun's RANK / WORLD_SIZE, nanoGPT style; (0, 1) for a plain
    `python script.py`. gloo on CPU, nccl on CUDA. A collective waits at most timeout_s for the other
    ranks (rank 0 evaluates alone while the others wait, so this bounds eval time too)."""
    if "RANK" not in os.environ:
        return 0, 1
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def bf16_default(device):
    """bf16 autocast where the hardware has native bf16 matmuls: CUDA (Ampere+), CPUs with AVX512-BF16 / AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense bf16 tensor-core peaks (datasheets)


def peak_flops(device):
    """(FLOP/s, source) for MFU: a known GPU's bf16 datasheet peak; anywhere else the best of a few
    1024x1024 fp32 matmuls measured now on this device (a real ceiling, not a guessed figure)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for k, v in PEAK_BF16_FLOPS.items():
            if k in name:
                return v, f"{k} bf16 datasheet"
    a, best = torch.randn(1024, 1024, device=device), 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        (a @ a).sum().item()  # .item() waits for the device
        best = max(best, 2 * 1024 ** 3 / (time.perf_counter() - t0))
    return best, f"measured {device.type} fp32 matmul"


def world_size():
    """Number of DDP ranks (1 for a plain `python script.py`)."""
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def all_reduce(x, op="sum"):
    """Sum or max of a number / tensor over ranks (itself on one process); returns a tensor."""
    x = torch.as_tensor(x, dtype=torch.float64).clone()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(x, {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}[op])
    return x


def sync_grads(model):
    """Sum every parameter's gradient over ranks (nothing on one process). The losses divide by the
    global token/sequence counts, so the sum is the whole batch's gradient, whatever number of
    micro-batches (backward calls) each rank ran: unlike DDP's all-reduce inside every backward,
    ranks with uneven work cannot deadlock. A parameter no rank gave a gradient keeps None."""
    if not torch.distributed.is_initialized():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    has = all_reduce([float(p.grad is not None) for p in params], "max")
    live = [p for p, h in zip(params, has.tolist()) if h]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in live])
    torch.distributed.all_reduce(flat)
    for p, g in zip(live, flat.split([p.numel() for p in live])):
        p.grad = g.view_as(p)


def mean_over_ranks(stats):
    """The numeric values of a metrics dict averaged over ranks (same keys on every rank)."""
    keys = sorted(k for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    if not torch.distributed.is_initialized() or not keys:
        return stats
    v = all_reduce([float(stats[k]) for k in keys]) / world_size()
    return {**stats, **dict(zip(keys, v.tolist()))}


def gather_objects(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank ([obj] on one process)."""
    if not torch.distributed.is_initialized():
        return [obj]
    out = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


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


def fmt_time(seconds):
    """Seconds -> '42s', '3m05s' or '1h02m' for progress lines."""
    s = int(round(max(0.0, seconds)))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def verifier_of(name):
    """The reward function verify.VERIFIERS[name], or a UserError naming the valid ones."""
    from verify import VERIFIERS
    if name not in VERIFIERS:
        raise UserError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]


# ----------------------------------------------------------------------------- logging

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


# ----------------------------------------------------------------------------- faults

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


# ----------------------------------------------------------------------------- evaluation

def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k)/C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def encode_prompts(tok, prompts, reverse):
    """Normal-order prompt strings -> the token ids the model reads."""
    return [tok.encode(format_prompt(p, reverse)) for p in prompts]


def gold_rows(tok, problems, reverse):
    """[(prompt, answer)] in normal order -> [(prompt ids, answer ids + EOS)]: what the model reads and
    what it should write."""
    prompts = encode_prompts(tok, [p for p, _ in problems], reverse)
    return [(p, tok.encode(format_answer(a, reverse)) + [tok.eos_id]) for p, (_, a) in zip(prompts, problems)]


def responses(out):
    """The sampled token ids of each row of a `generate` result, EOS included, padding cut."""
    P = out["prompt_len"]
    return [ids[:n] for ids, n in zip(out["ids"][:, P:].tolist(), out["response_mask"][:, P:].sum(1).tolist())]


def record_rows(tok, recs, reverse):
    """Offline JSONL records -> (rows, labels): DPO pairs give chosen rows then rejected rows (labels
    None); KTO records give one row each and their desirable labels (N,)."""
    if "label" in recs[0]:
        labels = torch.tensor([r["label"] for r in recs])  # (N,)
        return gold_rows(tok, [(r["prompt"], r["completion"]) for r in recs], reverse), labels
    pairs = [(r["prompt"], r["chosen"]) for r in recs] + [(r["prompt"], r["rejected"]) for r in recs]
    return gold_rows(tok, pairs, reverse), None


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
             batch_size=64, generator=None, prefix="eval", n_show=3, verifier=exact_answer):
    """Greedy accuracy on `problems` [(prompt, answer)] under `verifier` (the task's, default exact
    match), and with n_samples > 0 the sampled pass@1 and pass@k (unbiased estimator, n_samples per
    problem at `temperature`; with fewer than k samples the key says pass@n_samples). At most batch_size
    rows go through the sampler at once (memory: the KV cache grows with them). Returns (metrics,
    examples) where examples are a few (prompt, completion, reward)."""
    correct, passes1, passesk, examples = 0, 0.0, 0.0, []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompts = encode_prompts(tok, [p for p, _ in chunk], reverse)
        out = generate(model, prompts, max_new_tokens, tok.eos_id, tok.pad_id, temperature=0)
        for j, (rew, text) in enumerate(score_samples(tok, out, [a for _, a in chunk], reverse, verifier)):
            correct += rew
            if len(examples) < n_show:
                examples.append({"prompt": chunk[j][0], "completion": text, "reward": rew})
        step = max(1, batch_size // max(1, n_samples))  # prompts per sampled batch: at most batch_size rows
        for j in range(0, len(chunk) if n_samples > 0 else 0, step):
            out = generate(model, prompts[j:j + step], max_new_tokens, tok.eos_id, tok.pad_id, G=n_samples,
                           temperature=temperature, generator=generator)
            gold = [a for _, a in chunk[j:j + step] for _ in range(n_samples)]
            rew = torch.tensor([r for r, _ in score_samples(tok, out, gold, reverse, verifier)]).view(-1, n_samples)
            for c in rew.sum(1).tolist():
                passes1 += pass_at_k(n_samples, int(c), 1)
                passesk += pass_at_k(n_samples, int(c), min(k, n_samples))
    n = len(problems)
    metrics = {f"{prefix}/accuracy": correct / n, f"{prefix}/n": n}
    if n_samples > 0:
        metrics.update({f"{prefix}/pass@1": passes1 / n, f"{prefix}/{pass_k_name(n_samples, k)}": passesk / n})
    return metrics, examples


def pass_k_name(n_samples, k=8):
    """evaluate's pass@k metric name: pass@k, or pass@n_samples when fewer samples are drawn."""
    return f"pass@{min(k, n_samples)}"


def score_samples(tok, out, gold, reverse, verifier=exact_answer):
    """[(reward, completion in normal order)] for each row of a `generate` result. A response that
    never emitted EOS (truncated) scores 0 whatever its text."""
    return [(grade(tok, ids, g, reverse, verifier), parse_answer(tok.decode(ids), reverse))
            for ids, g in zip(responses(out), gold)]


def grade(tok, ids, gold, reverse, verifier=exact_answer):
    """Reward of one response (its sampled token ids): the verifier's score of its text if it ended
    with EOS, 0 for a truncated response whatever its text, and 0 when a special token (PAD, a
    second EOS) comes before the end: decode drops those, so "10<pad>81" would read as "1081"."""
    if not ids or ids[-1] != tok.eos_id or any(i in tok.special_ids for i in ids[:-1]):
        return 0.0
    return verifier(tok.decode(ids[:-1]), gold, reverse=reverse)

