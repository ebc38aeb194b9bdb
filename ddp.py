"""Device choice and the few collectives a torchrun (DDP) run needs; each is a no-op on one process.
"""
import datetime
import os

import torch

from config import UserError


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
