# GiGPO on configs/rl_guess.py's game: a turn's advantage is its episode's plus its own in its step
# group (the group's turns from one interval at one turn), on a discounted win (gamma 0.95).
#   python sft.py configs/guess.py && python rl.py configs/rl_guess.py configs/rl_guess_gigpo.py
loss = "gigpo"
out_dir = "out/rl-guess-gigpo"
dynamic_sampling = False  # a group of wins in different turns still teaches its steps
prompt_selection = False
max_iters = 600
