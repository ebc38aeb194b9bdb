# (b) of the guess-the-number table (README): GRPO from configs/guess.py's SFT, reward 1 on a win
# within 7 turns. The reference is the random player RL must leave behind: no KL term.
#   python sft.py configs/guess.py && python rl.py configs/rl_guess.py
loss = "grpo"
sft_ckpt = "out/sft-guess/ckpt.pt"
out_dir = "out/rl-guess"
beta = 0.0
group_size = 8  # 8 games of one secret
prompts_per_step = 32
max_iters = 200
micro_batch_size = 32  # 40-token games: memory (peak RSS), not compute; the sampler: one call
eval_interval = 25
