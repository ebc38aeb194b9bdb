# Bradley-Terry reward model on the default SFT checkpoint: documented wrong-answer kinds plus the
# SFT policy's own wrong samples. About 2 minutes on 2 CPU cores -> out/rm-mul/ckpt.pt
sft_ckpt = "out/sft-mul/ckpt.pt"
out_dir = "out/rm-mul"
batch_size = 64
lr = 3e-4
max_iters = 1500
eval_interval = 250
policy_samples = 4
