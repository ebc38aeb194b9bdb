"""
The reward model at work: `rm_scores` (a reward_model.py checkpoint's score of answers) and
`RewardModel`, the frozen scorer behind `python rl.py --loss=ppo --reward=rm`.
"""
import math
from dataclasses import dataclass

import torch

from nanorl.checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from nanorl.config import UserError
from losses import last_token
from model import token_logps


@dataclass
class Flags:  # rl.py's flags of the reward
    reward: str = "verifier"  # the task's verifier (0/1), or "rm": rm_ckpt's score
    rm_ckpt: str = "out/rm-mul/ckpt.pt"
    rm_normalize: bool = True  # RM scores -> (s - running mean) / running std


def rm_scores(model, ids, response_mask, offsets, lik_coef):
    """Score of each row of ids (N, T) whose answer tokens response_mask (N, T) marks:
        s(x, y) = head(h at y's last token, the EOS of a finished answer) + lik_coef * log p(y | x)
    under the model's own LM head. Returns the scores (N,) and the answer's log-probs (N, T-1)."""
    logits, s = model(ids, offsets, return_scalar=True)  # (N, T, V), (N, T)
    logp = token_logps(logits[:, :-1], ids[:, 1:], response_mask[:, 1:])  # (N, T-1)
    last = last_token(response_mask)  # (N,) the answer's last token: a finished one's EOS
    return s[torch.arange(len(ids), device=ids.device), last] + lik_coef * logp.sum(1), logp


def check(cfg, algo):
    if cfg.reward not in ("verifier", "rm"):
        raise UserError(f"reward must be verifier or rm, got {cfg.reward}")
    if cfg.reward == "rm" and (algo.family != "pg" or algo.binary):
        raise UserError(f"--reward=rm gives real-valued rewards; {cfg.loss} needs the verifier")
    if cfg.reward == "rm" and "teacher" in algo.needs:
        raise UserError(f"{cfg.loss} learns from its teacher, never from a reward: drop "
                        "--reward=rm")


class RewardModel:
    """A frozen reward model scoring rollouts (rm_scores, with the lik_coef it was trained
    with), and the running mean and std of every score so far (parallel-variance update) that
    normalise them."""

    def __init__(self, model, lik_coef):
        self.model, self.lik_coef = model.eval().requires_grad_(False), lik_coef
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    @classmethod
    def load(cls, path, tok, dev):
        ckpt = load_checkpoint(path, hint="make one with: python reward_model.py configs/mul_rm.py")
        if not ckpt["model_args"].get("scalar_head"):
            raise UserError(f"{path}: not a reward model (no scalar head); make one with "
                            "reward_model.py")
        model, rm_tok = model_from_checkpoint(ckpt, path)
        if rm_tok.to_dict() != tok.to_dict():
            raise UserError(f"{path}: the reward model's tokenizer differs from the policy's")
        return cls(model.to(dev), *ckpt_settings(ckpt, path, "lik_coef"))

    @torch.no_grad()
    def __call__(self, batch, max_rows=128):
        """(N,) raw score of each response of a rollout, max_rows at a time (memory)."""
        P, n = batch.ids.size(1) - batch.mask.size(1), max_rows
        full = torch.cat([torch.zeros_like(batch.ids[:, :P]), batch.mask], 1)  # (N, P+L)
        return torch.cat([rm_scores(self.model, batch.ids[i:i + n], full[i:i + n],
                                    batch.offsets[i:i + n], self.lik_coef)[0]
                          for i in range(0, batch.ids.size(0), n)])

    def score(self, batch, normalize, update):
        """Put this model's score on a rollout: batch.rm_reward the raw score (N,), batch.reward the
        score (normalised by the running statistics, which update=True moves first) plus the
        shaping the verifier's reward carried."""
        raw = self(batch)  # (N,)
        if normalize and update:
            self.update(raw)
        score = self.normalize(raw) if normalize else raw
        batch.rm_reward, batch.reward = raw, score + batch.reward - batch.score

    def update(self, x):
        n, mean = x.numel(), x.mean().item()
        delta, total = mean - self.mean, self.n + n
        self.m2 += ((x - mean) ** 2).sum().item() + delta ** 2 * self.n * n / total
        self.mean, self.n = self.mean + delta * n / total, total

    def normalize(self, x):
        return (x - self.mean) / (math.sqrt(self.m2 / max(1, self.n - 1)) + 1e-8)

    def state_dict(self):
        return {"n": self.n, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, s):
        self.n, self.mean, self.m2 = s["n"], s["mean"], s["m2"]
