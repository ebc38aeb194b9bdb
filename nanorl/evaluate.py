"""Held-out evaluation (greedy accuracy, unbiased pass@k, KL to the reference), grading, and
the task a checkpoint was trained on (Task)."""
import math
from dataclasses import dataclass, field

import torch

import losses as L
from data.tasks import format_prompt, load_split, parse_answer
from model import generate, logprobs
from nanorl.checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from nanorl.config import UserError
from nanorl import tools
from nanorl.rows import encode_prompts, gold_rows, responses
from nanorl.tool_task import gold_rows as tool_rows, tool_of
from tokenizer import CharTokenizer
from verify import VERIFIERS, exact_answer


@dataclass
class Task:
    """The task a checkpoint was trained on: its tokenizer, digit order, verifier and splits."""
    tok: object
    name: str  # a name in data.tasks.TASKS, or a folder
    reverse: bool  # numbers least-significant digit first
    verifier_name: str  # a name in verify.VERIFIERS
    n_train: int  # the labels SFT saw: the first n_train of a seeded shuffle, 0 = all
    train: list = field(default_factory=list)  # [(prompt, answer)], or the rows a loss reads
    val: list = field(default_factory=list)
    test: list = field(default_factory=list)
    tool: object = None  # the environment model.generate runs (nanorl/tools.py), or None

    @classmethod
    def of(cls, ckpt, path, tok):
        """The checkpoint's task (its own settings, never a reader's defaults), splits loaded."""
        name, reverse, vname = ckpt_settings(ckpt, path, "task", "reverse", "verifier")
        verifier_of(vname)
        task = cls(tok, name, reverse, vname, ckpt["config"].get("n_train", 0),
                   tool=tool_of(name, tok, reverse))
        task.train, task.val, task.test = (load_split(name, s) for s in ("train", "val", "test"))
        return task

    @property
    def verifier(self):
        return VERIFIERS[self.verifier_name]

    def gold_rows(self, problems):
        """[(prompt ids, gold answer ids + EOS[, its action mask])]: a tool task's are traces."""
        if self.tool:
            return tool_rows(self.tok, problems, self.reverse, self.tool)
        return gold_rows(self.tok, problems, self.reverse)

    def settings(self):
        return {"task": self.name, "reverse": self.reverse, "verifier": self.verifier_name,
                "n_train": self.n_train}

    def check(self, cliff, max_new_tokens, block_size):
        """Every prompt and max_new_tokens fit the model. CLIFF's first wrong token compares
        with the gold tokens: only the exact verifier with the char tokenizer fits it."""
        longest = max(map(len, encode_prompts(self.tok, [p for p, _ in self.train], self.reverse)))
        if longest + max_new_tokens > block_size:
            raise UserError(f"max_new_tokens={max_new_tokens} does not fit block_size={block_size}")
        if cliff and (self.verifier_name != "exact" or not isinstance(self.tok, CharTokenizer)):
            raise UserError(f"cliff finds the first wrong token against the gold answer's "
                            f"tokens, which only the exact verifier with the char tokenizer "
                            f"makes unique; this checkpoint has verifier {self.verifier_name!r} "
                            f"and a {type(self.tok).__name__}")


def load_policy(path, values, dev):
    """The SFT checkpoint -> (the policy in eval mode: no dropout in any log-prob, its
    Task). values: PPO's value head on the policy's trunk, 0 at the start, not noise."""
    ckpt = load_checkpoint(path, hint="make one with: python sft.py configs/mul.py")
    model, tok = model_from_checkpoint(ckpt, path, scalar_head=values)
    if values and not ckpt["model_args"].get("scalar_head"):
        torch.nn.init.zeros_(model.score_head.weight)
    return model.to(dev).eval(), Task.of(ckpt, path, tok)


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # C(n-c, k) = 0 when k > n-c


def pass_k_name(n_samples, k=8):
    """evaluate's pass@k metric name: pass@k, or pass@n_samples when fewer samples are drawn."""
    return f"pass@{min(k, n_samples)}"


