"""On-policy distillation, opened by the rows that need a teacher (opd, gkd): the student
samples, a frozen teacher scores every sampled position, and no reward is needed.

    python rl.py --loss=gkd --teacher_ckpt=out/sft-teacher/ckpt.pt  # or opd

opd's advantage A_t = log pi_T(y_t) - log pi_old(y_t) is minus the sampled token's reverse-KL
term; gkd compares the whole next-token distributions (losses.gkd).
"""
from dataclasses import dataclass

import torch

from model import logprobs
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint
from nanorl.config import UserError


@dataclass
class Flags:  # rl.py's flag of distillation
    teacher_ckpt: str = ""  # the checkpoint to distil (a nanorl one, the same tokenizer)


def check(cfg, algo):
    if not cfg.teacher_ckpt:  # other rows ignore it, as they do rm_ckpt
        raise UserError(f"{cfg.loss} distils a teacher: set --teacher_ckpt (a nanorl checkpoint "
                        "with the policy's tokenizer)")


def load(path, tok, dev):
    """A frozen nanorl checkpoint to distil, which must share the policy's tokenizer."""
    teacher, ttok = model_from_checkpoint(load_checkpoint(path, hint="train one with sft.py"), path)
    if ttok.to_dict() != tok.to_dict():
        raise UserError(f"{path}: the teacher's tokenizer differs from the policy's; distillation "
                        "compares their next-token distributions token by token")
    return teacher.to(dev).eval().requires_grad_(False)


@torch.no_grad()
def teacher(model, batch, cfg, algo):
    """The teacher's tempered log-probs of the sampled tokens (N, L) and, when the row needs
    them, its tempered logits (N, L, V); (None, None) without a teacher."""
    if model is None:
        return None, None
    lp, _, logits = logprobs(model, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                             logits="teacher_logits" in algo.needs, max_rows=cfg.micro_batch_size)
    return lp, logits


def advantages(batch, teacher_lp, bound=10.0):
    """(N, L) A_t = -clamp(log pi_old_t - log pi_T_t, +-bound), 0 off the mask. From pi_old,
    not mu: under staleness an advantage from mu would add grad KL(pi || mu), a push away from
    the sampler; pi_old is what the trainer recomputes (offpolicy.py), mu itself otherwise."""
    return torch.where(batch.mask.bool(), -(batch.old_logp - teacher_lp).clamp(-bound, bound), 0.0)
