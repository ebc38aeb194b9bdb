# SFT of the default char GPT (4 layers, 128 wide, 0.8M parameters) on 2-digit x 2-digit multiplication,
# numbers read and written least-significant digit first. ~3-5 minutes on a 2-core CPU.
# Stops once val accuracy reaches target_val_accuracy: held-out (test) greedy accuracy lands around
# 0.6-0.7 with pass@8 well above pass@1, which leaves room for RL to improve the model.
task = "mul"
out_dir = "out/sft-mul"
batch_size = 256
lr = 1e-3
max_iters = 3000
eval_interval = 250
val_interval = 50
target_val_accuracy = 0.6
