"""Device choice and the few collectives a torchrun (DDP) run needs; no-ops on one process."""
import datetime
import os
import re

import torch
import torch.distributed as dist

from nanorl.config import UserError


def resolve_device(name):
    """--device: auto = cuda > mps > cpu; under torchrun "cuda" is this rank's cuda:LOCAL_RANK."""
    ok = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(), "cpu": True}
    name = next(d for d in ok if ok[d]) if name == "auto" else name
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    if not re.fullmatch(r"(cpu|mps|cuda)(:\d+)?", name):
        raise UserError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    if not ok[name.split(":")[0]]:
        raise UserError(f"device {name!r} is not available on this machine (try --device=auto)")
    if name.startswith("cuda"):
        torch.cuda.set_device(name)
    return torch.device(name)


def init_distributed(device, timeout_s=120):
    """(rank, world_size) under torchrun (gloo on CPU, nccl on CUDA), (0, 1) for a plain run. A
    collective waits at most timeout_s for the other ranks (rank 0 evaluating alone included)."""
    if "RANK" not in os.environ:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def bf16_default(device):
    """bf16 autocast where matmuls are natively bf16: CUDA (Ampere+), CPUs with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(x, op="sum"):
    """Sum, max or min of a number / list / tensor over ranks, as a float64 tensor."""
    if not dist.is_initialized():
        return torch.as_tensor(x, dtype=torch.float64).clone()
    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"  # nccl reduces GPU tensors only
    x = torch.as_tensor(x, dtype=torch.float64, device=dev).clone()
    dist.all_reduce(x, getattr(dist.ReduceOp, op.upper()))  # SUM, MAX, MIN
    return x.cpu()


def sync_grads(model):
    """Sum every gradient over ranks (None where no rank has one): the losses divide by global
    counts, so this is the batch's gradient, and uneven micro-batch counts cannot deadlock."""
    if not dist.is_initialized():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    has = all_reduce([float(p.grad is not None) for p in params], "max")
    live = [p for p, h in zip(params, has.tolist()) if h]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in live]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    for p, g in zip(live, flat.split([p.numel() for p in live])):
        p.grad = g.view_as(p)


def mean_over_ranks(stats):
    """The numbers of a metrics dict averaged over ranks (same keys on every rank)."""
    keys = sorted(k for k, v in stats.items() if isinstance(v, float) or type(v) is int)  # no bools
    if not dist.is_initialized() or not keys:
        return stats
    v = all_reduce([float(stats[k]) for k in keys]) / world_size()
    return {**stats, **dict(zip(keys, v.tolist()))}


def gather_objects(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank ([obj] on one process)."""
    out = [obj] * world_size()
    if dist.is_initialized():
        dist.all_gather_object(out, obj)
    return out


class Ranks:
    """The collectives rl.py's step asks of the ranks under torchrun (rl.OneProcess on one):
    reduce (all_reduce), mean (mean_over_ranks), sync (sync_grads), and their number."""

    def __init__(self):
        self.world = world_size()
        self.reduce, self.mean, self.sync = all_reduce, mean_over_ranks, sync_grads
