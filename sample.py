"""Sample completions from a checkpoint, one `prompt+answer` line each (normal digit order); with
gold answers on the lines (data/*/test.txt) the accuracy goes to stderr. A tool task's lines
show the trace, the calculator's results in braces (nanorl/tool_task.py).

    python sample.py --ckpt=out/sft-mul/ckpt.pt --prompts_file=data/mul/test.txt --num_samples=4
    python sample.py --ckpt=out/rl-tool/ckpt.pt --prompt=123*456= --tool=error  # a dead tool
"""
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from data.tasks import format_prompt, parse_answer
from model import generate
from nanorl.checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from nanorl.config import UserError, run_cli
from nanorl.evaluate import grade, verifier_of
from nanorl.rows import encode_prompts, responses
from nanorl.tool_task import tool_of


@dataclass
class Config:
    ckpt: str = "out/sft-mul/ckpt.pt"
    prompt: str = ""  # one prompt, e.g. "23*47="
    prompts_file: str = ""  # one prompt per line (a trailing gold answer is allowed)
    num_samples: int = 1  # per prompt
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 0  # 0: the checkpoint's
    tool: str = "calc"  # a tool task's calculator; "error": it answers only "?"
    seed: int = 1337
    batch_size: int = 512  # prompts per sampler call


def read_prompts(cfg, tok, block_size):
    """[(prompt, gold or None)]; a line the model cannot take is one error naming it."""
    if bool(cfg.prompt) == bool(cfg.prompts_file):
        raise UserError("give exactly one of --prompt=... or --prompts_file=...")
    where = cfg.prompts_file or "--prompt"
    try:
        text = Path(cfg.prompts_file).read_text("utf-8-sig") if cfg.prompts_file else cfg.prompt
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: cannot read ({e.__class__.__name__})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        prompt, eq, gold = line.strip().partition("=")  # "23*47=1081": gold "1081"
        if not prompt + eq:
            continue
        try:
            n_tok = len(tok.encode(prompt + eq))
        except ValueError as e:  # a character not in the vocabulary
            raise UserError(f"{where}:{n}: {e}") from None
        if n_tok + cfg.max_new_tokens > block_size:
            raise UserError(f"{where}:{n}: a prompt of {n_tok} tokens + max_new_tokens="
                            f"{cfg.max_new_tokens} does not fit the context window ({block_size})")
        out.append((prompt + eq, gold or None))
    if not out:
        raise UserError(f"{where}: no prompts")
    return out


def main(cfg):
    ckpt = load_checkpoint(cfg.ckpt)
    model, tok = model_from_checkpoint(ckpt, cfg.ckpt)
    reverse, name, task = ckpt_settings(ckpt, cfg.ckpt, "reverse", "verifier", "task")
    verifier = verifier_of(name)  # the task's (sft.py --verifier)
    if cfg.tool not in ("calc", "error"):
        raise UserError(f"tool must be 'calc' or 'error', got {cfg.tool!r}")
    tool, show = tool_of(task, tok, reverse), parse_answer
    if tool:  # a trace: each number turned back
        tool.broken, show = cfg.tool == "error", format_prompt
    cfg = replace(cfg, max_new_tokens=cfg.max_new_tokens or ckpt["config"].get("max_new_tokens", 8))
    problems = read_prompts(cfg, tok, model.config.block_size)
    gen, G, graded = torch.Generator().manual_seed(cfg.seed), cfg.num_samples, []  # graded: rewards
    for i in range(0, len(problems), cfg.batch_size):
        chunk = problems[i:i + cfg.batch_size]
        prompts = encode_prompts(tok, [p for p, _ in chunk], reverse)
        out = generate(model, prompts, cfg.max_new_tokens, tok.eos_id, tok.pad_id, G=G,
                       temperature=cfg.temperature, top_k=cfg.top_k or None, generator=gen,
                       tool=tool)
        acts = out["action_mask"][:, out["prompt_len"]:].tolist()
        for row, (ids, act) in enumerate(zip(responses(out), acts)):
            prompt, gold = chunk[row // G]
            print(prompt + show(tok.decode(ids), reverse))
            if gold is not None:
                graded.append(grade(tok, ids, gold, reverse, verifier, act))
    if graded:
        right = int(sum(graded))
        print(f"accuracy {sum(graded) / len(graded):.4f} ({right}/{len(graded)})", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main, Config)
