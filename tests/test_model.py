"""GPT, KV cache, sampler and checkpoints: equivalences and contracts."""
import os
import pickle

import pytest
import torch

from model import token_logps
from nanorl.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint
from model import GPT, GPTConfig, generate
from tokenizer import CharTokenizer
from model import adamw

torch.set_num_threads(1)
EOS, PAD = 1, 0


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(block_size=24, vocab_size=16, n_layer=2, n_head=2, n_embd=32)
    args.update(kw)
    return GPT(GPTConfig(**args)).eval()


def prompts_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 16, (n,), generator=g).tolist() for n in lengths]


def test_forward_shape_and_causality():
    model = tiny()
    idx = torch.randint(2, 16, (3, 10))
    logits = model(idx)
    assert logits.shape == (3, 10, 16)  # every position, not only the last
    edited = idx.clone()
    edited[:, 6] = (edited[:, 6] + 1) % 14 + 2  # change token 6
    logits2 = model(edited)
    assert torch.allclose(logits[:, :6], logits2[:, :6], atol=1e-6)  # positions <= 5 don't see token 6
    assert not torch.allclose(logits[:, 6:], logits2[:, 6:], atol=1e-4)


def test_left_padding_matches_unpadded_rows():
    model = tiny()
    prompts = prompts_of([3, 7, 5])
    P = 7
    ids = torch.tensor([[PAD] * (P - len(p)) + p for p in prompts])
    offsets = torch.tensor([P - len(p) for p in prompts])
    logits = model(ids, offsets)
    for i, p in enumerate(prompts):
        alone = model(torch.tensor([p]))[0]
        assert torch.allclose(logits[i, P - len(p):], alone, atol=1e-5)
    assert torch.isfinite(logits).all()  # pad queries attend to themselves: no NaN rows


@pytest.mark.parametrize("lengths", [[5, 5, 5], [3, 6, 4]])
def test_cached_equals_uncached(lengths):
    model = tiny()
    prompts = prompts_of(lengths)
    kw = dict(max_new_tokens=10, eos_id=EOS, pad_id=PAD, G=3, temperature=0)
    a = generate(model, prompts, use_cache=True, **kw)
    b = generate(model, prompts, use_cache=False, **kw)
    assert torch.equal(a["ids"], b["ids"])  # identical greedy outputs
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.allclose(a["logps"], b["logps"], atol=1e-5)
    # sampled: same generator seed -> same tokens, log-probs within 1e-5
    kw.update(temperature=0.8, top_k=10)
    a = generate(model, prompts, use_cache=True, generator=torch.Generator().manual_seed(3), **kw)
    b = generate(model, prompts, use_cache=False, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a["ids"], b["ids"])
    assert torch.allclose(a["logps"], b["logps"], atol=1e-5)


def test_rows_sharing_a_prefix_share_one_forward():
    """A peaked policy repeats itself: rows whose prefixes are equal share one forward and one cache row
    per step. The same tokens and log-probs as the uncached sampler (every row in full), and each
    decode step ran exactly the distinct live prefixes."""
    model = tiny()
    with torch.no_grad():  # peaked: many of a prompt's samples agree, and some stop early
        model.lm_head.weight *= 10
        model.lm_head.weight[EOS] *= 4
    kw = dict(max_new_tokens=10, eos_id=EOS, pad_id=PAD, G=8, temperature=1.0)
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.size(0)))
    a = generate(model, prompts_of([3, 6, 4]), generator=torch.Generator().manual_seed(3), **kw)
    hook.remove()
    b = generate(model, prompts_of([3, 6, 4]), use_cache=False, generator=torch.Generator().manual_seed(3),
                 **kw)
    assert torch.equal(a["ids"], b["ids"]) and torch.allclose(a["logps"], b["logps"], atol=1e-5)
    ids, mask, P = a["ids"], a["response_mask"], a["prompt_len"]
    assert len(torch.unique(ids, dim=0)) == 16 and rows[0] == 3  # 24 rows; one prefill per prompt
    assert 1 in mask.sum(1) and 10 in mask.sum(1)  # finished rows leave the batch
    for k, n in enumerate(rows[1:], start=1):  # step k extends the rows that sample a token k
        assert n == len(torch.unique(ids[mask[:, P + k].bool(), :P + k], dim=0)) < 24


