# SFT on calculator traces (envs/calculator.py): the same model, data and budget as
# configs/mul3.py, the loss 0 on the calculator's results.
#   123*456=[123*6]{738}[123*5]{615}[123*4]{492}[738+6150+49200]{56088}56088
task = "mul3_tool"
out_dir = "out/sft-mul3-tool"
block_size = 96  # a prompt and its longest trace, 81 tokens with EOS
max_new_tokens = 80
lr = 1e-3
min_lr = 1e-3
max_iters = 250
eval_interval = 250
