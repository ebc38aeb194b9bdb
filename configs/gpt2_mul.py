# GPT-2-small shape (12 layers, 12 heads, 768 wide, 124M parameters) with tiktoken's GPT-2 BPE on the
# multiplication task asked in words: "What is 23 times 47?" -> "1081" (mul's problems and splits; 6
# prompt tokens, answer 1-4 tokens + EOS). Meant for a GPU: the global batch of 256 runs as 4 micro-batches
# of 64 (--micro_batch_size) with the same gradient. From scratch by default; --init_from=gpt2 starts from
# OpenAI's weights (needs transformers; --lr=1e-4 there). Needs the gpt2 BPE files (tiktoken fetches them
# once; offline it stops with one line naming the file). Not trained to the end here (CPU only, no result
# yet); on 2 shared CPU cores `--max_iters=2` is a smoke test of about 5 minutes, mostly the two greedy evals.
task = "mul_text"
tokenizer = "gpt2"
reverse = False  # BPE merges digits into chunks of up to 3; no reversed format
out_dir = "out/sft-gpt2-mul"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 32
batch_size = 256
micro_batch_size = 64
lr = 3e-4
min_lr = 3e-5
warmup_iters = 100
max_iters = 2000
eval_interval = 250
eval_samples = 0  # greedy accuracy only: pass@8 samples 8x the test set through a 124M model
max_new_tokens = 6  # a 4-digit answer is at most 4 BPE tokens + EOS