@torch.no_grad()
def evaluate(model, tok, problems, reverse, max_new_tokens, n_samples=0, temperature=1.0, k=8,
             batch_size=256, generator=None, prefix="eval", n_show=3, verifier=exact_answer,
             tool=None):
    """Greedy accuracy on problems [(prompt, answer)] under `verifier`; with n_samples > 0 also
    pass@1 and pass@k (n_samples per problem at `temperature`; pass@n_samples when fewer than k),
    batch_size rows per sampler call at most; with a tool, the greedy answers' tool use. Returns
    (metrics, a few examples)."""
    n, prompts = len(problems), encode_prompts(tok, [p for p, _ in problems], reverse)
    counts = torch.zeros(5)  # the greedy answers' tools.counts

    def sample(G, temp):  # [(reward, completion)] of G samples per problem, problem-major
        scored, step = [], max(1, batch_size // G)  # prompts per call: at most batch_size rows
        for i in range(0, n, step):
            out = generate(model, prompts[i:i + step], max_new_tokens, tok.eos_id, tok.pad_id, G=G,
                           temperature=temp, generator=generator, tool=tool)
            gold = [a for _, a in problems[i:i + step] for _ in range(G)]
            scored += score_samples(tok, out, gold, reverse, verifier, tool)
            if tool and temp == 0:
                P = out["prompt_len"]
                counts.add_(tools.counts(out["ids"][:, P:], out["action_mask"][:, P:],
                                         out["response_mask"][:, P:].sum(1), tool))
        return scored

    greedy = sample(1, 0)
    metrics = {f"{prefix}/accuracy": sum(r for r, _ in greedy) / n, f"{prefix}/n": n,
               **(tools.metrics(counts, prefix) if tool else {})}
    examples = [{"prompt": p, "completion": text, "reward": r}
                for (p, _), (r, text) in zip(problems[:n_show], greedy)]
    if n_samples > 0:
        scored = sample(n_samples, temperature)
        right = torch.tensor([r for r, _ in scored]).view(n, n_samples).sum(1).tolist()  # (n,)
        for kk in (1, k):
            metrics[f"{prefix}/{pass_k_name(n_samples, kk)}"] = \
                sum(pass_at_k(n_samples, int(c), min(kk, n_samples)) for c in right) / n
    return metrics, examples


def score_samples(tok, out, gold, reverse, verifier=exact_answer, tool=None):
    """[(reward, completion in normal order)] for each row of a `generate` result; a tool
    trace's numbers are each turned back (format_prompt)."""
    show, acts = format_prompt if tool else parse_answer, out["action_mask"][:, out["prompt_len"]:]
    return [(grade(tok, ids, g, reverse, verifier, act), show(tok.decode(ids), reverse))
            for ids, g, act in zip(responses(out), gold, acts.tolist())]


def grade(tok, ids, gold, reverse, verifier=exact_answer, act=None):
    """Reward of one response (its ids, the environment's too): the verifier's score of the text
    the policy wrote after the environment's last token (act: the ids' action mask, None: all
    the policy's) if it ended with EOS, else 0; 0 too if a special token comes earlier
    (decoding would drop it: "10<pad>81")."""
    if not ids or ids[-1] != tok.eos_id or any(i in tok.special_ids for i in ids[:-1]):
        return 0.0
    start = max((i + 1 for i, a in enumerate((act or ())[:len(ids)]) if not a), default=0)
    return verifier(tok.decode(ids[start:-1]), gold, reverse=reverse)


def verifier_of(name):
    """The reward function verify.VERIFIERS[name], or a UserError naming the valid ones."""
    if name not in VERIFIERS:
        raise UserError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]


@torch.no_grad()
def eval_kl(model, ref, task, cfg, gen, n=256):
    """KL(policy || ref) (k3, mean over the policy's tokens) on 4 fresh samples for n test
    prompts; on those samples the mean response length (the policy's tokens, EOS included)
    and the truncated share."""
    tok, problems = task.tok, task.test
    idx = torch.randperm(len(problems), generator=gen, device=gen.device)[:n].tolist()
    prompts = encode_prompts(tok, [problems[i][0] for i in idx], task.reverse)
    k, kl, n_act, finished = max(1, cfg.sample_batch_size // 4), 0.0, 0, []
    for i in range(0, len(prompts), k):  # k prompts x 4 samples at a time: memory
        out = generate(model, prompts[i:i + k], cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=4,
                       temperature=cfg.temperature, generator=gen, tool=task.tool)
        mask = out["action_mask"][:, out["prompt_len"]:]  # (n, L)
        ref_lp = logprobs(ref, out["ids"], out["offsets"], mask, cfg.temperature)[0]
        kl += L.masked_sum(L.kl_estimate(out["logps"], ref_lp, "k3"), mask).item()
        n_act += mask.sum().item()
        finished += [r[-1:] == [tok.eos_id] for r in responses(out)]
    return {"eval/kl": kl / max(1, n_act), "eval/resp_len": n_act / len(finished),
            "eval/truncated_frac": 1 - sum(finished) / len(finished)}


def evaluate_policy(model, ref, task, cfg, gen):
    """Greedy accuracy on test and val, pass@1 / pass@k on eval_samples samples, KL to the
    reference -> (metrics, a few examples)."""
    kw = dict(verifier=task.verifier, batch_size=cfg.sample_batch_size, tool=task.tool)
    m, examples = evaluate(model, task.tok, task.test, task.reverse, cfg.max_new_tokens,
                           n_samples=cfg.eval_samples, temperature=cfg.temperature,
                           generator=gen, **kw)
    m.update(evaluate(model, task.tok, task.val, task.reverse, cfg.max_new_tokens,
                      prefix="val", **kw)[0])
    return {**m, **eval_kl(model, ref, task, cfg, gen)}, examples


def explained_variance(values, returns, mask):
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 = exact."""
    return 1 - L.masked_var(returns - values, mask) / L.masked_var(returns, mask).clamp_min(1e-8)


def rollout_metrics(b, ref_lp=None, returns=None, beta=None, tool=None):
    """A rollout's rl/ diagnostics: reward, accuracy, lengths (the policy's tokens), tool use;
    the KL to the reference when it ran; PPO's value fit (returns given); the RM's score."""
    m = b.mask
    out = {"rl/reward_mean": b.reward.mean().item(), "rl/accuracy": b.correct.mean().item(),
           "rl/resp_len": m.sum(1).float().mean().item(),
           "rl/empty_frac": (b.length <= 1).float().mean().item(),
           "rl/truncated_frac": 1 - b.finished.float().mean().item()}
    if ref_lp is not None:
        out["rl/kl"] = L.masked_mean(L.kl_estimate(b.old, ref_lp, "k3"), m).item()
    if returns is not None:
        k1 = 0.0 if ref_lp is None else L.masked_sum(b.old - ref_lp, m, 1).mean().item()
        out.update({"rl/explained_variance": explained_variance(b.values, returns, m).item(),
                    "rl/beta": beta, "rl/values_mean": L.masked_mean(b.values, m).item(),
                    "rl/returns_mean": L.masked_mean(returns, m).item(), "rl/kl_k1_seq": k1})
    if tool:
        out.update(tools.metrics(tools.counts(b.ids[:, -m.size(1):], m, b.length, tool), "rl"))
    if b.rm_reward is not None:
        out["rl/rm_reward"] = b.rm_reward.mean().item()
    return out
