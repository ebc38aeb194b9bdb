# VinePPO on configs/rl_guess_pp.py's game and process reward: a turn's advantage is its reward plus
# the value of the state it leads to minus the value of the state it came from, each value the mean
# return of 4 games continued from that state (docs/algorithms.md).
#   python sft.py configs/guess.py && python rl.py configs/rl_guess_pp.py configs/rl_guess_vine.py
loss = "vineppo"
out_dir = "out/rl-guess-vine"
max_iters = 250  # 15 minutes on 2 cores
sample_batch_size = 128  # the branches' calls too: a peak RSS of 500 MiB at 256
