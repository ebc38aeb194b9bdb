"""
Tokenizers behind one small interface: encode, decode, vocab_size, eos_id, pad_id, special_ids,
to_dict.

CharTokenizer (the default) maps each character of the task alphabet to one id, after two
specials: PAD (id 0) and EOS (id 1). Any other name is a tiktoken BPE (gpt2.BPETokenizer, for
text tasks and bigger models): `get_tokenizer` and `from_dict` import gpt2.py only for it.

Both serialise to a plain dict (`to_dict` / `from_dict`) that lives inside every checkpoint, so a
checkpoint alone is enough to sample.

    tok = CharTokenizer("0123456789*+=")
    tok.encode("23*47=")  # -> [4, 5, 12, 6, 9, 14]
    tok = get_tokenizer("gpt2", chars)  # tiktoken's GPT-2 BPE (files fetched once, then cached)
"""


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
        ids = []
        for c in text:
            if c not in self.stoi:
                raise TokenizerError(f"character {c!r} (U+{ord(c):04X}) is not in the vocabulary {self.chars!r}")
            ids.append(self.stoi[c])
        return ids

    def decode(self, ids):
        """Specials are dropped: PAD never shows, EOS ends the text."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= len(self.specials):
                out.append(self.chars[i - len(self.specials)])
        return "".join(out)

    def to_dict(self):
        return {"kind": "char", "chars": self.chars}


def get_tokenizer(name, chars):
    """"char": one id per character of `chars`; any other name is a tiktoken encoding ("gpt2"),
    from gpt2.py (imported only then)."""
    if name == "char":
        return CharTokenizer(chars)
    from gpt2 import get_bpe
    return get_bpe(name)


def from_dict(d):
    if d.get("kind") == "char":
        return CharTokenizer(d["chars"])
    if d.get("kind") == "bpe":
        from gpt2 import bpe_from_dict
        return bpe_from_dict(d)
    raise TokenizerError(f"unknown tokenizer kind {d.get('kind')!r}")
