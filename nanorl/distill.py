"""On-policy distillation, opened by the algorithms that need a teacher (opd, gkd): the student
samples, a frozen teacher scores every sampled position, and no reward is needed.

    python rl.py --loss=gkd --teacher_ckpt=out/sft-teacher/ckpt.pt  # or opd

opd's advantage A_t = log pi_T(y_t) - log pi_old(y_t) is minus the sampled token's reverse-KL
term; gkd compares the whole next-token distributions (losses.gkd).
"""
from dataclasses import dataclass

import torch

import losses
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


def load(cfg, tok, dev):
    """rl.py's --teacher_ckpt: a frozen nanorl checkpoint to distil, which must share the policy's
    tokenizer; its heads at every position as the policy's with --full_head."""
    path = cfg.teacher_ckpt
    teacher, ttok = model_from_checkpoint(load_checkpoint(path, hint="train one with sft.py"), path)
    if ttok.to_dict() != tok.to_dict():
        raise UserError(f"{path}: the teacher's tokenizer differs from the policy's; distillation "
                        "compares their next-token distributions token by token")
    teacher.full_head = cfg.full_head
    return teacher.to(dev).eval().requires_grad_(False)


@torch.no_grad()
def advantages(cfg, algo, run, batch):
    """rl.py's advantage stage, from the teacher's tempered log-probs of the sampled tokens ->
    (opd's advantages (losses.teacher_advantages), or gkd's 0; the objective's inputs: gkd's
    teacher logits)."""
    lp, _, logits = logprobs(run.teacher, batch.ids, batch.offsets, batch.mask, cfg.temperature,
                             logits="teacher_logits" in algo.needs, max_rows=cfg.micro_batch_size)
    adv = losses.teacher_advantages(batch.old_logp, lp, batch.mask) if algo.advantage \
        else torch.zeros_like(batch.mu)
    return adv, ({"teacher_logits": logits} if "teacher_logits" in algo.needs else {})
