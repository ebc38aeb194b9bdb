# VinePPO on guess the number: the value of the state each turn starts from is the mean return of
# 4 games continued from it (the group's other games through it, then branches sampled from it);
# a turn's advantage is its reward plus the value of the state it leads to, minus the value of the
# state it came from. The process reward. 250 steps: 15 minutes on 2 cores (docs/results.md).
#   python sft.py configs/guess.py && python rl.py configs/rl_guess_vine.py
loss = "vineppo"
sft_ckpt = "out/sft-guess/ckpt.pt"
out_dir = "out/rl-guess-vine"
env_args = dict(process_reward=True)
beta = 0.0  # the reference is the random player RL must leave behind
group_size = 8
prompts_per_step = 32
max_iters = 250
micro_batch_size = 32  # 40-token games: memory (peak RSS), not compute
sample_batch_size = 128  # the branches' calls too: 500 MiB at 256
eval_interval = 25
