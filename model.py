"""
The GPT (nanoGPT-style, GPT-2 names), its KV cache, the sampler and the log-probs of samples,
and its optimizer: AdamW's parameter groups (nanoGPT's configure_optimizers) and a checked step.

`GPT.forward` returns logits at every position (B, T, V). Prompts are left-padded: `offsets`
(B,) counts each row's pads, so positions restart at its first token and pad keys are masked.
`generate` prefills each prompt once; rows sharing a prefix share its forward and cache row,
and `logprobs` (training) runs identical rows once. The optional scalar head: PPO's values or
the reward model's score. `GPT.from_pretrained`: Hugging Face GPT-2 weights (sft.py --init_from).
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

LAST = (slice(None), -1)  # GPT.forward's keep= for the heads at the last position only: [:, -1]
# Hugging Face GPT-2 stores these as Conv1D weights, (in, out): nn.Linear wants (out, in)
HF_TRANSPOSED = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # attn's and mlp's c_proj


class CheckpointError(RuntimeError):
    """A missing, corrupt, foreign or incompatible checkpoint (or pretrained weights)."""


def one_line(e, n=200):
    """An exception as one line of an error message: its class and the start of its text."""
    return f"{e.__class__.__name__}: {' '.join(str(e).split())}"[:n]


@dataclass
class GPTConfig:
    block_size: int = 32  # max sequence length (prompt + response)
    vocab_size: int = 16
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    scalar_head: bool = False  # value head (PPO) / reward head (reward model)
    gelu: str = "tanh"  # GPT-2's approximation; "erf": nanoGPT's exact nn.GELU() (sft.py --gelu)


class KVCache:
    """Each layer's keys and values so far (B, n_head, pos, head_dim), a row per distinct prefix.
    generate's: `select` keeps the rows its next step extends; training's: a prompt's, computed
    once, repeated to its rows (`expand`, not in place: autograd adds their gradients)."""

    def __init__(self):
        self.k, self.v, self.pos = [], [], 0  # pos: the number of positions so far

    def update(self, layer, k, v):
        """k, v (B, nh, T, hd) -> every key and value so far (B, nh, pos+T, hd)."""
        if layer == len(self.k):  # the first pass
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], 2)
            self.v[layer] = torch.cat([self.v[layer], v], 2)
        return self.k[layer], self.v[layer]

    def select(self, rows):
        """Keep the cache rows `rows` (U,), in that order; a row may repeat."""
        self.k, self.v = ([t.index_select(0, rows) for t in c] for c in (self.k, self.v))

    def expand(self, counts):
        """Repeat row i counts[i] times (counts (B,))."""
        self.k = [t.repeat_interleave(counts, dim=0) for t in self.k]
        self.v = [t.repeat_interleave(counts, dim=0) for t in self.v]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, cache, layer):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, nh, pos+T, hd)
        if x.device.type == "cpu" and T > 1:  # on CPU plain matmuls run short sequences
            if mask is None:  # 2-3x faster than the fused kernel (bench/README.md)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1)) * k.size(-1) ** -0.5  # (B, nh, T, L)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = F.dropout(att, self.dropout, self.training) @ v  # (B, nh, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               is_causal=mask is None and T > 1,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.approximate = {"erf": "none", "tanh": "tanh"}[cfg.gelu]  # F.gelu's names

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, mask, cache, layer):
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    full_head = False  # rl.py --full_head: the heads at every position, then keep's (not saved)

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied embeddings
        # GPT-2 init: N(0, 0.02), residual projections / sqrt(2 n_layer), zero biases
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        # scalar head: std 1/sqrt(n_embd+1) as lm-human-preferences' reward head, bias 0
        self.score_head = nn.Linear(cfg.n_embd, 1) if cfg.scalar_head else None
        if self.score_head is not None:
            nn.init.normal_(self.score_head.weight, std=1 / math.sqrt(cfg.n_embd + 1))
            nn.init.zeros_(self.score_head.bias)

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, offsets=None, cache=None, return_scalar=False, keep=None):
        """idx (B, T) -> logits (B, T, V) [, scalar head (B, T)]; offsets (B,): left-pad
        counts (None: none); cache: a KVCache to extend; keep: the heads run only at these
        positions, a (B, T) bool -> (K, V) [, (K,)] (K = keep.sum(), in row order), or LAST."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than the context window "
                             f"(block_size={self.config.block_size})")
        q_abs = torch.arange(start, start + T, device=idx.device)  # (T,) absolute positions
        padded = offsets is not None and bool(offsets.any())
        if padded or (start > 0 and T > 1):
            k_abs = torch.arange(start + T, device=idx.device)
            off = torch.zeros_like(q_abs[:1]).expand(B) if offsets is None else offsets
            mask = (k_abs <= q_abs[:, None]) & (k_abs >= off[:, None, None])  # (B, T, L)
            mask = (mask | (k_abs == q_abs[:, None]))[:, None]  # a pad query sees itself: no NaN
            pos = (q_abs - off[:, None]).clamp(min=0)  # (B, T) restart at each first token
        else:
            mask, pos = None, q_abs
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, cache, i)
        if cache is not None:
            cache.pos += T
        # full_head: the heads at every position, then keep's (the older rounding)
        x = self.transformer.ln_f(x if keep is None or self.full_head else x[keep])
        logits = self.lm_head(x)  # (B, T, V) or (K, V)
        if return_scalar:
            if self.score_head is None:
                raise ValueError("this model has no scalar head (GPTConfig.scalar_head=False)")
            score = self.score_head(x).squeeze(-1)  # (B, T) or (K,)
            late = keep is not None and self.full_head  # every position, then keep's
            return (logits[keep], score[keep]) if late else (logits, score)
        return logits[keep] if keep is not None and self.full_head else logits

    @classmethod
    def from_pretrained(cls, name_or_path, block_size=None, dropout=0.0):
        """A GPT holding Hugging Face GPT-2 weights: a hub name ("gpt2", "gpt2-medium", ...) or a
        save_pretrained folder: same names, Conv1D weights transposed, lm_head tied to wte, wpe
        cropped to block_size (default n_positions). A config departing from GPT-2's conventions
        (ours too, so the logits agree) is refused; every failure is a CheckpointError."""
        try:
            import huggingface_hub.utils.logging as hub_logging
            import transformers
        except ImportError:
            raise CheckpointError(f"init_from={name_or_path!r} needs Hugging Face transformers: "
                                  "pip install transformers") from None
        for logging in (transformers.logging, hub_logging):  # failures: one line, no retry warnings
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
        gelu = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "erf"}
        expect = {"activation_function": tuple(gelu),
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
        model = cls(GPTConfig(block_size=block_size, vocab_size=c.vocab_size, n_layer=c.n_layer,
                              n_head=c.n_head, n_embd=c.n_embd, dropout=dropout, bias=True,
                              gelu=gelu[c.activation_function]))
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


def adamw(model, lr, weight_decay, head_lr_scale=None):
    """AdamW (betas 0.9, 0.99), weight decay only on matrices (dim >= 2), not on biases and
    LayerNorm gains. With head_lr_scale the scalar head gets its own group at lr * it, no
    decay: PPO's value head starts at zero and must catch up with the returns."""
    head = set(model.score_head.parameters()) if head_lr_scale and model.score_head else set()
    params = [p for p in model.parameters() if p.requires_grad and p not in head]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if head:
        groups.append({"params": list(head), "weight_decay": 0.0, "lr_scale": head_lr_scale})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), fused=True)  # one kernel


