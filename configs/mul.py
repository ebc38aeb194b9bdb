# SFT of the default char GPT (4 layers, 128 wide, 0.8M parameters) on 2-digit x 2-digit multiplication,
# numbers read and written least-significant digit first, bf16 autocast where native. 4-6 minutes on 2 CPU cores.
# Constant lr after warmup (min_lr = lr): the model keeps learning and stays high-entropy, so pass@8 stays
# well above pass@1. Stops once val accuracy reaches target_val_accuracy (checked every val_interval
# steps, capped by max_iters): held-out greedy accuracy lands around 0.55, with room for RL to improve.
task = "mul"
out_dir = "out/sft-mul"
batch_size = 256
lr = 1e-3
min_lr = 1e-3
max_iters = 2600
eval_interval = 250
val_interval = 50
target_val_accuracy = 0.55
