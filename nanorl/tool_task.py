"""
The tool task: 3-digit x 3-digit products (mul3_tool), beyond the default 0.8M-parameter model
in its head, solved with the calculator (tools.py): a call per partial product, one for their
sum, then the answer. Normal order (the model reads each number reversed, as in mul):

    123*456=[123*6]{738}[123*5]{615}[123*4]{492}[738+6150+49200]{56088}56088

    python sft.py configs/mul3_tool.py   # SFT on these traces, the loss 0 on the `{...}` results
    python rl.py configs/rl_tool.py      # GRPO with the calculator live in every rollout
"""
from data.tasks import TASKS, format_prompt
from nanorl.tools import Calculator, env_mask


def trace(prompt, answer):
    """The worked answer to "a*b=", in normal digit order."""
    a, b = prompt[:-1].split("*")
    parts = [int(a) * int(d) for d in reversed(b)]  # a times each digit of b, units first
    calls = "".join(f"[{a}*{d}]{{{p}}}" for d, p in zip(reversed(b), parts))
    total = "+".join(str(p * 10 ** i) for i, p in enumerate(parts))
    return f"{calls}[{total}]{{{answer}}}{answer}"


def tool_of(task, tok, reverse):
    """The task's environment (a Calculator), or None for a task without a tool."""
    return Calculator(tok, reverse) if TASKS.get(task, {}).get("tool") else None


def gold_rows(tok, problems, reverse, tool):
    """[(prompt, answer)] -> [(prompt ids, trace ids + EOS, its action mask)]: the environment's
    `{...}` results are masked out (0), so SFT never learns to write them itself."""
    rows = []
    for p, a in problems:
        ids = tok.encode(format_prompt(trace(p, a), reverse)) + [tok.eos_id]  # reverse each number
        rows.append((tok.encode(format_prompt(p, reverse)), ids, env_mask(ids, tool)))
    return rows