def optimizer_step(model, opt, loss, lr, grad_clip):
    """After the caller's backward (loss: its total) and, under DDP, its sum of the gradients over
    the ranks: refuse a NaN/inf (FloatingPointError naming the tensor), clip, step at lr (times a
    group's lr_scale). Returns the gradient norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    params = [p for p in model.parameters() if p.grad is not None]
    gnorm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if not (torch.isfinite(loss) and torch.isfinite(gnorm)):  # the loss, else the first gradient
        grads = ((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
        bad = next((f"gradient of {n}" for n, g in grads if not torch.isfinite(g).all()), "")
        raise FloatingPointError(bad if torch.isfinite(loss) else f"loss ({loss.item()})")
    torch.nn.utils.clip_grads_with_norm_(params, grad_clip or math.inf, gnorm)
    opt.step()
    return gnorm


def seeded(device, *key):
    """A torch.Generator seeded by a key such as ("rollout", seed, rank, step): a stream per
    key, the same in every run, so a resumed run needs no saved RNG state."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return torch.Generator(device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def sample_next(logits, temperature, top_k, generator):
    """Next tokens (N,) from logits (N, V) -> (tokens, the fp32 log-probs (N, V) they were
    drawn from). Temperature 0 is greedy (untempered)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1), F.log_softmax(logits, dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    return torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1), logp_all


@torch.no_grad()
def generate(model, prompts, max_new_tokens, eos_id, pad_id, G=1, temperature=1.0, top_k=None,
             generator=None, use_cache=True, episodes=None, budget=math.inf):
    """G responses to each prompt (lists of token ids) -> a dict (N = len(prompts) G,
    P the longest prompt, L the longest response):
      ids            (N, P+L)  left-padded prompt, response, right padding with pad_id
      response_mask  (N, P+L)  1 on every response token up to and including EOS
      action_mask    (N, P+L)  the same less the environment's tokens
      logps          (N, L)    each sampled token's log-prob under the sampling distribution
                               (temperature 0: greedy, untempered; top-k), 0 off actions
      turn_rewards   (N, L)    with episodes: each turn's reward on its last token, else absent
      offsets, prompt_len      (N,) left-pad count of each row; P
    episodes (nanorl/episodes.py): an environment's games, one a row, and the sampler's two
    hooks: its forced tokens (counted in max_new_tokens, log-prob 0) and its turns' ends.
    budget (N,): each row's own max_new_tokens, at most max_new_tokens (nanorl/turns.py's)."""
    was_training, device = model.training, next(model.parameters()).device
    model.eval()  # no dropout in rollouts
    B, P = len(prompts), max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("empty prompt")
    if P + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt of {P} tokens + max_new_tokens={max_new_tokens} exceeds the "
                         f"context window (block_size={model.config.block_size})")
    seq = torch.tensor([[pad_id] * (P - len(p)) + p for p in prompts], device=device)  # (B, P)
    offsets = torch.tensor([P - len(p) for p in prompts], device=device)  # (B,)
    cache = KVCache() if use_cache else None
    logits = model(seq, offsets, cache, keep=LAST)  # (B, V) one prefill per prompt for G rows
    node, node_off = torch.arange(B, device=device).repeat_interleave(G), offsets  # row -> prefix
    seq, offsets = seq.repeat_interleave(G, dim=0), offsets.repeat_interleave(G, dim=0)
    done = torch.zeros(B * G, dtype=torch.bool, device=device)  # (N,) ended: EOS, budget
    toks, logps, masks, acts = [], [], [], []  # a step's (N,) each; acts: the policy's tokens
    for t in range(max_new_tokens):
        tok, logp_all = sample_next(logits[node], temperature, top_k, generator)
        act = ~done  # (N,) the policy's own tokens
        if episodes:  # a row inside an observation takes its next token instead
            tok, act = episodes.force(tok, act)
        tok = torch.where(done, pad_id, tok)  # (N,)
        toks.append(tok), masks.append(~done), acts.append(act)
        logps.append(torch.where(act, logp_all.gather(1, tok[:, None]).squeeze(1), 0.0))
        if episodes:  # a row that ended its turn: the environment answers
            episodes.end_turns(toks, act)
        done = done | (tok == eos_id) | (t + 1 >= budget)  # a row past its budget: cut
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        if cache is None:
            seq = torch.cat([seq, tok[:, None]], dim=1)
            logits, node = model(seq, offsets)[:, -1], torch.arange(B * G, device=device)
        else:
            logits, node, node_off = extend(model, cache, node, node_off, tok, done)
    model.train(was_training)
    prompt, zeros = seq[:, :P], torch.zeros_like(seq[:, :P])  # (N, P) each
    mask, act = torch.stack(masks, 1).long(), torch.stack(acts, 1).long()  # (N, L) each
    out = dict(ids=torch.cat([prompt, torch.stack(toks, 1)], 1), logps=torch.stack(logps, 1),
               response_mask=torch.cat([zeros, mask], 1), offsets=offsets, prompt_len=P,
               action_mask=torch.cat([zeros, act], 1))
    if episodes:
        out["turn_rewards"] = episodes.turn_rewards(len(toks)).to(device)
    return out


def responses(out):
    """The response ids of each row (the environment's too, EOS included, padding cut) of a
    `generate` result or of a record with its fields (ids (N, P+L), mask (N, L), length (N,))."""
    if isinstance(out, dict):
        ids, P, n = out["ids"], out["prompt_len"], out["response_mask"].sum(1)
    else:
        ids, P, n = out.ids, out.ids.size(1) - out.mask.size(1), out.length
    return [r[P:P + int(k)] for r, k in zip(ids.tolist(), n.tolist())]


def extend(model, cache, node, node_off, tok, done):
    """A cached decode step; rows with equal prefixes share a forward and a cache row ->
    (logits (U, V), each row's prefix (N,), the prefixes' offsets (U,)). E.g. one prompt, G=3,
    V=16: node [0, 0, 0], tok [5, 7, 5] -> key [5, 7, 5], U=2 (prompt 5, prompt 7), node [0, 1, 0];
    then tok [4, EOS, 9] -> key [4, -1, 9], U=2 (prompt 5 4, prompt 5 9), parent [0, 0] (both
    extend prompt 5), node [0, -1, 1] (row 1 is done)."""
    V = model.lm_head.out_features
    key = torch.where(done, -1, node * V + tok)  # (N,) prefix id, finished rows -1
    uniq, node = torch.unique(key, return_inverse=True)  # sorted: a -1 comes first
    live = uniq[uniq >= 0]  # (U,) the prefixes the next step extends
    parent, node = live // V, node - (len(uniq) - len(live))  # finished: -1, unused
    cache.select(parent)
    node_off = node_off[parent]
    return model((live % V)[:, None], node_off, cache)[:, -1], node, node_off


def token_logps(logits, labels, mask, temperature=1.0):
    """(B, T) log-probs of labels under the tempered softmax of logits (B, T, V), in fp32
    (float64 stays float64); 0 off the mask."""
    labels = torch.where(mask.bool(), labels, 0)  # (B, T) a valid id at padding
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = z.gather(-1, labels[..., None]).squeeze(-1) - z.logsumexp(-1)  # (B, T)
    return torch.where(mask.bool(), logp, 0.0)


def logprobs(model, ids, offsets, mask, temperature=1.0, scalar=False, logits=False,
             max_rows=None):
    """The one route from rows to log-probs -> (logp (N, L) of the response ids[:, P:], tempered,
    0 off mask (N, L); the scalar head (N, L) if scalar; the tempered logits (N, L, V) if
    logits), at most max_rows rows a forward (memory)."""
    N, P = ids.size(0), ids.size(1) - mask.size(1)
    if max_rows and N > max_rows:
        parts = [logprobs(model, ids[i:i + max_rows], offsets[i:i + max_rows],
                          mask[i:i + max_rows], temperature, scalar, logits)
                 for i in range(0, N, max_rows)]
        return tuple(None if p[0] is None else torch.cat(p) for p in zip(*parts))
    out = response_forward(model, ids, offsets, P, mask, return_scalar=scalar)
    z, head = out if scalar else (out, None)
    logp = token_logps(z, ids[:, P:], mask, temperature)  # (N, L)
    return logp, head, (z / temperature if logits else None)


def response_forward(model, ids, offsets, P, used, return_scalar=False):
    """model(ids, offsets)[:, P-1:-1]: the logits (N, L, V) scoring each response token of ids
    (N, P+L) [and the scalar head (N, L)]. Each distinct row runs once (a peaked policy repeats
    itself), each prompt once, its keys and values expanded to its rows (KVCache.expand); outputs
    are indexed back to all rows, so gradients add. used (N, L): the heads run only where some
    row reads them (0 elsewhere)."""
    rows = torch.cat([offsets[:, None], ids], 1)  # (N, 1+P+L): a row's padding and tokens
    uniq, inv = torch.unique(rows, dim=0, return_inverse=True)  # sorted: a prompt's rows adjacent
    counts = torch.unique_consecutive(uniq[:, :1 + P], dim=0, return_counts=True)[1]  # (n,)
    off, uniq = uniq[:, 0], uniq[:, 1:]  # (U,), (U, P+L)
    cache, starts = KVCache(), counts.cumsum(0) - counts
    heads = model(uniq[starts, :P], off[starts], cache, return_scalar, keep=LAST)  # (n, V) [, (n,)]
    heads = heads if return_scalar else (heads,)
    parts = [[t.repeat_interleave(counts, dim=0)[:, None]] for t in heads]  # position P-1
    if ids.size(1) > P + 1:
        cache.expand(counts)
        keep = uniq.new_zeros(uniq[:, P + 1:].shape).index_add_(0, inv, used[:, 1:].to(uniq)) > 0
        rest = model(uniq[:, P:-1], off, cache, return_scalar, keep=keep)  # (K, V) [, (K,)]
        for part, t in zip(parts, rest if return_scalar else (rest,)):
            part.append(t.new_zeros(*keep.shape, *t.shape[1:]).index_put((keep,), t))
    out = tuple(torch.cat(part, dim=1)[inv] for part in parts)
    return out if return_scalar else out[0]
