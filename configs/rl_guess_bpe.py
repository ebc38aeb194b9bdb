# configs/rl_guess.py's GRPO on the BPE model of configs/guess_bpe.py: the same game and reward,
# each turn ending where its text completes the stop "|" (nanorl/templates.py). 300 steps, where
# every seed passed a win of 0.80 at T = 1 (0.901 / 0.930 / 0.916; at 200: 0.778 / 0.774 / 0.878),
# about 7 min of RL on 2 cores (docs/results.md, "With a BPE model").
#   python sft.py configs/guess_bpe.py && python rl.py configs/rl_guess.py configs/rl_guess_bpe.py
sft_ckpt = "out/sft-guess-bpe/ckpt.pt"
out_dir = "out/rl-guess-bpe"
max_iters = 300  # the BPE policy sharpens more slowly than the char one
