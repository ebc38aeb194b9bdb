"""A tiktoken BPE behind tokenizer.py's interface, for --tokenizer=gpt2 and checkpoints whose
tokenizer has kind "bpe"; tiktoken is imported only then.

    tok = bpe.load("gpt2")  # GPT-2's (fetched once, then cached); from_dict(tok.to_dict()) too
"""
import re

from tokenizer import TokenizerError


class BPETokenizer:
    """A tiktoken Encoding behind this interface; PAD is EOS (masks come from the sampler)."""

    def __init__(self, encoding):
        self.enc, self.vocab_size = encoding, encoding.n_vocab
        self.eos_id = self.pad_id = encoding.eot_token  # GPT-2's "<|endoftext|>"
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


def from_dict(d):
    """The inverse of BPETokenizer.to_dict."""
    if "ranks" not in d:
        return load(d["name"])
    import tiktoken
    ranks = {bytes.fromhex(h): r for h, r in d["ranks"]}
    return BPETokenizer(tiktoken.Encoding(d["name"], pat_str=d["pat_str"], mergeable_ranks=ranks,
                                          special_tokens=d["special_tokens"]))


def load(name):
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
                                 f"{e.__class__.__name__}: {text[:150]}") from None
        url = m[0] if m[0].startswith("http") else f"https://{m[1]}{m[2]}"
        raise TokenizerError(f"could not fetch {url}, a BPE file of the tiktoken encoding {name!r} "
                             "(no network? put tiktoken's cached copy in TIKTOKEN_CACHE_DIR): "
                             f"{e.__class__.__name__}") from None
