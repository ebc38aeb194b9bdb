# SFT of the default char GPT (4 layers, 128 wide, 0.8M parameters) on 2-digit x 2-digit multiplication,
# numbers read and written least-significant digit first, bf16 autocast where native. 3-6 minutes on 2 CPU cores.
# Stops once val accuracy reaches target_val_accuracy (capped by max_iters): held-out (test) greedy
# accuracy lands around 0.55-0.65 with pass@8 well above pass@1, which leaves room for RL to improve.
task = "mul"
out_dir = "out/sft-mul"
batch_size = 256
lr = 1e-3
max_iters = 3000
eval_interval = 250
val_interval = 50
target_val_accuracy = 0.55
