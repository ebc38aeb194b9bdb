"""
Supervised fine-tuning (here: training from scratch) of the GPT on an arithmetic task: cross-entropy
on the answer + EOS tokens (--loss_on=all: every token) over their count. Evals: greedy accuracy on
val (val/accuracy, picks best.pt) and test (eval/accuracy), sampled eval/pass@1 and eval/pass@8.
The loop, its settings (lr, evals, checkpoints, --resume): nanorl/loop.py.

    python sft.py configs/mul.py                            # -> out/sft-mul/ckpt.pt
    python sft.py --task=path/to/folder --verifier=text     # your own data: docs/guides.md
    python sft.py configs/gpt2_mul.py --init_from=gpt2      # GPT-2 BPE and OpenAI's weights
"""
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch
import torch.nn.functional as F

from data.tasks import TASKS, labelled
from model import GPT, GPTConfig, adamw, seeded
from nanorl.config import UserError, run_cli
from nanorl.ddp import all_reduce, bf16_default
from nanorl.evaluate import Task, env_of, evaluate, task_alphabet, task_splits, verifier_of
from nanorl import bpe, loop, templates
from nanorl.loop import TrainConfig, start
from nanorl.rows import encode_prompts, pack
from tokenizer import CharTokenizer


@dataclass
class Config(TrainConfig):
    task: str = "mul"  # a name in data.tasks.TASKS, env:NAME, rg:NAME, or a folder (docs/guides.md)
    verifier: str = ""  # a name in verify.VERIFIERS, the reward in evals and rl.py; "" = exact
    rg: dict = field(default_factory=dict)  # an rg: task's generator config, e.g. dict(max_terms=3)
    reverse: Optional[bool] = None  # numbers least-significant digit first: 23*47 read as 32*74;
    # None: the task's, true for data.tasks.TASKS, false for a folder, rg: and env: (as written)
    tokenizer: str = "char"  # "char" (the task alphabet), a tiktoken encoding, e.g. "gpt2", or
    # "bpe:N": a byte-level BPE of at most N tokens learned from the train rows (nanorl/bpe.py)
    template: str = "plain"  # an environment's episodes as text: plain, role_colon, chat:PATH
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 32
    dropout: float = 0.0
    gelu: str = "tanh"  # a fresh model's GELU, or "erf": nanoGPT's exact one, faster on CPU,
    # not the default for what it does to the demo (bench/README.md); GPT-2 weights keep theirs
    init_from: str = "scratch"  # or GPT-2 weights: "gpt2", "gpt2-medium", ... or a local folder
    micro_batch_size: int = 0  # rows per forward/backward, gradients accumulated; 0 = batch_size
    bf16: Optional[bool] = None  # bf16 autocast (fp32 weights and loss); None: if native
    compile: bool = False  # torch.compile the training forward (checkpoints hold the plain model)
    loss_on: str = "response"  # "response" (answer + EOS) or "all" tokens
    n_train: int = 0  # scarce labels: only the first n_train of a seeded shuffle of train; 0 = all
    eval_samples: int = 8  # samples per test problem for pass@1 / pass@8 (fewer: pass@n; 0: none)
    eval_temperature: float = 1.0  # the RL sampling temperature
    max_new_tokens: int = 8
    val_interval: int = 50  # with target_val_accuracy: a val eval this often
    target_val_accuracy: Optional[float] = None  # stop once best.pt's val accuracy reaches this


def accumulate_grads(model, x, y, mask, micro_batch_size, bf16=False, n_tok=None):
    """Forward and backward of x, y, mask (N, T) in micro-batches of at most micro_batch_size rows:
        loss = sum over the target tokens of -log p(y_t) / n_tok
    n_tok: the whole batch's target tokens (every rank's under DDP; default this batch's), so the
    accumulated gradients are the full batch's. Returns the loss (detached)."""
    n_tok, total = (mask.sum() if n_tok is None else n_tok), torch.zeros((), device=x.device)
    for i in range(0, len(x), micro_batch_size):
        rows = slice(i, i + micro_batch_size)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x[rows])  # (b, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), y[rows].flatten(), reduction="none")
        loss = (nll * mask[rows].flatten()).sum() / n_tok
        loss.backward()
        total += loss.detach()
    return total


def encode_split(rows, pad_id, loss_on):
    """Task.gold_rows -> inputs x, targets y (N, T) and the loss mask on y (N, T): 1 on answer +
    EOS (loss_on="response"; EOS is a target: stopping gets a gradient) or on every token; 0 on
    an environment's tokens (its demonstrations' observations: nanorl/episodes.py)."""
    if loss_on == "all":
        rows = [([], p + r, [1] * len(p) + (m[0] if m else [1] * len(r))) for p, r, *m in rows]
    ids, _, mask = pack(rows, pad_id)
    return ids[:, :-1], ids[:, 1:], mask[:, 1:]


