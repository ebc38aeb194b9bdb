# configs/rl_guess.py's GRPO on the BPE model of configs/guess_bpe.py: the same game and reward,
# each turn ending where its text completes the stop "|" (nanorl/templates.py).
#   python sft.py configs/guess_bpe.py && python rl.py configs/rl_guess.py configs/rl_guess_bpe.py
sft_ckpt = "out/sft-guess-bpe/ckpt.pt"
out_dir = "out/rl-guess-bpe"
