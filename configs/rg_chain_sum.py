# SFT on reasoning-gym's chain_sum at 2 terms of 1-2 digits: "State the final answer to the
# following arithmetic problem: 4 - 1 =" -> "3", the question verbatim, digits least significant
# first (--reverse). Then GRPO: python bench/rg_table.py chain_sum (README, "The field's tasks").
task = "rg:chain_sum"
rg = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)
reverse = True  # digits line up reversed; the README's row was measured so (rg: default false)
out_dir = "out/sft-rg-chain_sum"
block_size = 80  # the longest question (69 characters) and max_new_tokens
max_new_tokens = 8
batch_size = 128
lr = 1e-3
min_lr = 1e-3
max_iters = 500
eval_interval = 500
