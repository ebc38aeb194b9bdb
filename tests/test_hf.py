"""Hugging Face GPT-2 weights in model.GPT (offline): a tiny random GPT2LMHeadModel saved with
save_pretrained loads through GPT.from_pretrained and gives the same logits."""
import sys

import pytest
import torch
import transformers

from model import GPT
from nanorl.checkpoint import CheckpointError

torch.set_num_threads(1)


def tiny_hf(tmp_path, seed=0, **kw):
    """A random 2-layer GPT-2 saved to tmp_path. Every parameter is redrawn (LayerNorm gains and
    biases too, which HF initialises to 1 and 0) so a mis-mapped or untransposed weight shows."""
    torch.manual_seed(seed)
    args = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_positions=24, bos_token_id=49, eos_token_id=49)
    args.update(kw)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**args)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    hf.save_pretrained(tmp_path)
    return hf


@pytest.mark.parametrize("activation,gelu", [("gelu_new", "tanh"), ("gelu", "erf")])
def test_hf_gpt2_logits_match(tmp_path, activation, gelu):
    """GPT-2's own tanh GELU and the exact one (activation_function "gelu") each load as theirs."""
    hf = tiny_hf(tmp_path, activation_function=activation)
    model = GPT.from_pretrained(str(tmp_path), block_size=16).eval()
    assert model.config.gelu == gelu
    assert (model.config.n_layer, model.config.n_head, model.config.n_embd, model.config.vocab_size) == (2, 2, 32, 50)
    assert model.transformer.wpe.weight.shape == (16, 32)  # cropped from n_positions=24
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    idx = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        ours = model(idx)
    assert ref.std() > 0.1  # logits of a real size, not a near-zero comparison
    assert (ours - ref).abs().max() <= 1e-5
    with torch.no_grad():  # the saved folder is what was loaded, not a fresh init
        ours2 = GPT.from_pretrained(str(tmp_path)).eval()(idx)
    assert (ours2 - ref).abs().max() <= 1e-5


def test_unsupported_variants_and_sizes_are_refused(tmp_path):
    tiny_hf(tmp_path / "relu", activation_function="relu")
    with pytest.raises(CheckpointError, match="activation_function"):
        GPT.from_pretrained(str(tmp_path / "relu"))
    tiny_hf(tmp_path / "ok")
    with pytest.raises(CheckpointError, match="block_size=32 exceeds its n_positions=24"):
        GPT.from_pretrained(str(tmp_path / "ok"), block_size=32)


def test_missing_transformers_or_weights_fail_in_one_line(monkeypatch, tmp_path):
    def offline(*a, **k):  # what transformers raises when the hub cannot be reached
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files,\nand couldn't find them.")
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", offline)
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained("gpt2")
    assert "https://huggingface.co/gpt2" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(CheckpointError, match="pip install transformers"):
        GPT.from_pretrained("gpt2")
