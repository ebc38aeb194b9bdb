# SFT of the default 4-layer, 128-wide char GPT on 2-digit x 2-digit multiplication (answers written
# least-significant digit first). ~3-5 minutes on a 2-core CPU. Stops once val accuracy reaches
# target_val_accuracy, leaving held-out (test) greedy accuracy around 0.6-0.75, room for RL to improve.
task = "mul"
out_dir = "out/sft-mul"
batch_size = 256
lr = 1e-3
max_iters = 3500
eval_interval = 100
target_val_accuracy = 0.65
