# SFT on reasoning-gym's spell_backward, words of 3-5 letters ("Spell this word backward (example:
# sun -> nus): neon" -> "noen", verbatim), stopped at val 0.55 to leave RL room, as configs/mul.py
# stops at its own (all 500 steps reach 0.914). Then GRPO: python bench/rg_table.py spell_backward
task = "rg:spell_backward"
rg = dict(min_word_len=3, max_word_len=5)
reverse = False  # no digits to turn around
out_dir = "out/sft-rg-spell_backward"
block_size = 64  # the longest question (53 characters) and max_new_tokens
max_new_tokens = 8
batch_size = 128
lr = 1e-3
min_lr = 1e-3
max_iters = 500
eval_interval = 500
target_val_accuracy = 0.55
val_interval = 25
