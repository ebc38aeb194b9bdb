"""
GPT-2-size extras, off the RL path: Hugging Face GPT-2 weights into model.GPT, the tiktoken BPE
tokenizer, and the task asked in words.

    python sft.py configs/gpt2_mul.py                   # tiktoken gpt2 BPE, `mul_text` in words
    python sft.py configs/gpt2_mul.py --init_from=gpt2  # OpenAI's weights (needs transformers)

- `from_pretrained("gpt2")` (or a `save_pretrained` folder): Hugging Face GPT-2 weights mapped into
  model.GPT; needs `transformers`, only then. sft.py imports it for `--init_from` alone.
- `BPETokenizer` wraps a tiktoken Encoding behind tokenizer.py's interface; its PAD is its EOS
  (masks never come from `ids != pad_id`). `--tokenizer=gpt2` reaches it through
  `tokenizer.get_tokenizer`, a checkpoint's {"kind": "bpe"} dict through `tokenizer.from_dict`:
  a char-only run never imports this file or tiktoken.
- `text_prompt`: a text task (`mul_text`) asks data.tasks' problems in words, "23*47=" -> "What is
  23 times 47?"; `data.tasks.load_split` words the prompts, the files stay `a*b=c`.
"""
import os
import re

from data.tasks import DataError
from checkpoint import CheckpointError
from model import GPT, GPTConfig
from tokenizer import TokenizerError

# ----------------------------------------------------------------------------- weights

# Hugging Face GPT-2 stores these as Conv1D weights, (in, out): nn.Linear wants (out, in)
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                 "mlp.c_proj.weight")


def from_pretrained(name_or_path, block_size=None, dropout=0.0):
    """A GPT holding Hugging Face GPT-2 weights: a hub name ("gpt2", "gpt2-medium", ...) or a folder
    written by `save_pretrained`. Same names as ours; Conv1D weights are transposed, lm_head stays
    tied to wte, wpe is cropped to block_size (default: the model's n_positions). GPT-2's
    conventions are ours (biases, LayerNorm eps 1e-5, tanh GELU, 1/sqrt(head_dim) attention), so
    the logits agree; a config that departs from them is refused. Every failure is a
    CheckpointError."""
    try:
        from huggingface_hub.utils import logging as hub_logging
        from transformers import GPT2LMHeadModel
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise CheckpointError(f"init_from={name_or_path!r} needs Hugging Face transformers: "
                              "pip install transformers") from None
    hf_logging.set_verbosity_error()  # one line on failure, not the hub's retry warnings
    hub_logging.set_verbosity_error()
    try:
        hf = GPT2LMHeadModel.from_pretrained(name_or_path)
    except Exception as e:
        where = f"the folder {name_or_path}" if os.path.isdir(name_or_path) else \
            (f"https://huggingface.co/{name_or_path} (config.json, model.safetensors; "
             "no network? give a save_pretrained folder)")
        msg = " ".join(str(e).split())[:200]
        raise CheckpointError(f"could not load Hugging Face GPT-2 weights from {where}: "
                              f"{e.__class__.__name__}: {msg}") from None
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
    state = {}
    for k in model.state_dict():
        w = src[k] if k in src else src["transformer.wte.weight"] if k == "lm_head.weight" else None
        if w is None:
            raise CheckpointError(f"{name_or_path}: no weight {k!r} in the Hugging Face model")
        if k.endswith(HF_TRANSPOSED):
            w = w.t()
        elif k == "transformer.wpe.weight":
            w = w[:block_size]
        state[k] = w.float()
    model.load_state_dict(state)
    return model


# ----------------------------------------------------------------------------- tokenizer

class BPETokenizer:
    def __init__(self, encoding):
        self.enc = encoding
        self.eos_id = encoding.eot_token  # "<|endoftext|>" in the GPT-2 encoding
        self.pad_id = self.eos_id  # masks come from the sampler, so PAD == EOS is safe
        specials = {encoding.encode_single_token(s) for s in encoding.special_tokens_set}
        self.special_ids = specials | {self.eos_id}
        self.vocab_size = encoding.n_vocab

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.enc.decode(ids)

    def to_dict(self):
        d = {"kind": "bpe", "name": self.enc.name}
        import tiktoken
        try:  # a registered encoding (gpt2, ...) is stored by name only
            tiktoken.get_encoding(self.enc.name)
            return d
        except Exception:  # a custom Encoding: its tables as plain lists (weights_only-safe)
            ranks = self.enc._mergeable_ranks
            d["pat_str"] = self.enc._pat_str
            d["ranks"] = [[tok.hex(), r] for tok, r in sorted(ranks.items(), key=lambda kv: kv[1])]
            d["special_tokens"] = dict(self.enc._special_tokens)
            return d


def bpe_from_dict(d):
    """The inverse of BPETokenizer.to_dict (tokenizer.from_dict's "bpe" kind)."""
    if "ranks" not in d:
        return get_bpe(d["name"])
    import tiktoken
    ranks = {bytes.fromhex(h): r for h, r in d["ranks"]}
    return BPETokenizer(tiktoken.Encoding(d["name"], pat_str=d["pat_str"], mergeable_ranks=ranks,
                                          special_tokens=d["special_tokens"]))


def get_bpe(name):
    """A registered tiktoken encoding; when its BPE files cannot be fetched, one line naming the
    file."""
    import tiktoken
    try:
        return BPETokenizer(tiktoken.get_encoding(name))
    except Exception as e:
        text = " ".join(str(e).split())
        # tiktoken's and requests' messages name the file: "... for url: https://...",
        # or "host='H' ... url: /path"
        m = re.search(r"https?://[^\s'\"()]+", text)
        url = m.group() if m else None
        if url is None and (m := re.search(r"host='([^']+)'.*?url: (/[^\s'\"()]+)", text)):
            url = f"https://{m.group(1)}{m.group(2)}"
        if url:
            raise TokenizerError(f"could not fetch {url}, a BPE file of the tiktoken encoding "
                                 f"{name!r} (no network? put tiktoken's cached copy in "
                                 f"TIKTOKEN_CACHE_DIR): {e.__class__.__name__}") from None
        raise TokenizerError(f"could not load the tiktoken encoding {name!r}: "
                             f"{e.__class__.__name__}: {text[:200]}") from None


# ----------------------------------------------------------------------------- the task in words

TEXT_OPS = {"*": "times", "+": "plus"}


def text_prompt(prompt):
    """A symbolic prompt in words: "23*47=" -> "What is 23 times 47?"."""
    m = re.fullmatch(r"(\d+)([*+])(\d+)=", prompt)
    if m is None:
        raise DataError(f"cannot word the prompt {prompt!r}: expected 'a*b=' or 'a+b='")
    return f"What is {m.group(1)} {TEXT_OPS[m.group(2)]} {m.group(3)}?"
