# GRPO with the calculator live in every rollout (README, "Tool use"), from the tool SFT:
#   python sft.py configs/mul3_tool.py && python rl.py configs/rl_tool.py
loss = "grpo"
sft_ckpt = "out/sft-mul3-tool/ckpt.pt"
out_dir = "out/rl-tool"
max_new_tokens = 80  # a trace: 4 calls, their results, the answer
lr = 5e-5  # 2e-4 (mul's) lost greedy accuracy here: 0.868 -> 0.820 in 100 steps
group_size = 8
max_iters = 150
eval_interval = 50
micro_batch_size = 16  # 80-token rows: memory (peak RSS), not compute
sample_batch_size = 64