def test_cached_logits_match_full_forward():
    """The logits the cache produces at every decode step equal a fresh full forward's."""
    from model import KVCache
    model = tiny()
    seq = torch.randint(2, 16, (2, 12))
    full = model(seq)
    cache = KVCache()
    steps = [model(seq[:, :5], cache=cache)]
    for t in range(5, 12):
        steps.append(model(seq[:, t:t + 1], cache=cache))
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logps_equal_trainer_logps(temperature):
    model = tiny()
    prompts = prompts_of([4, 6, 5])
    out = generate(model, prompts, 12, EOS, PAD, G=4, temperature=temperature,
                   generator=torch.Generator().manual_seed(0))
    logits, P = model(out["ids"], out["offsets"]), out["prompt_len"]
    mask = out["response_mask"][:, P:]  # (N, L) the response
    logp = token_logps(logits[:, P - 1:-1], out["ids"][:, P:], mask, temperature)  # position t scores t+1
    assert (logp - out["logps"]).abs().max() <= 1e-5
    from model import logprobs  # the trainer's one route gives the same
    assert (logprobs(model, out["ids"], out["offsets"], mask, temperature)[0] - out["logps"]).abs().max() <= 1e-5


@pytest.mark.parametrize("pad_id", [PAD, EOS])  # also when PAD == EOS (failure mode 1)
def test_eos_is_inside_the_response_mask(pad_id):
    model = tiny()
    with torch.no_grad():  # make EOS the likeliest token after a couple of steps
        model.lm_head.weight[EOS] *= 0
    torch.manual_seed(1)
    out = generate(model, prompts_of([4, 4]), 10, EOS, pad_id, G=4, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    P = out["prompt_len"]
    resp, m = out["ids"][:, P:], out["response_mask"][:, P:]
    n_eos = 0
    for r, mm in zip(resp.tolist(), m.tolist()):
        n = sum(mm)
        assert mm == [1] * n + [0] * (len(mm) - n)  # contiguous from the first response token
        if EOS in r[:n]:
            assert r[:n].index(EOS) == n - 1  # EOS is the last masked token, inside the mask
            n_eos += 1
    assert n_eos > 0
    assert (out["response_mask"][:, :P] == 0).all()  # never the prompt


def test_greedy_stops_per_row_and_max_new_tokens():
    model = tiny()
    out = generate(model, prompts_of([3, 3]), 5, eos_id=EOS, pad_id=PAD, temperature=0)
    assert out["ids"].shape[1] <= 3 + 5
    with pytest.raises(ValueError, match="context window"):
        generate(model, prompts_of([20]), 5, EOS, PAD)


def test_scalar_head_shape():
    model = tiny(scalar_head=True)
    logits, values = model(torch.randint(2, 16, (3, 7)), return_scalar=True)
    assert logits.shape == (3, 7, 16) and values.shape == (3, 7)
    with pytest.raises(ValueError, match="no scalar head"):
        tiny()(torch.randint(2, 16, (1, 3)), return_scalar=True)


def test_checkpoint_round_trip(tmp_path):
    model = tiny()
    tok = CharTokenizer("0123456789+*=-")
    opt = adamw(model, 1e-3, 0.1)
    model(torch.randint(2, 16, (2, 5))).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(str(path), model, opt, {"lr": 1e-3, "note": None}, 7, tok,
                    rng={"torch": torch.get_rng_state()})
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]  # temp file renamed away
    raw = torch.load(path, weights_only=True)  # plain dicts/lists/tensors only
    assert raw["step"] == 7 and raw["config"]["lr"] == 1e-3
    model2, tok2 = model_from_checkpoint(load_checkpoint(str(path)))
    x = torch.randint(2, 16, (2, 6))
    assert torch.equal(model(x), model2.eval()(x))
    assert tok2.encode("12*3=") == tok.encode("12*3=")
    opt2 = adamw(model2, 1e-3, 0.1)
    opt2.load_state_dict(raw["optimizer"])


