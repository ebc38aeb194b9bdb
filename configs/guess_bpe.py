# SFT on guess the number with a BPE model (docs/guides.md#your-environment-with-a-bpe-model): the
# game of configs/guess.py tokenized by a byte-level BPE learned from its demonstrations (digits
# one at a time; "|<", "|>", "|=" merged). A turn ends where its text completes the stop "|",
# inside a longer token too ("|<"): nanorl/templates.py reads the text, the whole token stays.
#   python sft.py configs/guess_bpe.py && python rl.py configs/rl_guess.py configs/rl_guess_bpe.py
# The game as a dialogue for a base model: --template=role_colon ("User: 1-100:\n\nAssistant: 50
# \n\nUser: <\n\nAssistant: ...", stop "\n\nUser:"), --block_size=112 --max_new_tokens=96.
task = "env:guess"
reverse = False
tokenizer = "bpe:512"  # as many merges as the games hold (260 tokens; role_colon's 271)
out_dir = "out/sft-guess-bpe"
block_size = 48  # the prompt (6 tokens) and a game: 7 turns of at most 3 digits, `|`, an answer
max_new_tokens = 40
lr = 1e-3
min_lr = 1e-3
max_iters = 1500
eval_interval = 500
