"""DDP (torchrun, gloo on CPU): 2 ranks on the two halves of a rollout batch give the same update as
1 process on the whole batch (global token/sequence normalisers), and a rank that dies makes the
other exit with one clear line in bounded time, rank 0 alone writing files."""
import copy
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

import losses as L
from nanorl import pref
import rl
from model import GPT, GPTConfig, generate
from model import adamw, optimizer_step
from nanorl.ddp import sync_grads
from test_rl import ROOT, make_run
from tokenizer import CharTokenizer

G = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rollout_batch():
    """A real sampled rollout of 4 groups of G from a tiny random model (with a value head, for PPO),
    with varied 0/1 rewards."""
    torch.manual_seed(0)
    tok = CharTokenizer("0123456789+*=-")
    model = GPT(GPTConfig(block_size=24, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, scalar_head=True))
    prompts = [tok.encode(p) for p in ("12*3=", "4*56=", "7*8=", "91*2=")]
    g = torch.Generator().manual_seed(1)
    out = generate(model, prompts, 6, tok.eos_id, tok.pad_id, G=G, temperature=1.0, generator=g)
    reward = torch.tensor([1., 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 0])  # (N,) every group mixed
    mask = out["response_mask"][:, out["prompt_len"]:]
    return model, tok, rl.rows.Rollout(out["ids"], out["offsets"], mask, out["logps"], out["logps"], reward, reward,
                                  torch.full((16,), -1), mask.sum(1).float(), torch.ones(16, dtype=torch.bool))


def one_update(model, tok, batch, loss, sgd=True, **kw):
    """One rl.py update of `loss` on batch (a rollout, or for dpo/sft the rows it gives), by SGD at lr 1
    with no clip, so that the weights move by exactly minus the gradient (AdamW's first step moves each by
    about lr sign(g): a gradient scaled 2x would hardly show); returns the optimizer."""
    cfg = rl.Config(loss=loss, group_size=G, max_new_tokens=6, grad_clip=0.0 if sgd else 1.0, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=1.0) if sgd else adamw(model, 1e-2, 0.0)
    if loss in ("dpo", "sft"):  # dpo: a (correct, wrong) pair per group; sft: the correct samples (rft's rows)
        row, ref = L.ALGOS[loss if loss == "dpo" else "rft"], copy.deepcopy(model).requires_grad_(False)
        rows, labels = pref.rollout_rows(batch, row, G)
        loss, _ = pref.rows_loss(model, ref, tok.pad_id, rows, labels, row, L.resolve_hparams(row_name(row)))
        sync_grads(model)
        optimizer_step(model, opt, loss, 1.0, cfg.grad_clip)
        return opt
    run, b = make_run(cfg, model), copy.copy(batch)
    run.opt = opt
    rl.pg_step(cfg, L.ALGOS[loss], run, 1.0 if sgd else 1e-2, torch.Generator().manual_seed(0), (b, {}))
    return opt


def row_name(row):
    return next(n for n, a in L.ALGOS.items() if a is row)


# (name, loss, rank owning each of the 4 groups, Config overrides). Uneven: rank 0 holds 3 groups in 3
# micro-batches, rank 1 one group in one (DDP's all-reduce in every backward deadlocked here).
CASES = [("grpo", "grpo", [0, 0, 1, 1], {}), ("dapo", "dapo", [0, 0, 1, 1], {}),
         ("dr_grpo", "dr_grpo", [0, 0, 1, 1], {}),
         ("grpo_uneven", "grpo", [0, 0, 0, 1], dict(micro_batch_size=G)),
         ("dapo_uneven", "dapo", [0, 1, 0, 0], dict(micro_batch_size=G)),
         ("ppo_uneven", "ppo", [0, 0, 0, 1], dict(micro_batch_size=G)),
         ("dpo_uneven", "dpo", [0, 0, 0, 1], {}), ("sft_uneven", "sft", [0, 0, 0, 1], {})]


def ddp_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from nanorl.ddp import init_distributed
    init_distributed(torch.device("cpu"), timeout_s=60)
    for name, loss, owner, kw in CASES:
        model, tok, batch = rollout_batch()
        one_update(model, tok, rl.take(batch, (torch.tensor(owner) == rank).repeat_interleave(G)), loss, **kw)
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(out_dir, f"{name}.pt"))
    # minibatches=3 on 12 rows and on 4: each rank takes exactly 3 optimizer steps, the same ones
    model, tok, batch = rollout_batch()
    opt = one_update(model, tok, rl.take(batch, (torch.tensor([0, 0, 0, 1]) == rank).repeat_interleave(G)), "grpo",
                     sgd=False, minibatches=3)
    steps = {int(s["step"]) for s in opt.state.values()}
    torch.save({"steps": steps, "model": model.state_dict()}, os.path.join(out_dir, f"minibatches{rank}.pt"))
    torch.distributed.barrier()  # both ranks done before either tears gloo down
    torch.distributed.destroy_process_group()


