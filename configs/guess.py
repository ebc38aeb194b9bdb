# SFT on guess the number (envs/guess.py): the default char GPT imitates the random consistent
# player (each guess uniform over the numbers still possible), which wins within 7 turns about
# half the time. RL must then beat its own demonstrations (configs/rl_guess.py).
task = "env:guess"
reverse = False  # guesses are not sums: no digit alignment to gain
out_dir = "out/sft-guess"
block_size = 48  # the prompt (6) and a game: 7 turns of at most 3 digits, `|`, an answer
max_new_tokens = 40
lr = 1e-3
min_lr = 1e-3
max_iters = 1500
eval_interval = 500
