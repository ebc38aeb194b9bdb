# SFT of the default char GPT (4 layers, 128 wide, 0.8M parameters) on 2-digit multiplication,
# digits least-significant first, make demo's: batch 128 at lr 7e-4 reaches val 0.5 on half the
# samples of batch 256 at 1e-3 (docs/results.md, "The demo"); stopped there to leave RL room:
# 1.5-3 min on 2 cores, held-out greedy around 0.5, pass@8 around 0.75.
out_dir = "out/sft-mul"
batch_size = 128
lr = 7e-4
min_lr = 7e-4  # = lr: constant after warmup, so the model stays high-entropy for RL
max_iters = 4000
target_val_accuracy = 0.5
val_interval = 100
eval_interval = 4000  # the test split's greedy + pass@8 at the end (val: every val_interval)
