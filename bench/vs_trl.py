"""
Our GRPO step against TRL's GRPOTrainer, side by side in one process (a ratio, not two timings).

    pip install trl                 # bench-only; without it this says so and exits
    python bench/vs_trl.py [--steps=20] [--warmup=3] [--threads=1] [--only=both|ours|trl]

Both sides: the default 4-layer, 128-wide model (the SFT checkpoint when it exists, else a fresh
one) and a Hugging Face GPT2LMHeadModel holding the same weights (the inverse of
GPT.from_pretrained's mapping), 8 prompts x 8 samples, <= 8 new tokens, GRPO (TRL:
loss_type="grpo") with beta 0.04, lr 1e-5, one optimizer step per rollout, 1 thread. TRL on CPU
needs bf16 and gradient checkpointing off, and with beta > 0 loads its reference model from a
path (save_pretrained, then config._name_or_path). torch.set_flush_denormal(True) is a process-wide
flag, so it holds for both (off, TRL's backward ran ~10x slower in a probe).
The sides interleave: a TrainerCallback runs one of our steps (rl.collect + rl.pg_step, what rl.py
runs) after each TRL step, so both see the same machine load. A TRL step is the time between
two of its on_step_end calls, less our step in between. Our forwards run each distinct row once
(the sampler each distinct prefix, the trainer each distinct sample): the share of distinct rows is
printed beside our step; TRL runs every row. Prints the medians after the warm-up,
each side's rollout/update split, ratio = TRL / ours, and each side against the
FLOP limit (our step's FLOPs at this machine's GEMM rate). --only=ours|trl runs one side alone
and adds its peak RSS (ru_maxrss), which in a shared process would be the larger side's.
"""
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rl  # noqa: E402
from bench.rl_step import grpo_run, grpo_step  # noqa: E402
from nanorl.config import load_config  # noqa: E402
from nanorl.evaluate import Task  # noqa: E402
from data.tasks import ALPHABET, flip_numbers, load_split  # noqa: E402
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model import GPT, GPTConfig, HF_TRANSPOSED  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402


@dataclass
class Config:
    steps: int = 20  # timed steps per side, after the warm-up
    warmup: int = 3
    threads: int = 1
    prompts: int = 8
    group_size: int = 8
    max_new_tokens: int = 8
    beta: float = 0.04
    lr: float = 1e-5
    flush_denormal: bool = True
    only: str = "both"  # "both", "ours" or "trl" (alone: its peak RSS is printed too)
    sft_ckpt: str = "out/sft-mul/ckpt.pt"


def hf_twin(model, path):
    """A GPT2LMHeadModel with our model's weights (Conv1D wants (in, out)), saved to path."""
    import transformers
    c = model.config
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function="gelu" if c.gelu == "erf" else "gelu_new",  # the checkpoint's GELU
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0))
    state = {k: (v.t() if k.endswith(HF_TRANSPOSED) else v) for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)  # lm_head is tied
    hf.save_pretrained(path)
    hf.config._name_or_path = path  # TRL loads its reference model from here
    return hf


