# SFT on guess the number with a BPE model (docs/guides.md#your-environment-with-a-bpe-model): the
# game of configs/guess.py tokenized by a byte-level BPE learned from its demonstrations ("100",
# "50", "|<"). A turn ends where its text completes the stop "|", inside a longer token too ("|<"):
# nanorl/templates.py reads the text, and the whole token stays in the row.
#   python sft.py configs/guess_bpe.py && python rl.py configs/rl_guess.py configs/rl_guess_bpe.py
# The game as a dialogue for a base model: --template=role_colon ("User: 1-100:\n\nAssistant: 50
# \n\nUser: <\n\nAssistant: ...", stop "\n\nUser:"), with --block_size=96 --max_new_tokens=80.
task = "env:guess"
reverse = False
tokenizer = "bpe:512"  # as many merges as the games hold (about 350 tokens)
out_dir = "out/sft-guess-bpe"
block_size = 48  # the prompt (4 tokens) and a game: 7 turns of 3 tokens or so, and EOS
max_new_tokens = 40
lr = 1e-3
min_lr = 1e-3
max_iters = 1500
eval_interval = 500
