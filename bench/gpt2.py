"""Hugging Face GPT-2 weights into model.GPT (sft.py --init_from; needs transformers). The
tiktoken BPE lives in nanorl/bpe.py, the task asked in words (mul_text) in data/tasks.py.

    python sft.py configs/gpt2_mul.py --init_from=gpt2
"""
import os

from model import GPT, GPTConfig
from nanorl.checkpoint import CheckpointError, one_line

# Hugging Face GPT-2 stores these as Conv1D weights, (in, out): nn.Linear wants (out, in)
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def from_pretrained(name_or_path, block_size=None, dropout=0.0):
    """A GPT holding Hugging Face GPT-2 weights: a hub name ("gpt2", "gpt2-medium", ...) or a
    save_pretrained folder. Same names as ours, Conv1D weights transposed, lm_head tied to wte, wpe
    cropped to block_size (default n_positions). A config departing from GPT-2's conventions (which
    model.py shares, so the logits agree) is refused; every failure is a CheckpointError."""
    try:
        import huggingface_hub.utils.logging as hub_logging
        import transformers
    except ImportError:
        raise CheckpointError(f"init_from={name_or_path!r} needs Hugging Face transformers: "
                              "pip install transformers") from None
    for logging in (transformers.logging, hub_logging):  # one line on failure, not retry warnings
        logging.set_verbosity_error()
    try:
        hf = transformers.GPT2LMHeadModel.from_pretrained(name_or_path)
    except Exception as e:
        where = (f"the folder {name_or_path}" if os.path.isdir(name_or_path) else
                 f"https://huggingface.co/{name_or_path} (config.json, model.safetensors; no "
                 "network? give a save_pretrained folder)")
        raise CheckpointError(f"could not load Hugging Face GPT-2 weights from {where}: "
                              f"{one_line(e)}") from None
    c = hf.config
    expect = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"),
              "layer_norm_epsilon": (1e-5,), "n_inner": (None, 4 * c.n_embd),
              "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
              "add_cross_attention": (False,), "tie_word_embeddings": (True,)}
    unsupported = {k: getattr(c, k) for k, ok in expect.items() if getattr(c, k) not in ok}
    if unsupported:
        raise CheckpointError(f"{name_or_path}: GPT-2 variant not supported by model.py "
                              f"({unsupported})")
    block_size = block_size or c.n_positions
    if block_size > c.n_positions:
        raise CheckpointError(f"{name_or_path}: block_size={block_size} exceeds its "
                              f"n_positions={c.n_positions}")
    model = GPT(GPTConfig(block_size=block_size, vocab_size=c.vocab_size, n_layer=c.n_layer,
                          n_head=c.n_head, n_embd=c.n_embd, dropout=dropout, bias=True))
    src = hf.state_dict()
    src.setdefault("lm_head.weight", src["transformer.wte.weight"])  # tied
    state = {}
    for k in model.state_dict():
        if k not in src:
            raise CheckpointError(f"{name_or_path}: no weight {k!r} in the Hugging Face model")
        w = src[k].t() if k.endswith(HF_TRANSPOSED) else src[k]
        state[k] = (w[:block_size] if k == "transformer.wpe.weight" else w).float()
    model.load_state_dict(state)
    return model
