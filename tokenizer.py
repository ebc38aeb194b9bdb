"""
Tokenizers behind one small interface: encode, decode, vocab_size, eos_id, pad_id, special_ids,
to_dict.

CharTokenizer (the default) maps each character of the task alphabet to one id, after two
specials: PAD (id 0) and EOS (id 1). BPETokenizer wraps a tiktoken Encoding (e.g. "gpt2") for
text tasks and bigger models; its PAD is its EOS (masks never come from `ids != pad_id`).

Both serialise to a plain dict (`to_dict` / `from_dict`) that lives inside every checkpoint, so a
checkpoint alone is enough to sample.

    tok = CharTokenizer("0123456789*+=")
    tok.encode("23*47=")  # -> [4, 5, 12, 6, 9, 14]
    tok = get_tokenizer("gpt2", chars)  # tiktoken's GPT-2 BPE (its files are fetched once, then cached)
"""
import re


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
        except Exception:  # a custom Encoding: store its tables as plain lists (weights_only-safe)
            ranks = self.enc._mergeable_ranks
            d["pat_str"] = self.enc._pat_str
            d["ranks"] = [[tok.hex(), r] for tok, r in sorted(ranks.items(), key=lambda kv: kv[1])]
            d["special_tokens"] = dict(self.enc._special_tokens)
            return d


def get_tokenizer(name, chars):
    """"char": one id per character of `chars`; any other name is a tiktoken encoding ("gpt2")."""
    return CharTokenizer(chars) if name == "char" else get_bpe(name)


def get_bpe(name):
    """A registered tiktoken encoding; when its BPE files cannot be fetched, one line naming the file."""
    import tiktoken
    try:
        return BPETokenizer(tiktoken.get_encoding(name))
    except Exception as e:
        text = " ".join(str(e).split())
        # tiktoken's and requests' messages name the file: "... for url: https://...", or "host='H' ... url: /path"
        m = re.search(r"https?://[^\s'\"()]+", text)
        url = m.group() if m else None
        if url is None and (m := re.search(r"host='([^']+)'.*?url: (/[^\s'\"()]+)", text)):
            url = f"https://{m.group(1)}{m.group(2)}"
        if url:
            raise TokenizerError(f"could not fetch {url}, a BPE file of the tiktoken encoding {name!r} (no network? "
                                 f"put tiktoken's cached copy in TIKTOKEN_CACHE_DIR): {e.__class__.__name__}") from None
        raise TokenizerError(f"could not load the tiktoken encoding {name!r}: {e.__class__.__name__}: {text[:200]}") from None


def from_dict(d):
    if d.get("kind") == "char":
        return CharTokenizer(d["chars"])
    if d.get("kind") == "bpe":
        if "ranks" not in d:
            return get_bpe(d["name"])
        import tiktoken
        ranks = {bytes.fromhex(h): r for h, r in d["ranks"]}
        return BPETokenizer(tiktoken.Encoding(d["name"], pat_str=d["pat_str"], mergeable_ranks=ranks,
                                              special_tokens=d["special_tokens"]))
    raise TokenizerError(f"unknown tokenizer kind {d.get('kind')!r}")
