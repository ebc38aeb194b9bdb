# VinePPO on configs/rl_guess_pp.py's game and process reward, each state's value read from a table
# of every past return from it (keyed by the game's state: the numbers still possible, the turns
# taken) instead of sampled branches: a turn's advantage for REINFORCE++'s cost a step.
#   python sft.py configs/guess.py
#   python rl.py configs/rl_guess_pp.py configs/rl_guess_vine_table.py
loss = "vineppo"
out_dir = "out/rl-guess-vine-table"
value_table = 0.05  # exact means over a state's first 20 visits, then a running mean at rate 0.05
dynamic_sampling = False  # the table learns from every game, the all-won and all-lost groups too