def load_task(cfg):
    """cfg's task -> (Task, its splits' sizes, the train split's gold rows: an environment's
    demonstrations are played once), or one line for a setting that does not fit it: block_size
    must hold the longest prompt and max_new_tokens, which must hold every answer."""
    if TASKS.get(cfg.task, {}).get("text") and cfg.tokenizer == "char":
        raise UserError(f"task {cfg.task!r} is asked in words: it needs a BPE tokenizer "
                        "(--tokenizer=gpt2)")
    env_module, gym = env_of(cfg.task), cfg.task.startswith("rg:")  # its envs/ module, or None
    if cfg.verifier and (env_module or gym) or cfg.rg and not gym:
        raise UserError(f"task {cfg.task!r} takes no --{'verifier' if cfg.verifier else 'rg'} "
                        "(an environment or an rg: task scores its own answers)")
    if cfg.template != "plain" and not env_module:
        raise UserError(f"--template writes an environment's episodes; task {cfg.task!r} has none")
    templates.of(cfg.template)  # an unknown one, or a chat template that rewrites history: refused
    verifier_of(cfg.verifier or "exact")
    data, scorer = task_splits(cfg.task, cfg.rg)  # generated on first use
    chars = task_alphabet(cfg.task, sum(data.values(), []))
    task = Task(CharTokenizer(chars) if cfg.tokenizer == "char" else None, cfg.task, cfg.reverse,
                cfg.verifier or "exact", cfg.n_train, data["train"], data["val"], data["test"],
                env_module=env_module, rg=cfg.rg, scorer=scorer, template=cfg.template)
    if cfg.tokenizer.startswith("bpe:"):  # learned from what SFT trains on
        task.tok = bpe.learn(train_text(task), bpe_size(cfg.tokenizer))
    elif cfg.tokenizer != "char":
        task.tok = bpe.load(cfg.tokenizer)  # tiktoken's
    if cfg.n_train > len(data["train"]):
        raise UserError(f"n_train={cfg.n_train} but the train split holds {len(data['train'])} "
                        "problems")
    task.check_data()
    task.train = labelled(task.train, cfg.n_train)  # rl.py's sft row reads n_train too
    prompts = [p for split in (task.train, task.val, task.test) for p, _ in split]
    prompt = max(map(len, encode_prompts(task.tok, prompts, cfg.reverse)))
    rows = task.gold_rows(task.train)
    answer = max(len(r) for _, r, *_ in rows)
    if answer > cfg.max_new_tokens:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens} cuts {cfg.task}'s longest answer "
                        f"({answer} tokens with EOS): set --max_new_tokens={answer}")
    if prompt + cfg.max_new_tokens > cfg.block_size:
        raise UserError(f"block_size={cfg.block_size} does not fit {cfg.task}'s longest prompt "
                        f"({prompt} tokens) and max_new_tokens={cfg.max_new_tokens}: set "
                        f"--block_size={prompt + cfg.max_new_tokens}")
    return task, {k: len(v) for k, v in data.items()}, rows


def bpe_size(name):
    """"bpe:N" -> N, the most tokens a learned BPE may have (the 256 bytes and EOS at least)."""
    n = name[4:]
    if not n.isdigit() or int(n) < 257:
        raise UserError(f"tokenizer {name!r}: write bpe:N with N >= 257 (the 256 bytes and EOS)")
    return int(n)


def train_text(task, n=2000):
    """The first n train rows as the model reads them (the prompt, then the answer or the
    demonstration): a BPE learns its merges from them, written through the 256 bytes' tokenizer."""
    plain = replace(task, tok=bpe.learn("", 0))
    plain.check_data()  # an environment's prompts as its template writes them
    return "\n".join(plain.tok.decode(p + r) for p, r, *_ in plain.gold_rows(plain.train[:n]))


def build_model(cfg, tok):
    """A fresh GPT of the config's shape, or Hugging Face GPT-2 weights (--init_from)."""
    if cfg.init_from == "scratch":
        shape = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout,
                     gelu=cfg.gelu)
        return GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=cfg.block_size, **shape))
    model = GPT.from_pretrained(cfg.init_from, cfg.block_size, cfg.dropout)
    if model.config.vocab_size != tok.vocab_size:
        raise UserError(f"init_from={cfg.init_from!r} has {model.config.vocab_size} tokens, the "
                        f"tokenizer {cfg.tokenizer!r} {tok.vocab_size}: use the model's own "
                        "(--tokenizer=gpt2)")
    return model


