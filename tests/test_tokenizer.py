"""Char and BPE tokenizers: round trips, unknown characters, serialisation (tiktoken offline)."""
import os
import socket
import subprocess
import sys

import pytest
import tiktoken

from nanorl import bpe
from nanorl.bpe import BPETokenizer
from tokenizer import CharTokenizer, TokenizerError, from_dict


@pytest.mark.parametrize("text", ["23*47=1081", "999+1=1000", "", "0-0="])
def test_char_round_trip(text):
    tok = CharTokenizer("0123456789+*=-")
    ids = tok.encode(text)
    assert len(ids) == len(text) and all(i >= 2 for i in ids)  # specials never produced by text
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id] + ids) == text  # EOS ends the text
    assert from_dict(tok.to_dict()).encode(text) == ids


@pytest.mark.parametrize("bad", ["23x47=", "2 3", "١٢", "\n"])
def test_char_unknown_character_is_named(bad):
    tok = CharTokenizer("0123456789+*=-")
    with pytest.raises(TokenizerError, match="is not in the vocabulary") as e:
        tok.encode(bad)
    assert repr(next(c for c in bad if c not in tok.chars)) in str(e.value)


def toy_encoding():
    """A tiny BPE built in the test: bytes 0..255 plus three merges, and an end-of-text special."""
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ti"] = 256
    ranks[b"me"] = 257
    ranks[b"mes"] = 258
    return tiktoken.Encoding("toy", pat_str=r"\d| ?[a-zA-Z]+| ?[^\sa-zA-Z\d]+|\s+",
                             mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 259})


def test_bpe_round_trip_and_serialisation():
    tok = BPETokenizer(toy_encoding())
    text = "What is 23 times 47?"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert 256 in ids and 258 in ids  # the merges were used
    assert tok.eos_id == tok.pad_id == 259 and tok.vocab_size == 260
    assert tok.decode(ids + [tok.eos_id, 5]) == text
    assert tok.encode("<|endoftext|>") != [259]  # special text in data is not the EOS token
    tok2 = bpe.from_dict(tok.to_dict())
    assert tok2.encode(text) == ids and tok2.vocab_size == tok.vocab_size


def test_unknown_tokenizer_kind():
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        from_dict({"kind": "sentencepiece"})


def test_offline_gpt2_encoding_names_the_file_it_could_not_fetch(monkeypatch, tmp_path):
    """No network (name resolution fails inside requests) and an empty cache: one line with the URL."""
    def no_dns(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    with pytest.raises(TokenizerError) as e:
        bpe.load("gpt2")
    msg = str(e.value)
    assert msg.startswith("could not fetch https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/")
    assert "'gpt2'" in msg and "TIKTOKEN_CACHE_DIR" in msg and "\n" not in msg
    with pytest.raises(TokenizerError, match="could not load the tiktoken encoding 'no-such-bpe'"):
        bpe.load("no-such-bpe")


def test_a_char_run_never_imports_gpt2_or_tiktoken():
    """The RL path with the char tokenizer (a checkpoint's dict too) leaves the GPT-2 extras out."""
    code = ("import sys, rl, tokenizer; from data.tasks import load_split; "
            "load_split('mul', 'val'); "
            "tokenizer.from_dict(tokenizer.CharTokenizer('01').to_dict()); "
            "print(sorted(m for m in ('gpt2', 'tiktoken', 'transformers') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
