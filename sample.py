"""Sample completions from a checkpoint, one `prompt+answer` line each (normal digit order); with
gold answers (--answer, a file's `prompt<TAB>answer` or `prompt=answer` lines as in
data/*/test.txt) or a split of the checkpoint's task, the accuracy goes to stderr. An
environment's episode (a tool's calls, a game) shows turn by turn: the policy's text, then the
environment's answer; it needs the answer (the game's secret).

    python sample.py --ckpt=out/sft-mul/ckpt.pt --prompts_file=data/mul/test.txt --num_samples=4
    python sample.py --ckpt=out/rl-tool/ckpt.pt --prompt=123*456= --answer=56088
    python sample.py --ckpt=out/rl-tool/ckpt.pt --prompt=123*456= --answer=56088 \
        --env_args='{"broken": true}'                                 # every call answered `?`
    python sample.py --ckpt=out/rl-guess/ckpt.pt --prompt=1-100: --answer=37   # one game, secret 37
    python sample.py --ckpt=out/rl-guess/ckpt.pt --split=test --temperature=1  # 100 games
"""
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from data.tasks import flip_numbers, parse_answer
from model import generate, responses
from nanorl import templates
from nanorl.config import UserError, run_cli
from nanorl.evaluate import load_policy
from nanorl.rows import encode_prompts


@dataclass
class Config:
    ckpt: str = "out/sft-mul/ckpt.pt"
    prompt: str = ""  # one prompt, verbatim, e.g. "23*47="
    answer: str = ""  # --prompt's gold answer, or "": none
    prompts_file: str = ""  # a prompt a line: `prompt<TAB>answer`, `prompt=answer` or `prompt`
    num_samples: int = 1  # per prompt
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 0  # 0: the checkpoint's
    split: str = ""  # or every problem of a split of the checkpoint's task: val, test
    env_args: dict = field(default_factory=dict)  # the task's environment's arguments
    seed: int = 1337
    batch_size: int = 512  # prompts per sampler call


def read_prompts(cfg, tok, block_size):
    """[(prompt, gold or None)]; a line the model cannot take is one error naming it."""
    where = cfg.prompts_file or "--prompt"
    try:
        text = Path(cfg.prompts_file).read_text("utf-8-sig") if cfg.prompts_file else ""
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: cannot read ({e.__class__.__name__})") from None
    lines = [(cfg.prompt, cfg.answer)] if cfg.prompt else map(split_line, text.split("\n"))
    out = []
    for n, (prompt, gold) in enumerate(lines, 1):
        if not prompt:
            continue
        try:
            n_tok = len(tok.encode(prompt))
        except ValueError as e:  # a character not in the vocabulary
            raise UserError(f"{where}:{n}: {e}") from None
        if n_tok + cfg.max_new_tokens > block_size:
            raise UserError(f"{where}:{n}: a prompt of {n_tok} tokens + max_new_tokens="
                            f"{cfg.max_new_tokens} does not fit the context window ({block_size})")
        out.append((prompt, gold or None))
    if not out:
        raise UserError(f"{where}: no prompts")
    return out


def split_line(line):
    """A prompts file's line -> (prompt, gold): `prompt<TAB>gold` verbatim (but a CR), else
    `prompt=gold` ("23*47=1081": gold "1081") or a prompt alone, stripped."""
    if "\t" in line:
        prompt, _, gold = line.rstrip("\r").partition("\t")
        return prompt, gold
    prompt, eq, gold = line.strip().partition("=")
    return prompt + eq, gold


def main(cfg):
    if bool(cfg.prompt) + bool(cfg.prompts_file) + bool(cfg.split) != 1:
        raise UserError("give exactly one of --prompt=..., --prompts_file=... or --split=...")
    if cfg.answer and not cfg.prompt:
        raise UserError("--answer is --prompt's gold answer (a file's: prompt<TAB>answer lines)")
    model, task = load_policy(cfg.ckpt, False, "cpu", cfg.env_args)  # task: reverse, verifier, env
    tok = task.tok
    cfg = replace(cfg, max_new_tokens=cfg.max_new_tokens or task.max_new_tokens)
    if cfg.split not in ("", "val", "test"):
        raise UserError(f"split must be val or test, got {cfg.split!r}")
    problems = getattr(task, cfg.split) if cfg.split else \
        read_prompts(cfg, tok, model.config.block_size)
    if task.env_module and not cfg.split:  # your prompts as the episodes' template writes them
        problems = [(templates.of(task.template).prompt(p), gold) for p, gold in problems]
    if task.env_module and any(gold is None for _, gold in problems):
        raise UserError(f"{task.name}'s episodes need their answers: give --answer, "
                        "prompt<TAB>answer lines or --split")
    gen, G, scores = torch.Generator().manual_seed(cfg.seed), cfg.num_samples, []
    for i in range(0, len(problems), cfg.batch_size):
        chunk = problems[i:i + cfg.batch_size]
        episodes = task.episodes(chunk, G)
        out = generate(model, encode_prompts(tok, [p for p, _ in chunk], task.reverse),
                       cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=G, temperature=cfg.temperature,
                       top_k=cfg.top_k or None, generator=gen, episodes=episodes)
        acts = out["action_mask"][:, out["prompt_len"]:].tolist()
        for r, (ids, act) in enumerate(zip(responses(out), acts)):
            prompt, gold = chunk[r // G]
            score = task.score(ids, act, chunk[r // G], episodes, r) if gold is not None else None
            print(prompt + (parse_answer(tok.decode(ids), task.reverse) if not episodes else
                            "".join(f"\n  {t}" for t in turns(tok, ids, act, task.reverse)) +
                            f"\n  score {score}"))
            if gold is not None:
                scores.append(score)
    if scores:
        right = sum(s == 1 for s in scores)
        print(f"accuracy {right / len(scores):.4f} ({right}/{len(scores)})", file=sys.stderr)


def turns(tok, ids, act, reverse):
    """An episode's response, a line per turn: the policy's text, then the environment's."""
    lines, cut = [], [0] + [i + 1 for i in range(len(ids) - 1) if not act[i] and act[i + 1]]
    for a, b in zip(cut, cut[1:] + [len(ids)]):  # a turn: the policy's tokens, then the answer
        k = next((i for i in range(a, b) if not act[i]), b)
        mine, answer = (flip_numbers(tok.decode(ids[x:y]), reverse) for x, y in ((a, k), (k, b)))
        lines.append(f"{mine}  {answer}" if answer else mine)
    return lines


if __name__ == "__main__":
    run_cli(main, Config)
