"""
Sample completions from a checkpoint.

    python sample.py --ckpt=out/sft-mul/ckpt.pt --prompt="23*47="
    python sample.py --ckpt=out/sft-mul/ckpt.pt --prompts_file=data/mul/test.txt --temperature=0

Prints, for each prompt in order, `num_samples` lines: the prompt followed by its completion (EOS
stripped, answer in normal digit order), e.g. `23*47=1081`. Lines of a prompts file may carry the
gold answer (`23*47=1081`, the format of data/*/test.txt): then the exact-match accuracy is printed
to stderr at the end (the task's verifier, stored in the checkpoint), so stdout stays one completion per line.
"""
from dataclasses import dataclass
from pathlib import Path

import torch

from config import UserError, run_cli
from evaluate import encode_prompts, grade, responses, verifier_of
from data.tasks import parse_answer
from checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from model import generate


@dataclass
class Config:
    ckpt: str = "out/sft-mul/ckpt.pt"
    prompt: str = ""  # one prompt, e.g. "23*47="
    prompts_file: str = ""  # one prompt per line (a trailing gold answer is allowed)
    num_samples: int = 1
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 8
    seed: int = 1337
    batch_size: int = 512


def read_prompts(cfg, tok, block_size):
    """[(prompt, gold or None)], each prompt checked against the vocabulary with its line number."""
    if bool(cfg.prompt) == bool(cfg.prompts_file):
        raise UserError("give exactly one of --prompt=... or --prompts_file=...")
    if cfg.prompt:
        lines, where = [cfg.prompt], "--prompt"
    else:
        try:
            lines, where = Path(cfg.prompts_file).read_text(encoding="utf-8-sig").splitlines(), cfg.prompts_file
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{cfg.prompts_file}: cannot read ({e.__class__.__name__})") from None
    out = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        prompt, gold = line, None
        if "=" in line and not line.endswith("="):
            prompt, gold = line[:line.index("=") + 1], line[line.index("=") + 1:]
        try:
            n_tok = len(tok.encode(prompt))
        except ValueError as e:
            raise UserError(f"{where}:{n}: {e}") from None
        if n_tok + cfg.max_new_tokens > block_size:
            raise UserError(f"{where}:{n}: a prompt of {n_tok} tokens + max_new_tokens={cfg.max_new_tokens} does not "
                            f"fit the context window of {block_size} tokens")
        out.append((prompt, gold))
    if not out:
        raise UserError(f"{where}: no prompts")
    return out


def main(cfg):
    ckpt = load_checkpoint(cfg.ckpt)
    model, tok = model_from_checkpoint(ckpt, cfg.ckpt)
    reverse, vname = ckpt_settings(ckpt, cfg.ckpt, "reverse", "verifier")
    verifier = verifier_of(vname)  # the task's (sft.py --verifier)
    problems = read_prompts(cfg, tok, model.config.block_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    correct = graded = 0
    for i in range(0, len(problems), cfg.batch_size):
        chunk = problems[i:i + cfg.batch_size]
        out = generate(model, encode_prompts(tok, [p for p, _ in chunk], reverse), cfg.max_new_tokens, tok.eos_id, tok.pad_id,
                       G=cfg.num_samples, temperature=cfg.temperature, top_k=cfg.top_k or None, generator=gen)
        for row, ids in enumerate(responses(out)):
            prompt, gold = chunk[row // cfg.num_samples]
            text = tok.decode(ids)
            print(prompt + parse_answer(text, reverse))
            if gold is not None:
                graded += 1
                correct += grade(tok, ids, gold, reverse, verifier)
    if graded:
        import sys
        print(f"accuracy {correct / graded:.4f} ({int(correct)}/{graded})", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main, Config)
