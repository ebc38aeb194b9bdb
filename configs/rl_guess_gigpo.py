# GiGPO on guess the number: each turn's advantage is its episode's in the group plus its own in
# its step group, the group's turns that start from the same interval at the same turn, on a
# discounted win (gamma 0.95: a win in fewer turns is worth more).
#   python sft.py configs/guess.py && python rl.py configs/rl_guess_gigpo.py
loss = "gigpo"
sft_ckpt = "out/sft-guess/ckpt.pt"
out_dir = "out/rl-guess-gigpo"
beta = 0.0  # the reference is the random player RL must leave behind
group_size = 8
prompts_per_step = 32
dynamic_sampling = False  # a group of wins in different turns still teaches its steps
prompt_selection = False
max_iters = 600
micro_batch_size = 32  # 40-token games: memory (peak RSS), not compute
sample_batch_size = 64
eval_interval = 50
