"""The char tokenizer (one id per character of the task alphabet, after PAD 0 and EOS 1): encode,
decode, vocab_size, eos_id, pad_id, special_ids, to_dict. `from_dict(tok.to_dict())` rebuilds it:
a checkpoint alone can sample. tiktoken BPEs (--tokenizer=gpt2): nanorl/bpe.py. final_text: what a
response says, for any of them.

    CharTokenizer("0123456789*+=").encode("23*47=")  # -> [4, 5, 12, 6, 9, 14]
"""
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

    def text_so_far(self, ids):  # a turn's text as it is sampled: one character a token
        return self.decode(ids)

    def to_dict(self):
        return {"kind": "char", "chars": self.chars}


def final_text(tok, ids, act=None):
    """The text the policy wrote after the environment's last token (act: the ids' action mask,
    None: all the policy's), EOS stripped; None if it did not end with EOS or a special token
    comes earlier (decoding would drop it: "10<pad>81"). Any tokenizer: char or BPE."""
    if not ids or ids[-1] != tok.eos_id or any(i in tok.special_ids for i in ids[:-1]):
        return None
    start = max((i + 1 for i, a in enumerate((act or ())[:len(ids)]) if not a), default=0)
    return tok.decode(ids[start:-1])


def from_dict(d):
    """The inverse of CharTokenizer.to_dict."""
    if d.get("kind") != "char":
        raise TokenizerError(f"unknown tokenizer kind {d.get('kind')!r}")
    return CharTokenizer(d["chars"])
