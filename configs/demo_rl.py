# make demo's RL: DAPO from configs/demo.py's SFT, 300 steps of 64 prompts x 16 samples, held-out
# evals at steps 0, 100, 200 and 300 (docs/results.md, "The demo": +10 points or more on each seed).
loss = "dapo"
sft_ckpt = "out/sft-demo/ckpt.pt"
out_dir = "out/rl-demo"
max_iters = 300
eval_interval = 100
