# Bradley-Terry reward model on the default SFT checkpoint, every setting reward_model.py's default:
# about 3.5 minutes on 2 CPU cores; test pair accuracy close to 1 (docs/results.md).
sft_ckpt = "out/sft-mul/ckpt.pt"
out_dir = "out/rm-mul"
