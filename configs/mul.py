# SFT of the default char GPT (4 layers, 128 wide, 0.8M parameters) on 2-digit multiplication,
# digits least-significant first: 2-3 min on 2 cores with bf16, ~23 in fp32. Stops at val 0.55:
# held-out greedy accuracy around 0.6, pass@8 well above pass@1, room for RL to improve.
out_dir = "out/sft-mul"
lr = 1e-3
min_lr = 1e-3  # = lr: constant after warmup, so the model stays high-entropy for RL
max_iters = 2600
target_val_accuracy = 0.55
eval_interval = 1000  # the test split's greedy + pass@8 (val accuracy: every val_interval=50 steps)
