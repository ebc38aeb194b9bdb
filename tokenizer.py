"""Tokenizers with encode, decode, vocab_size, eos_id, pad_id, special_ids and to_dict: the
CharTokenizer (default: one id per character of the task alphabet, after PAD 0 and EOS 1) or,
by any other name, a tiktoken BPE (tiktoken imported only then). `from_dict(tok.to_dict())`
rebuilds either; the dict is in every checkpoint, so a checkpoint alone can sample.

    CharTokenizer("0123456789*+=").encode("23*47=")  # -> [4, 5, 12, 6, 9, 14]
    tok = get_tokenizer("gpt2", chars)  # tiktoken's GPT-2 BPE (fetched once, then cached)
"""
import re
from itertools import takewhile


class TokenizerError(ValueError):
    pass


class CharTokenizer:
    specials = ["<pad>", "<eos>"]

    def __init__(self, chars):
        if len(set(chars)) != len(chars):
            raise TokenizerError(f"duplicate characters in the alphabet {chars!r}")
        self.chars = chars
        self.stoi = {c: i + len(self.specials) for i, c in enumerate(chars)}
        self.pad_id, self.eos_id = 0, 1
        self.special_ids = {self.pad_id, self.eos_id}
        self.vocab_size = len(self.specials) + len(chars)

    def encode(self, text):
        bad = next((c for c in text if c not in self.stoi), None)
        if bad is not None:
            raise TokenizerError(f"character {bad!r} (U+{ord(bad):04X}) is not in the vocabulary "
                                 f"{self.chars!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        """Specials are dropped: PAD never shows, EOS ends the text."""
        kept = takewhile(lambda i: i != self.eos_id, ids)
        return "".join(self.chars[i - len(self.specials)] for i in kept if i != self.pad_id)

    def to_dict(self):
        return {"kind": "char", "chars": self.chars}


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
                                 f"{e.__class__.__name__}: {text[:150]}") from None
        url = m[0] if m[0].startswith("http") else f"https://{m[1]}{m[2]}"
        raise TokenizerError(f"could not fetch {url}, a BPE file of the tiktoken encoding {name!r} "
                             "(no network? put tiktoken's cached copy in TIKTOKEN_CACHE_DIR): "
                             f"{e.__class__.__name__}") from None


def get_tokenizer(name, chars):
    """"char": one id per character of `chars`; else a tiktoken encoding ("gpt2")."""
    return CharTokenizer(chars) if name == "char" else get_bpe(name)


def from_dict(d):
    if d.get("kind") == "char":
        return CharTokenizer(d["chars"])
    if d.get("kind") == "bpe":
        return bpe_from_dict(d)
    raise TokenizerError(f"unknown tokenizer kind {d.get('kind')!r}")
