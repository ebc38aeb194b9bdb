# SFT on reasoning-gym's basic_arithmetic at 2 terms of 1-2 digits with + - *: "Calculate 4 * 17."
# -> "68", the question verbatim, digits least significant first (--reverse). Then GRPO:
#   python bench/rg_table.py basic_arithmetic   (README, "The field's tasks")
task = "rg:basic_arithmetic"
rg = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=("+", "-", "*"),
          allow_parentheses=False, allow_negation=False)
reverse = True  # digits line up reversed; the README's row was measured so (rg: default false)
out_dir = "out/sft-rg-basic_arithmetic"
block_size = 32  # the longest question (19 characters) and max_new_tokens
max_new_tokens = 8
batch_size = 128
lr = 1e-3
min_lr = 1e-3
max_iters = 500
eval_interval = 500
