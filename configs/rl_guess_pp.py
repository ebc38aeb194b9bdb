# (c) of the guess-the-number table (README): REINFORCE++, a token-level row, with the game's
# process reward: each turn earns the share of the possible numbers it ruled out (log2 of the
# shrink over log2 100) on its last token, and a win 1 more.
#   python sft.py configs/guess.py && python rl.py configs/rl_guess_pp.py
loss = "reinforce_pp"
sft_ckpt = "out/sft-guess/ckpt.pt"
out_dir = "out/rl-guess-pp"
env_args = dict(process_reward=True)
beta = 0.0
group_size = 8
prompts_per_step = 32
max_iters = 200
micro_batch_size = 32  # 40-token games: memory (peak RSS), not compute
sample_batch_size = 64
eval_interval = 25