def hf_tokenizer(tok):
    """Our character vocabulary as a Hugging Face fast tokenizer: the same ids, PAD 0, EOS 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<eos>": 1, **{ch: i for ch, i in tok.stoi.items()}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def main(b):
    torch.set_num_threads(b.threads)
    torch.set_flush_denormal(b.flush_denormal)
    if b.only in ("both", "trl"):
        try:
            import trl
        except ImportError:
            print("TRL is not installed: pip install trl to compare (bench-only; not a project dependency)")
            return
    torch.manual_seed(0)
    if os.path.exists(b.sft_ckpt):
        ckpt = load_checkpoint(b.sft_ckpt)
        model, tok = model_from_checkpoint(ckpt, b.sft_ckpt)
        reverse, what = ckpt["config"].get("reverse", False), b.sft_ckpt
    else:
        tok = CharTokenizer(ALPHABET)
        model, reverse, what = GPT(GPTConfig(vocab_size=tok.vocab_size)), True, "a fresh default model"
    train = load_split("mul", "train")
    cfg = rl.Config(loss="grpo", prompts_per_step=b.prompts, group_size=b.group_size, max_new_tokens=b.max_new_tokens,
                    beta=b.beta, prompt_selection=False, dynamic_sampling=False, overlong_window=0)
    ours = {"step": [], "rollout": [], "update": [], "distinct": []}
    run, gen = None, torch.Generator().manual_seed(0)

    def our_step():
        nonlocal run
        if run is None:  # made at the first step: AdamW, reference and prompts as rl.py's
            run = grpo_run(model, tok, reverse, b.beta, b.lr)
        model.eval()  # as rl.py: dropout off for every log-prob
        r, u, batch = grpo_step(cfg, run, gen, b.lr)
        keys = torch.cat([batch.offsets[:, None], batch.ids], 1)  # a row: its padding and its tokens
        distinct = len(torch.unique(keys, dim=0)) / len(batch.ids)  # the rows our forwards run
        for k, v in (("step", r + u), ("rollout", r), ("update", u), ("distinct", distinct)):
            ours[k].append(v)

    theirs = {"step": [], "rollout": [], "update": []}
    if b.only in ("both", "trl"):
        import warnings
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames of TRL's arguments
        tmp = tempfile.mkdtemp(prefix="vs_trl_")
        hf = hf_twin(model, os.path.join(tmp, "model"))
        data = Dataset.from_dict({"prompt": [flip_numbers(p, reverse) for p, _ in train], "answer": [a for _, a in train]})

        score = Task(tok, "mul", reverse, "exact", 0).score  # rl.py's reward: the verifier's, 0 without EOS

        def reward(completion_ids, answer, **kw):
            return [score(ids, None, (None, gold)) for ids, gold in zip(completion_ids, answer)]

        class Interleave(TrainerCallback):
            """Times TRL's steps; after each, runs one of ours (with both sides, or none)."""
            last = None

            def on_step_end(self, args, state, control, **kw):
                now = time.perf_counter()
                if self.last is not None:
                    theirs["step"].append(now - self.last)
                if b.only == "both":
                    our_step()
                self.last = time.perf_counter()

        args = trl.GRPOConfig(
            output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=b.prompts * b.group_size,
            num_generations=b.group_size, max_completion_length=b.max_new_tokens, beta=b.beta, loss_type="grpo",
            learning_rate=b.lr, temperature=1.0, max_steps=b.warmup + b.steps + 1, use_cpu=True, bf16=False,
            gradient_checkpointing=False, logging_steps=10 ** 6, save_strategy="no", report_to="none",
            disable_tqdm=True, seed=0, dataloader_num_workers=0)
        trainer = trl.GRPOTrainer(model=hf, reward_funcs=reward, args=args, train_dataset=data,
                                  processing_class=hf_tokenizer(tok), callbacks=[Interleave()])
        trainer.remove_callback(PrinterCallback)  # its end-of-training metrics dict
        gen_score = trainer._generate_and_score_completions  # TRL's rollout: generate, score, old/ref log-probs

        def timed(*a, **k):
            t = time.perf_counter()
            out = gen_score(*a, **k)
            theirs["rollout"].append(time.perf_counter() - t)
            return out
        trainer._generate_and_score_completions = timed
        trainer.train()
        n = len(theirs["step"])
        theirs["rollout"] = theirs["rollout"][1:n + 1]  # the first TRL step has no start mark
        theirs["update"] = [s - r for s, r in zip(theirs["step"], theirs["rollout"])]
    else:
        for _ in range(b.warmup + b.steps):
            our_step()

    def med(d, k):
        return statistics.median(d[k][b.warmup:])
    print(f"GRPO, {what} (4 layers x 128 wide), {torch.get_num_threads()} thread(s), {b.prompts} prompts x {b.group_size} "
          f"samples, <= {b.max_new_tokens} new tokens, beta {b.beta}, flush_denormal {b.flush_denormal}, "
          f"median of {b.steps} steps after {b.warmup} warm-up")
    for name, d in (("ours", ours), ("TRL ", theirs)):
        if d["step"]:
            print(f"{name}: step {med(d, 'step'):.4f} s (rollout {med(d, 'rollout'):.4f} s, update {med(d, 'update'):.4f} s)"
                  + (f", distinct rows {med(d, 'distinct'):.0%} of the rollout's" if d.get("distinct") else ""))
    if b.only != "both":
        print(f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} ({b.only} alone)")
    else:
        print(f"ratio={med(theirs, 'step') / med(ours, 'step'):.2f}x (TRL step / our step)")
    if b.only != "trl":  # how far each side is from what the arithmetic alone would take
        limit = flop_limit(our_step)
        print(f"flop_limit={limit:.4f} s: ours {med(ours, 'step') / limit:.2f}x it"
              + (f", TRL {med(theirs, 'step') / limit:.2f}x" if theirs["step"] else ""))


def flop_limit(step):
    """Seconds one of our steps would take at this machine's GEMM rate: the step's FLOPs (matmuls and
    attention, forward and backward, counted by torch's FlopCounterMode) over the rate of a
    (4096 x 128) @ (128 x 512) matmul, the model's own shape, median of 100."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        step()
    a, w, times = torch.randn(4096, 128), torch.randn(128, 512), []
    for _ in range(105):
        t = time.perf_counter()
        a @ w
        times.append(time.perf_counter() - t)
    rate = 2 * 4096 * 128 * 512 / statistics.median(times[5:])  # after a warm-up
    print(f"our step: {counter.get_total_flops() / 1e9:.2f} GFLOP; GEMM rate {rate / 1e9:.0f} GFLOP/s")
    return counter.get_total_flops() / rate


if __name__ == "__main__":
    main(load_config(Config, sys.argv[1:]))
