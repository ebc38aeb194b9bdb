"""GPT-2-size extras, off the RL path: Hugging Face GPT-2 weights into model.GPT (`--init_from`,
needs transformers), the tiktoken BPE tokenizer (`--tokenizer=gpt2`, through tokenizer.py) and the
task asked in words (`mul_text`). A char-only run never imports this file or tiktoken.

    python sft.py configs/gpt2_mul.py --init_from=gpt2
"""
import os
import re

from checkpoint import CheckpointError, one_line
from data.tasks import DataError
from model import GPT, GPTConfig
from tokenizer import TokenizerError

# Hugging Face GPT-2 stores these as Conv1D weights, (in, out): nn.Linear wants (out, in)
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
TEXT_OPS = {"*": "times", "+": "plus"}  # text_prompt's words


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


class BPETokenizer:
    """A tiktoken Encoding behind tokenizer.py's interface; PAD is EOS (masks come from the sampler,
    never from ids != pad_id)."""

    def __init__(self, encoding):
        self.enc, self.vocab_size = encoding, encoding.n_vocab
        self.eos_id = self.pad_id = encoding.eot_token  # "<|endoftext|>" in the GPT-2 encoding
        specials = {encoding.encode_single_token(s) for s in encoding.special_tokens_set}
        self.special_ids = specials | {self.eos_id}

    def encode(self, text):
        return self.enc.encode_ordinary(text)  # special-token text in data stays plain text

    def decode(self, ids):
        ids = list(ids)
        return self.enc.decode(ids[:ids.index(self.eos_id)] if self.eos_id in ids else ids)

    def to_dict(self):
        """A registered encoding (gpt2, ...) by name, a custom one with its tables as lists."""
        import tiktoken
        d = {"kind": "bpe", "name": self.enc.name}
        if self.enc.name in tiktoken.list_encoding_names():
            return d
        ranks = sorted(self.enc._mergeable_ranks.items(), key=lambda kv: kv[1])
        return {**d, "pat_str": self.enc._pat_str, "ranks": [[t.hex(), r] for t, r in ranks],
                "special_tokens": dict(self.enc._special_tokens)}


def bpe_from_dict(d):
    """The inverse of BPETokenizer.to_dict (tokenizer.from_dict's "bpe" kind)."""
    if "ranks" not in d:
        return get_bpe(d["name"])
    import tiktoken
    ranks = {bytes.fromhex(h): r for h, r in d["ranks"]}
    return BPETokenizer(tiktoken.Encoding(d["name"], pat_str=d["pat_str"], mergeable_ranks=ranks,
                                          special_tokens=d["special_tokens"]))


def get_bpe(name):
    """A registered tiktoken encoding; a BPE file it cannot fetch is one line naming its URL."""
    import tiktoken
    try:
        return BPETokenizer(tiktoken.get_encoding(name))
    except Exception as e:
        text = " ".join(str(e).split())  # tiktoken's or requests' message: "... https://..." or
        m = (re.search(r"https?://[^\s'\"()]+", text)  # "host='H' ... url: /path"
             or re.search(r"host='([^']+)'.*?url: (/[^\s'\"()]+)", text))
        if m is None:
            raise TokenizerError(f"could not load the tiktoken encoding {name!r}: "
                                 f"{one_line(e)}") from None
        url = m[0] if m[0].startswith("http") else f"https://{m[1]}{m[2]}"
        raise TokenizerError(f"could not fetch {url}, a BPE file of the tiktoken encoding {name!r} "
                             "(no network? put tiktoken's cached copy in TIKTOKEN_CACHE_DIR): "
                             f"{e.__class__.__name__}") from None


def text_prompt(prompt):
    """A symbolic prompt in words: "23*47=" -> "What is 23 times 47?"."""
    m = re.fullmatch(r"(\d+)([*+])(\d+)=", prompt)
    if m is None:
        raise DataError(f"cannot word the prompt {prompt!r}: expected 'a*b=' or 'a+b='")
    return f"What is {m[1]} {TEXT_OPS[m[2]]} {m[3]}?"