def test_ranks_with_any_share_of_the_groups_equal_one_process_on_the_whole_batch(tmp_path):
    """grpo divides by the sequence count, dapo and ppo by the token count (ppo whitens over every
    rank's tokens), dr_grpo by a constant x sequences, dpo by the pair count, sft by the token count:
    each rank's loss uses the global counts and the gradients are summed over ranks, so halves, or
    3 groups against 1 in different numbers of micro-batches, give one process's step on all 4 groups."""
    mp.spawn(ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for name, loss, owner, kw in CASES:
        model, tok, batch = rollout_batch()
        assert batch.mask[:8].sum() != batch.mask[8:].sum()  # unequal token counts per rank
        start = copy.deepcopy(model.state_dict())
        one_update(model, tok, batch, loss, **kw)
        ddp = torch.load(tmp_path / f"{name}.pt", weights_only=True)
        assert any((model.state_dict()[k] - start[k]).abs().max() > 1e-2 for k in start)  # the update did move them
        for k, v in model.state_dict().items():
            assert (v - ddp[k]).abs().max().item() <= 1e-5, (name, k)
    r0, r1 = (torch.load(tmp_path / f"minibatches{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["steps"] == r1["steps"] == {3}
    assert all(torch.equal(v, r1["model"][k]) for k, v in r0["model"].items())  # the ranks stay in step


RANK_SCRIPT = """
import os, sys
import rl
from nanorl import config
if os.environ["RANK"] == "1":  # dies in its second update; must never write a file
    real, n = rl.optimizer_step, [0]
    def dying(*a, **k):
        n[0] += 1
        if n[0] == 2:
            os._exit(3)
        return real(*a, **k)
    rl.optimizer_step = dying
    rl.loop.save_checkpoint = lambda *a, **k: sys.exit("rank 1 wrote a checkpoint")
    rl.loop.Logger.log = lambda self, m: sys.exit("rank 1 wrote metrics") if self.enabled else None
sys.argv = ["rl.py"] + sys.argv[1:]
config.run_cli(rl.main, rl.Config)
"""


def test_a_dead_rank_makes_the_other_exit_clearly(sft_ckpt, tmp_path):  # noqa: F811
    port = free_port()
    args = [f"--sft_ckpt={sft_ckpt}", f"--out_dir={tmp_path}", "--loss=grpo", "--max_iters=5", "--eval_interval=100",
            "--prompts_per_step=4", "--group_size=4", "--eval_samples=0", "--threads=1", "--dynamic_sampling=false"]
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                   "LOCAL_RANK": str(r), "WORLD_SIZE": "2"}) for r in (0, 1)]
    t0 = time.time()
    out0, err0 = procs[0].communicate(timeout=600)
    procs[1].communicate(timeout=600)
    assert procs[1].returncode == 3  # the injected death
    assert procs[0].returncode == 1 and time.time() - t0 < 120
    lines = err0.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: another rank died"), err0
    assert set(os.listdir(tmp_path)) <= {"best.pt", "ckpt.pt", "metrics.jsonl", "rollouts"}  # rank 0's files
    assert set(os.listdir(tmp_path / "rollouts")) <= {"step_000001.jsonl", "step_000001.pt"}  # no temp left
    assert "step     1/5" in out0 and "step     2/5" not in out0


UNEVEN_SCRIPT = """
import os, sys
import rl
from nanorl import config
import verify; verify.VERIFIERS["exact"] = lambda text, gold, reverse=False: float(text[:1] == "1")  # signal
if os.environ.get("RANK_1_ALL_WRONG") and os.environ["RANK"] == "1":  # its groups never mixed
    verify.VERIFIERS["exact"] = lambda text, gold, reverse=False: 0.0
sys.argv = ["rl.py"] + sys.argv[1:]
config.run_cli(rl.main, rl.Config)
"""


def torchrun2(args, tmp_path, **env):
    """rl.py on 2 ranks (UNEVEN_SCRIPT) -> the metrics rows; both ranks must exit 0."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", UNEVEN_SCRIPT, *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                   "LOCAL_RANK": str(r), "WORLD_SIZE": "2", **env}) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    return [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]


def test_an_online_pairs_step_with_no_pair_on_one_rank_skips_the_update_on_both(sft_ckpt, tmp_path):  # noqa: F811
    """Rank 1 finds no group with a right and a wrong answer (no rollout at all), rank 0 does: both
    skip the update together, log n_groups, and neither crashes nor waits for the other."""
    rows = torchrun2([f"--sft_ckpt={sft_ckpt}", f"--out_dir={tmp_path}", "--loss=dpo", "--pairs=online",
                      "--prompts_per_step=8", "--group_size=8", "--max_refills=0", "--max_iters=2", "--eval_samples=0",
                      "--eval_interval=100", "--threads=1"], tmp_path, RANK_1_ALL_WRONG="1")
    train = [r for r in rows if "rl/n_groups" in r]
    assert len(train) == 2 and all("rl/loss" not in r for r in train) and any(r["rl/n_groups"] > 0 for r in train)


def test_torchrun_with_dynamic_sampling_and_uneven_ranks_finishes(sft_ckpt, tmp_path):  # noqa: F811
    """Dynamic sampling keeps a different number of groups on each rank, one micro-batch per group:
    with DDP's all-reduce inside every backward the ranks waited on each other for ever."""
    rows = torchrun2([f"--sft_ckpt={sft_ckpt}", f"--out_dir={tmp_path}", "--loss=grpo", "--prompts_per_step=8",
                      "--group_size=4", "--micro_batch_size=4", "--max_refills=0", "--max_iters=8", "--eval_samples=0",
                      "--eval_interval=100", "--threads=1"], tmp_path)
    groups = [r["rl/n_groups"] for r in rows if "rl/n_groups" in r]
    assert len(groups) == 8 and any(g != int(g) for g in groups)  # a mean over ranks of unequal counts
