# GPT-2-small shape (124M parameters) with tiktoken's GPT-2 BPE on `mul` asked in words ("What is 23
# times 47?" -> "1081"); --init_from=gpt2 starts from OpenAI's weights (needs transformers; use
# --lr=1e-4). Meant for a GPU, not trained to the end yet (no result); on 2 CPU cores --max_iters=2
# is a ~5 minute smoke test. Needs the BPE files: offline, one line names the missing one.
task = "mul_text"
tokenizer = "gpt2"
reverse = False  # BPE merges digits into chunks of up to 3: no reversed format
out_dir = "out/sft-gpt2-mul"
n_layer = 12
n_head = 12
n_embd = 768
micro_batch_size = 64  # the batch of 256 as 4 micro-batches, same gradient
lr = 3e-4
min_lr = 3e-5
max_iters = 2000
eval_samples = 0  # greedy accuracy only: pass@8 samples 8x the test set through a 124M model
max_new_tokens = 6  # a 4-digit answer is at most 4 BPE tokens + EOS