def main(cfg):
    if cfg.reverse is None:  # resolved once: the checkpoint stores it, later stages read that
        cfg = replace(cfg, reverse=cfg.task in TASKS)  # arithmetic only: digits align reversed
    shape = ("n_layer", "n_head", "n_embd", "block_size", "max_new_tokens")
    dev, rank, world = start(cfg, positive=("batch_size", "val_interval", "log_interval") + shape,
                             non_negative=("eval_samples", "micro_batch_size", "n_train"))
    if not 0 <= cfg.dropout < 1:
        raise UserError(f"dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.loss_on not in ("response", "all"):
        raise UserError(f"loss_on must be 'response' or 'all', got {cfg.loss_on!r}")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"n_embd={cfg.n_embd} must be divisible by n_head={cfg.n_head}")
    task, sizes, rows = load_task(cfg)
    data = [t.to(dev) for t in encode_split(rows, task.tok.pad_id, cfg.loss_on)]  # (N, T) each
    model = build_model(cfg, task.tok).to(dev)
    bf16 = cfg.bf16 if cfg.bf16 is not None else bf16_default(dev)
    if rank == 0:
        print(f"{cfg.task}: {' / '.join(f'{v} {k}' for k, v in sizes.items())} problems; "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters on {dev}, "
              f"bf16 autocast {bf16}, compile {cfg.compile}, {world} rank(s)", flush=True)
    train(cfg, model, task, data, bf16, dev, rank, world)
    return model


def train(cfg, model, task, data, bf16, dev, rank, world):
    """The loop: batch_size rows a step (this rank's share); val accuracy on rank 0 (every
    val_interval with a target), test too at each full eval; best.pt on the best val accuracy;
    stop at max_iters, max_seconds, a signal, or once val reaches target_val_accuracy."""
    (x, y, mask), target = data, cfg.target_val_accuracy
    compiled = torch.compile(model) if cfg.compile else model  # checkpoints hold the plain model
    opt = adamw(model, cfg.lr, cfg.weight_decay)
    run_config, window = {**asdict(cfg), **task.settings()}, [0, 0.0]  # tokens, s since a log
    state = loop.resume(cfg, model, opt, task.tok, rank == 0, run_config)[0] if cfg.resume \
        else loop.State()
    with loop.Clock(cfg, state, rank) as clock:
        while True:
            now = clock.tick(val=target is not None and state.step % cfg.val_interval == 0)
            reached = False
            if now.evaluate and rank == 0:  # val; test too at a full eval or the target
                m = run_eval(cfg, model, task, "val", dev, state.step)
                reached = target is not None and m["val/accuracy"] >= target
                if now.full or reached:
                    m.update(run_eval(cfg, model, task, "test", dev, state.step))
                if clock.new_best(clock.log_eval(m), "val/accuracy"):
                    loop.save(cfg, "best.pt", model, opt, run_config, state, task.tok)
            if now.save:
                loop.save(cfg, "ckpt.pt", model, opt, run_config, state, task.tok)
            if now.stop or bool(all_reduce(reached, "max")):
                break
            with clock.step():  # this rank's share of batch_size rows
                t = time.time()
                model.train()
                opt.zero_grad()
                dropout = seeded("cpu", "dropout", cfg.seed, rank, state.step)
                torch.manual_seed(dropout.initial_seed())
                gen = seeded("cpu", "batch", cfg.seed, rank, state.step)
                idx = torch.randint(len(x), (cfg.batch_size // world,), generator=gen).to(dev)
                n_tok = all_reduce(mask[idx].sum()).item()  # every rank's target tokens
                loss = accumulate_grads(compiled, x[idx], y[idx], mask[idx],
                                        cfg.micro_batch_size or cfg.batch_size, bf16, n_tok)
                stats, tokens = loop.supervised_update(cfg, model, opt, state, {"train/loss": loss},
                                                       idx.numel() * x.size(1))
            window[:] = window[0] + tokens, window[1] + time.time() - t
            if state.step % cfg.log_interval == 0 or state.step == 1:
                clock.log({**stats, "perf/elapsed_s": time.time() - clock.t0,
                           "perf/tok_s": window[0] / window[1]},
                          " ".join(f"{k[6:]} {v:.4g}" for k, v in stats.items()))
                window[:] = 0, 0.0
    if rank == 0:
        print(f"done in {loop.fmt_time(time.time() - clock.t0)}; best val/accuracy "
              f"{state.best_val:.4f}", flush=True)
    return state.last_eval


def run_eval(cfg, model, task, split, dev, step):
    """Greedy accuracy on a split; on test also pass@k of eval_samples samples."""
    model.eval()
    test = split == "test"
    m, examples = evaluate(model, task, split, cfg.max_new_tokens,
                           n_samples=cfg.eval_samples if test else 0,
                           temperature=cfg.eval_temperature,
                           generator=seeded(dev, "eval", cfg.seed, step),
                           prefix="eval" if test else "val")
    return {**m, "eval/examples": examples} if test else m


if __name__ == "__main__":
    run_cli(main, Config)
