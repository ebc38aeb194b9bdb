# Bradley-Terry reward model on the default SFT checkpoint: documented wrong-answer kinds plus the
# SFT policy's own wrong samples; every other setting is reward_model.py's default (score = scalar head
# at EOS + the answer's log-likelihood, NLL on the right answers). About 3.5 minutes on 2 CPU cores.
sft_ckpt = "out/sft-mul/ckpt.pt"
out_dir = "out/rm-mul"
