# The oracle control of the guess-the-number table (bench/guess_table.py): configs/rl_guess_pp.py's
# REINFORCE++, each turn paid +1 for keeping the game winnable and -1 for the turn that loses it
# (envs/guess.py's oracle_reward): the answer told, an upper bound that separates "cannot find the
# move" from "cannot lock it in".
#   python rl.py configs/rl_guess_pp.py configs/rl_guess_oracle.py
out_dir = "out/rl-guess-oracle"
env_args = dict(oracle_reward=True)