def test_bad_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(str(tmp_path / "nope.pt"))
    model = tiny()
    good = tmp_path / "good.pt"
    save_checkpoint(str(good), model, None, {}, 0, CharTokenizer("0123456789+*=-"))
    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(good.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="trunc.pt: not a readable"):
        load_checkpoint(str(trunc))

    class Evil:  # a pickle that would run code on load
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"model": Evil()}, protocol=2))
    with pytest.raises(CheckpointError, match="evil.pt: not a readable"):
        load_checkpoint(str(evil))
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="missing model"):
        load_checkpoint(str(other))
    # a checkpoint whose tokenizer does not match its model
    ck = load_checkpoint(str(good))
    ck["tokenizer"] = {"kind": "char", "chars": "0123"}
    with pytest.raises(CheckpointError, match="tokenizer has 6 tokens but the model 16"):
        model_from_checkpoint(ck)
    ck = load_checkpoint(str(good))  # a GELU model.py does not know
    ck["model_args"]["gelu"] = "relu"
    with pytest.raises(CheckpointError, match="good.pt: incompatible checkpoint.*relu"):
        model_from_checkpoint(ck, str(good))


@pytest.mark.parametrize("scalar", [False, True])
def test_grouped_forward_equals_the_full_forward(scalar):
    """response_forward runs each distinct row once and each prompt once, its keys/values serving its
    rows (as in sampling), in any row order; equal tokens with other padding are another row. Same
    logits, value-head outputs and gradients as the full forward of every row, duplicates included,
    and the same log-probs as the sampler."""
    from model import response_forward
    model = tiny(scalar_head=scalar)
    out = generate(model, prompts_of([3, 6, 4]), 8, EOS, PAD, G=4, generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([5, 0, 9, 0, 1, 5, 11, 2, 3, 4, 6, 7, 8, 10, 0])  # shuffled, 0 and 5 repeated
    ids, off, P = out["ids"][rows], out["offsets"][rows], out["prompt_len"]
    k = int(torch.nonzero(off)[0])  # a padded row again, its pads read as tokens: another row
    ids, off = torch.cat([ids, ids[k:k + 1]]), torch.cat([off, off.new_zeros(1)])
    res = {}
    for name in ("full", "grouped"):
        model.zero_grad(set_to_none=True)
        if name == "full":
            o = model(ids, off, return_scalar=scalar)
            o = tuple(t[:, P - 1:-1] for t in (o if scalar else (o,)))
        else:
            o = response_forward(model, ids, off, P, torch.ones_like(ids[:, P:]), return_scalar=scalar)
            o = o if scalar else (o,)
        sum((t.float() ** 2).sum() for t in o).backward()
        res[name] = o, [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert res["full"][0][0].shape == (16, ids.size(1) - P, 16)
    for a, b in zip(res["full"][0], res["grouped"][0]):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(res["full"][1], res["grouped"][1]):  # float sums in another order: relative to the size
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()
    logits = res["grouped"][0][0][:15]
    logp = token_logps(logits, ids[:15, P:], out["response_mask"][rows, P:])
    assert (logp - out["logps"][rows]).abs().max() <= 1e-6


def test_equal_prompt_tokens_under_other_padding_are_other_prompts():
    """Three rows that sort next to each other: A reads its leading PAD as a token (offset 0), B has A's
    very tokens read as padding (offset 1), C shares B's prompt with another response. Keyed without
    the padding, B would reuse A's row and C A's prompt keys; each must score as its own full forward."""
    from model import response_forward
    model = tiny()
    tail = torch.tensor([PAD, 5, 7, 3, 9, 2])  # a prompt of 3 (its first id PAD), a response of 3
    ids = torch.stack([tail, tail, torch.tensor([PAD, 5, 7, 3, 4, 2])])
    off = torch.tensor([0, 1, 1])
    full = model(ids, off)[:, 2:-1]
    assert not torch.allclose(full[0], full[1], atol=1e-3)  # the padding changes the logits
    assert torch.allclose(response_forward(model, ids, off, 3, torch.ones(3, 3)), full, atol=1e-6)


def test_the_gelu_is_tanh_unless_asked_and_older_checkpoints_keep_it(tmp_path):
    """GPTConfig's GELU is GPT-2's tanh, gelu="erf" nanoGPT's exact nn.GELU(); a checkpoint written
    before model_args named its GELU was trained with tanh and loads with it, its logits tanh's."""
    x = torch.randn(3, 5, 32)
    for gelu, exact in ((None, torch.nn.GELU("tanh")), ("erf", torch.nn.GELU())):
        mlp = (tiny() if gelu is None else tiny(gelu=gelu)).transformer.h[0].mlp
        assert torch.equal(mlp(x), mlp.c_proj(exact(mlp.c_fc(x))))
    assert not torch.allclose(torch.nn.GELU()(x), torch.nn.GELU("tanh")(x), atol=1e-7)
    old = tiny(gelu="tanh")
    tok = CharTokenizer("0123456789+*=-")  # 16 ids with PAD and EOS
    save_checkpoint(str(tmp_path / "old.pt"), old, tokenizer=tok)
    ck = load_checkpoint(str(tmp_path / "old.pt"))
    del ck["model_args"]["gelu"]  # as an older nanorl wrote it
    loaded = model_from_checkpoint(ck)[0].eval()
    idx = torch.randint(2, 16, (2, 7), generator=torch.Generator().manual_seed(0))
    assert loaded.config.gelu == "tanh" and torch.equal(loaded(idx), old(idx))
    with pytest.raises(KeyError, match="relu"):
        tiny(gelu="relu")


@pytest.mark.parametrize("scalar", [False, True])
def test_the_heads_run_only_where_read(scalar):
    """logprobs runs the LM head (and the scalar head) only at the positions its mask reads: the
    log-probs, values and every gradient equal full_head's (every position, then those read), on
    ragged prompts and responses of 1 token to the longest, rows sharing prompts and duplicates."""
    from model import logprobs
    model = tiny(scalar_head=scalar)
    out = generate(model, prompts_of([3, 6, 4, 1]), 8, EOS, PAD, G=4, generator=torch.Generator().manual_seed(1))
    P, mask = out["prompt_len"], out["response_mask"][:, out["prompt_len"]:].clone()
    mask[0, 1:], mask[1] = 0, 1  # a 1-token response; a row read to the end
    mask[2, 2] = 0  # a hole: an environment's token
    seen, forward = [], model.forward
    model.forward = lambda *a, **k: seen.append(k.get("keep", a[4] if len(a) > 4 else None)) or forward(*a, **k)
    res = {}
    for full in (True, False):
        model.full_head, seen[:] = full, []
        model.zero_grad(set_to_none=True)
        lp, head, logits = logprobs(model, out["ids"], out["offsets"], mask, 0.7, scalar, logits=True)
        (lp.sum() + (head.sum() if scalar else 0)).backward()
        assert logits.shape == (16, mask.size(1), 16)
        res[full] = [lp, head] if scalar else [lp], [p.grad.clone() for p in model.parameters()], seen[:]
    assert all(k is not None for k in res[False][2])  # every forward was given its positions
    assert int(res[False][2][-1].sum()) < res[False][2][-1].numel()  # and some were skipped
    for a, b in zip(res[True][0], res[False][0]):
        assert (a - b).abs().max() <= 1e-6 and (a != 0).any()
    for a, b in zip(res[True][1], res[False][1]):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()
    with torch.no_grad():  # and both equal the plain forward of every row, its heads everywhere
        plain = forward(out["ids"], out["offsets"], return_scalar=scalar)
        plain = tuple(t[:, P - 1:-1] for t in (plain if scalar else (plain,)))
    assert (token_logps(plain[0], out["ids"][:, P:], mask, 0.7) - res[False][0][0]).abs().max() <= 1e-6
    if scalar:
        assert (torch.where(mask.bool(), plain[1], 0.0) - res[False][0][1]).abs().max() <= 1e-6
