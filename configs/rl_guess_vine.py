# VinePPO on guess the number: the value of the state each turn starts from is the mean return of
# 4 games continued from it (Monte-Carlo, no critic); a turn's advantage is its reward plus the
# value of the state it leads to, minus the value of the state it came from. The process reward.
#   python sft.py configs/guess.py && python rl.py configs/rl_guess_vine.py
loss = "vineppo"
sft_ckpt = "out/sft-guess/ckpt.pt"
out_dir = "out/rl-guess-vine"
env_args = dict(process_reward=True)
beta = 0.0
group_size = 8
prompts_per_step = 32
max_iters = 200
micro_batch_size = 32
sample_batch_size = 256  # the branches: 4 rows a prefix
eval_interval = 25
