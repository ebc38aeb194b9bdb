"""A tiktoken BPE behind tokenizer.py's interface, for --tokenizer=gpt2 (a registered encoding),
--tokenizer=bpe:N (a byte-level BPE of N tokens learned here from the task's text) and checkpoints
whose tokenizer has kind "bpe"; tiktoken is imported only then.

    tok = bpe.load("gpt2")  # GPT-2's (fetched once, then cached); from_dict(tok.to_dict()) too
    tok = bpe.learn("User: 1-100:\n\nAssistant: 50 ...", 300)  # merges of the pairs seen most
"""
import codecs
import re
from collections import Counter

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

    def text_so_far(self, ids):
        """The text of ids as they are sampled: an incomplete UTF-8 character at the end held back
        (its next token may complete it), invalid bytes elsewhere replaced."""
        return codecs.getincrementaldecoder("utf-8")("replace").decode(self.enc.decode_bytes(ids))

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


# GPT-2's pre-tokenizer, each digit a piece of its own (as LLaMA's splits numbers: a number's
# tokens are its digits, and 73 and 74 share one): merges never cross letters, digits, marks, spaces
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def learn(text, vocab_size, name="task"):
    """A byte-level BPE learned from text: the 256 bytes, then the merge of the adjacent pair seen
    most often within PATTERN's pieces (ties: the smaller pair), until vocab_size tokens with EOS
    or no pair is left."""
    import regex  # tiktoken's own dependency: PATTERN's \p{L} classes
    import tiktoken
    pieces = Counter(tuple(bytes([b]) for b in p.encode()) for p in regex.findall(PATTERN, text))
    ranks = {bytes([b]): b for b in range(256)}
    while len(ranks) < vocab_size - 1:
        pairs = Counter()
        for piece, n in pieces.items():
            for pair in zip(piece, piece[1:]):
                pairs[pair] += n
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        ranks[a + b] = len(ranks)
        pieces = Counter({merge(piece, a, b): n for piece, n in pieces.items()})
    return BPETokenizer(tiktoken.Encoding(name, pat_str=PATTERN, mergeable_ranks=ranks,
                                          special_tokens={"<|endoftext|>": len(ranks)}))


def merge(piece, a, b):
    """piece (a tuple of tokens' bytes) with every adjacent (a, b) joined, left to right."""
    out, i = [], 0
    while i < len(piece):
        if piece[i:i + 2] == (a, b):
            out.append(a + b)
            i += 2
        else:
            out.append(piece[i])
            i += 1
    return tuple(out)


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
