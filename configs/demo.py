# make demo's SFT: the default model on 2-digit multiplication, batch 128 at lr 7e-4 (half the
# samples configs/mul.py needs to reach val 0.5: docs/results.md, "The demo"), stopped once val
# accuracy reaches 0.5 to leave RL room; the test split's eval only at the end.
out_dir = "out/sft-demo"
batch_size = 128
lr = 7e-4
min_lr = 7e-4  # = lr: constant after warmup, as configs/mul.py
max_iters = 4000
target_val_accuracy = 0.5
val_interval = 100
eval_interval = 4000
