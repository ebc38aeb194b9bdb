# Baseline (a) of the tool-use table (README): the default char GPT answers 3-digit x 3-digit
# products directly, with the SFT budget of configs/mul3_tool.py (250 steps).
task = "mul3"
out_dir = "out/sft-mul3"
lr = 1e-3
min_lr = 1e-3  # = lr: constant after warmup, as in configs/mul.py
max_iters = 250
eval_interval = 250
