"""rl.py end to end on a tiny SFT checkpoint: every loss runs, logs the documented keys, and none of
the failure modes of well-known trainers (docs/reliability.md) is present."""
import dataclasses
import copy
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import losses as L
from by_name import LOSSES
import rl
from verify import VERIFIERS
import sft
from nanorl.checkpoint import load_checkpoint
from model import adamw
from nanorl.ddp import Ranks
from nanorl.rows import encode_prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_SFT = dict(n_layer=1, n_head=2, n_embd=32, batch_size=64, lr=3e-3, warmup_iters=5, eval_interval=100,
                eval_samples=0, threads=1, max_iters=120, bf16=False)  # fp32 on every CPU: one checkpoint
TINY_RL = dict(max_iters=2, eval_interval=2, prompts_per_step=4, group_size=4, eval_samples=2, threads=1)
LOGGED_KEYS = ["rl/reward_mean", "rl/accuracy", "rl/entropy", "rl/clipfrac_low", "rl/clipfrac_high", "rl/ratio_max",
              "rl/resp_len", "rl/truncated_frac", "rl/zero_std_frac", "rl/grad_norm", "rl/logp_mismatch",
              "perf/rollout_tok_s", "perf/step_s"]


@pytest.fixture
def varied_reward(monkeypatch):
    """The tiny model is never right; reward answers starting with '1' so groups have variance."""
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: float(text[:1] == "1"))


def run(sft_ckpt, out, **kw):
    cfg = rl.Config(sft_ckpt=sft_ckpt, out_dir=str(out), **{**TINY_RL, **kw})
    res = rl.main(cfg)
    rows = [json.loads(l) for l in open(out / "metrics.jsonl")]
    return res, rows


def make_run(cfg, model, task=None, teacher=None, rm=None, lr=1e-2, selection=False):
    """The Run that rl.setup builds, from a model in hand: a frozen copy as the reference, AdamW, the
    algorithm's hyperparameters resolved from cfg, prompts over task.train, the advantage stage."""
    keys = {*L.KNOBS, *L.DEFAULTS[cfg.loss]}
    hp = L.resolve_hparams(cfg.loss, **{k: getattr(cfg, k, None) for k in keys})
    prompts = rl.PromptSampler(len(task.train), 0, selection) if task else None
    real = task and isinstance(task.train[0], tuple)  # not a fake task's plain indices
    ids = encode_prompts(task.tok, [p for p, _ in task.train], task.reverse) if real else []
    algo = L.ALGOS[cfg.loss]
    stage = rl.advantage_stage(cfg, algo, hp, teacher) if algo.family == "pg" else None
    ranks = Ranks() if torch.distributed.is_initialized() else rl.OneProcess()  # a test's torchrun
    if model is None:  # collect and rollout with a fake sampler
        return rl.Run(None, None, None, None, task, prompts, hp, rm, teacher, stage, ranks, ids)
    return rl.Run(model, model, copy.deepcopy(model).requires_grad_(False),
                  adamw(model, lr, 0.0, hp.get("vf_lr_mult")), task, prompts, hp, rm, teacher, stage,
                  ranks, ids)


def lone(hp):
    """A Run as the advantage functions read it: the hyperparameters, one process."""
    return SimpleNamespace(hp=hp, ranks=rl.OneProcess())


def update_once(cfg, model, b, teacher=None, lr=1e-2, gen=None):
    """rl.pg_step on a copy of rollout b (its advantages, its updates) -> (the run, its stats)."""
    row, run, b = L.ALGOS[cfg.loss], make_run(cfg, model, teacher=teacher, lr=lr), copy.copy(b)
    gen = gen or torch.Generator().manual_seed(0)
    return run, rl.train_step(cfg)(cfg, row, run, lr, gen, (b, {}))


def char_task(train=None, reverse=True):
    """The mul task with the char tokenizer and the exact verifier, as Task.of reads a checkpoint's."""
    from data.tasks import ALPHABET, load_split
    from nanorl.evaluate import Task
    from tokenizer import CharTokenizer
    return Task(CharTokenizer(ALPHABET), "mul", reverse, "exact", 0,
                load_split("mul", "train") if train is None else train)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss_runs_and_logs(sft_ckpt, tmp_path, loss, varied_reward):
    extra = dict(teacher_ckpt=sft_ckpt) if "teacher" in L.ALGOS[loss].needs else {}  # opd, gkd
    extra = dict(pass_k=2) if loss == "pass_at_k" else extra  # k < the tiny group of 4
    res, rows = run(sft_ckpt, tmp_path, loss=loss, dynamic_sampling=False, **extra)
    train = [r for r in rows if "rl/reward_mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        assert 0 <= r["eval/accuracy"] <= 1 and r["eval/n"] == 810 and "eval/kl" in r and r["eval/examples"]
        assert 1 <= r["eval/resp_len"] <= TINY_RL.get("max_new_tokens", 8) and 0 <= r["eval/truncated_frac"] <= 1
    for r in train:
        for k in LOGGED_KEYS:
            assert k in r and torch.isfinite(torch.tensor(float(r[k]))), (loss, k)
        assert r["rl/logp_mismatch"] <= 1e-5  # failure mode 2: the first ratio is exactly 1
    assert ("rl/kl" in train[0]) == bool(L.DEFAULTS[loss].get("beta"))  # reference runs only for a KL term
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 2


def test_tempered_sampling_matches_training_and_dropout_is_off(tmp_path_factory, varied_reward):
    """Failure modes 2 and 5: temperature 0.7 and a model built with dropout 0.2 still give ratio 1."""
    out = tmp_path_factory.mktemp("sft_dropout")
    sft.main(sft.Config(out_dir=str(out), **{**TINY_SFT, "dropout": 0.2, "max_iters": 20}))
    tmp = tmp_path_factory.mktemp("rl")
    _, rows = run(str(out / "ckpt.pt"), tmp, loss="grpo", temperature=0.7, max_iters=3, eval_interval=10)
    mism = [r["rl/logp_mismatch"] for r in rows if "rl/logp_mismatch" in r]
    assert len(mism) == 3 and max(mism) <= 1e-5


def test_reference_is_frozen_and_policy_moves(sft_ckpt, tmp_path, varied_reward):
    """Failure mode 7: the reference never changes; the policy does; KL at eval is > 0 after updates."""
    res, rows = run(sft_ckpt, tmp_path, loss="grpo", lr=1e-3, max_iters=4, eval_interval=4)
    sft_state = load_checkpoint(sft_ckpt)["model"]
    for k, v in res["ref"].state_dict().items():
        assert torch.equal(v, sft_state[k])
    moved = any(not torch.equal(v, sft_state[k]) for k, v in res["model"].state_dict().items())
    assert moved and rows[-1]["eval/kl"] > 0


def test_all_equal_groups_give_no_update_and_no_nan(sft_ckpt, tmp_path, monkeypatch):
    """Failure mode 9: every group all-wrong -> zero advantages, zero gradient, parameters unchanged."""
    monkeypatch.setitem(VERIFIERS, "exact", lambda *a, **k: 0.0)
    res, rows = run(sft_ckpt, tmp_path, loss="grpo", beta=0.0, max_iters=2, dynamic_sampling=False)
    sft_state = load_checkpoint(sft_ckpt)["model"]
    for k, v in res["model"].state_dict().items():
        assert torch.allclose(v, sft_state[k])  # AdamW with zero grads and no weight decay: no change
    train = [r for r in rows if "rl/loss" in r]
    assert all(r["rl/zero_std_frac"] == 1.0 and r["rl/loss"] == 0.0 and r["rl/grad_norm"] == 0.0 for r in train)
    # with dynamic sampling every group is dropped: the step is skipped, still no NaN
    res, rows = run(sft_ckpt, tmp_path / "dyn", loss="dapo", max_iters=2, max_refills=1, overlong_window=0)
    assert all(r["rl/zero_std_frac"] == 1.0 for r in rows if "rl/zero_std_frac" in r)


def test_objective_parts_are_logged(sft_ckpt, tmp_path, varied_reward):
    """Failure mode 8: with group-normalised advantages the loss is ~0 by construction, so the parts
    (reward, KL, clip fractions, entropy) are logged every step."""
    _, rows = run(sft_ckpt, tmp_path, loss="grpo", max_iters=2)
    for r in (r for r in rows if "rl/loss" in r):
        assert {"rl/reward_mean", "rl/kl", "rl/clipfrac_low", "rl/clipfrac_high", "rl/entropy"} <= r.keys()


def test_rl_defaults_stay_below_the_collapse_lr():
    """Failure mode 10: a fresh optimizer at SFT-sized learning rates destroys the model (measured here at
    lr >= 3e-4): the RL default is lower and warms up."""
    cfg = rl.Config()
    assert cfg.lr < 3e-4 <= sft.Config().lr and cfg.warmup_iters > 0


def test_nan_stops_the_run_and_keeps_the_checkpoint(sft_ckpt, tmp_path, monkeypatch, varied_reward):
    real = L.algo_loss
    monkeypatch.setattr(L, "algo_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), {}))
    with pytest.raises(rl.UserError, match=r"step 1: non-finite loss"):
        run(sft_ckpt, tmp_path, loss="grpo", max_iters=2)
    ck = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert ck["step"] == 0  # the last good checkpoint (step-0 eval) is whole and untouched
    sft_state = load_checkpoint(sft_ckpt)["model"]
    assert all(torch.equal(v, sft_state[k]) for k, v in ck["model"].items())


def cli(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_cli_errors(tmp_path):
    r = cli("rl.py", "--loss=nonsense")
    assert r.returncode != 0 and "unknown loss 'nonsense'" in r.stderr and "dapo" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("rl.py", f"--sft_ckpt={tmp_path}/none.pt")
    assert r.returncode != 0 and "python sft.py configs/mul.py" in r.stderr and "Traceback" not in r.stderr
    r = cli("rl.py", "--group_size=1")
    assert r.returncode != 0 and "group_size" in r.stderr


def test_sft_baseline_trains_on_gold_answers(sft_ckpt, tmp_path):
    """--loss=sft: pairs_per_step gold (prompt, answer + EOS) rows per step, per-token NLL; the NLL of
    gold answers of train problems falls from the SFT model's."""
    from losses import nll_loss
    from nanorl.pref import row_logps
    from nanorl.rows import gold_rows
    from data.tasks import ensure_data, load_problems
    from nanorl.checkpoint import model_from_checkpoint
    res, rows = run(sft_ckpt, tmp_path, loss="sft", pairs_per_step=64, lr=3e-3, max_iters=20, eval_interval=20)
    train = [r for r in rows if "rl/loss" in r]
    assert len(train) == 20 and all(r["rl/n_seqs"] == 64 and r["rl/loss"] == r["rl/nll"] > 0 for r in train)
    ckpt = load_checkpoint(sft_ckpt)
    sft_model, tok = model_from_checkpoint(ckpt, sft_ckpt)
    gold = gold_rows(tok, load_problems(ensure_data("mul") / "train.txt")[:256], ckpt["config"]["reverse"])
    nll = lambda m: nll_loss(*row_logps(m.eval(), gold, tok.pad_id))[0].item()  # noqa: E731
    assert nll(res["model"]) < nll(sft_model) - 0.02  # 1.553 vs 1.593 here
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 20] and rows[-1]["eval/kl"] > 0
    assert "perf/rollout_tok_s" not in train[0]  # no rollouts


def test_sft_baseline_reads_only_the_checkpoints_labelled_problems(sft_ckpt, tmp_path, monkeypatch):
    """An SFT checkpoint of n_train labels: --loss=sft trains on those problems only, the RL losses
    draw prompts from the whole train split."""
    from nanorl.checkpoint import save_checkpoint, model_from_checkpoint
    from data.tasks import labelled, load_split
    ckpt = load_checkpoint(sft_ckpt)
    model, tok = model_from_checkpoint(ckpt, sft_ckpt)
    scarce = str(tmp_path / "scarce.pt")
    save_checkpoint(scarce, model, config={**ckpt["config"], "n_train": 12}, tokenizer=tok)
    import nanorl.evaluate as E
    seen, gold_rows = [], E.gold_rows  # Task.gold_rows'
    monkeypatch.setattr(E, "gold_rows", lambda tok, items, rev: seen.extend(items) or
                        gold_rows(tok, items, rev))
    run(scarce, tmp_path / "sft", loss="sft", pairs_per_step=8, max_iters=3, eval_interval=3, eval_samples=0)
    train = load_split("mul", "train")
    assert len(seen) == 24 and set(seen) == set(labelled(train, 12))  # 24 draws, in epochs over the 12
    assert load_checkpoint(str(tmp_path / "sft" / "ckpt.pt"))["config"]["n_train"] == 12
    cfg, row, hp = rl.check(rl.Config(sft_ckpt=scarce, out_dir=str(tmp_path / "grpo"), **TINY_RL))
    assert rl.setup(cfg, row, hp, torch.device("cpu"), 0, 1)[1].task.train == train  # prompts: no labels


def test_rft_trains_on_the_verified_correct_samples_only(sft_ckpt, tmp_path, varied_reward):
    _, rows = run(sft_ckpt, tmp_path, loss="rft", max_iters=3, eval_interval=3, prompts_per_step=8, group_size=8)
    train = [r for r in rows if "rl/loss" in r]
    assert len(train) == 3
    for r in train:  # every correct sample of the 8 x 8 is kept, all-correct groups too; nothing else
        assert r["rl/n_seqs"] == round(r["rl/accuracy"] * 64) > 0 and "rl/zero_std_frac" in r


def test_rft_without_a_correct_sample_skips_the_step(sft_ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(VERIFIERS, "exact", lambda *a, **k: 0.0)
    res, rows = run(sft_ckpt, tmp_path, loss="rft", max_iters=2)
    assert not [r for r in rows if "rl/loss" in r] and [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]  # skipped steps still end in the final eval
    sft_state = load_checkpoint(sft_ckpt)["model"]
    assert all(torch.equal(v, sft_state[k]) for k, v in res["model"].state_dict().items())


def test_max_seconds_stops_after_the_step_then_evaluates(sft_ckpt, tmp_path):
    _, rows = run(sft_ckpt, tmp_path, loss="sft", pairs_per_step=4, max_iters=50, eval_interval=50, max_seconds=1e-9)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1] and evals[0]["perf/train_s"] == 0 < evals[1]["perf/train_s"]
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 1


def test_wandb_offline_run_records_its_config(sft_ckpt, tmp_path, monkeypatch):
    """--wandb=true with WANDB_MODE=offline: no network; the run's event log holds the resolved config,
    the group and the run name (read as bytes: wandb's reader is internal API)."""
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    run(sft_ckpt, tmp_path, loss="grpo", max_iters=1, eval_interval=1, wandb=True, wandb_group="grp-test-7",
        wandb_run_name="run-test-7")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))
    for needle in (b"grp-test-7", b"run-test-7", b"wandb_group", b"eps_high", b"eval/accuracy", str(tmp_path).encode()):
        assert needle in log, needle


def test_a_wandb_failure_never_stops_training(sft_ckpt, tmp_path, monkeypatch, capsys):
    import wandb

    def broken(*a, **k):
        raise RuntimeError("no network")
    monkeypatch.setattr(wandb, "init", broken)
    res, rows = run(sft_ckpt, tmp_path, loss="sft", pairs_per_step=4, max_iters=1, eval_interval=1, wandb=True)
    assert "warning: wandb disabled (RuntimeError: no network)" in capsys.readouterr().out
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 1]


@pytest.mark.parametrize("loss", ["grpo", "dapo", "ppo", "kl_cov", "reinforce_pp"])
def test_micro_batches_give_the_same_step(loss, varied_reward):
    """micro_batch_size changes memory, not the step: accumulated over micro-batches of one group,
    of uneven sizes, or in one piece, the gradients and the logged diagnostics agree, because every
    normaliser counts the whole minibatch (failure mode 4), and KL-Cov picks its tokens over it."""
    from dataclasses import replace
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    task = char_task()
    model = GPT(GPTConfig(vocab_size=task.tok.vocab_size, n_layer=1, n_head=2, n_embd=32,
                          scalar_head=loss == "ppo")).eval()
    cfg = rl.Config(loss=loss, prompts_per_step=6, group_size=4, dynamic_sampling=False, overlong_window=0, max_new_tokens=8)
    batch, _ = rl.collect(cfg, L.ALGOS[loss], make_run(cfg, model, task), torch.Generator().manual_seed(0))
    N, T = batch.mask.shape
    for i in range(N):  # responses of 1..L tokens (the sampler's log-probs are 0 past the end)
        n = 1 + i * 7 % T
        batch.mask[i, n:] = 0
        batch.mu[i, n:] = 0
    batch.reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0] * 4)  # every group of 4 has signal
    res = {}
    for micro in (24, 4, 16):  # one piece; one group each; 16 + 8 rows
        run, stats = update_once(replace(cfg, micro_batch_size=micro), copy.deepcopy(model), batch, lr=1e-3,
                                 gen=torch.Generator().manual_seed(1))
        res[micro] = stats, [p.grad for p in run.model.parameters()]
    assert res[24][0]["rl/grad_norm"] > 0
    for micro in (4, 16):
        for k, v in res[24][0].items():
            assert v == pytest.approx(res[micro][0][k], rel=1e-5, abs=1e-6), (micro, k)
        for a, b in zip(res[24][1], res[micro][1]):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_rl_on_the_text_task_with_a_bpe_tokenizer(tmp_path, monkeypatch, varied_reward):
    """An SFT checkpoint of the text task with a BPE tokenizer: rl.py reads its prompts in words."""
    from test_sft import BPE, toy_bpe
    sft.main(sft.Config(tokenizer=toy_bpe(monkeypatch), out_dir=str(tmp_path / "sft"), **BPE))
    _, rows = run(str(tmp_path / "sft" / "ckpt.pt"), tmp_path / "rl", max_iters=1, eval_interval=1, eval_samples=0,
                  dynamic_sampling=False, max_new_tokens=6)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1] and evals[0]["eval/examples"][0]["prompt"].startswith("What is ")
    assert [r for r in rows if "rl/logp_mismatch" in r][0]["rl/logp_mismatch"] <= 1e-5


# ----------------------------------------------------------------------------- defects found in review

def tiny_batch(n_groups=4, G=4, seed=0, temperature=1.0):
    """A sampled rollout of n_groups x G rows from a tiny random model, every group mixed 0/1."""
    from model import GPT, GPTConfig, generate
    from tokenizer import CharTokenizer
    torch.manual_seed(seed)
    tok = CharTokenizer("0123456789+*=-")
    model = GPT(GPTConfig(block_size=24, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)).eval()
    prompts = [tok.encode(f"{i + 1}*7=") for i in range(n_groups)]
    out = generate(model, prompts, 6, tok.eos_id, tok.pad_id, G=G, temperature=temperature,
                   generator=torch.Generator().manual_seed(seed))
    N, mask = n_groups * G, out["response_mask"][:, out["prompt_len"]:]
    reward = torch.tensor([1.0, 0.0] * (N // 2))
    return model, rl.rows.Rollout(out["ids"], out["offsets"], mask, out["logps"], out["logps"], reward, reward,
                             torch.full((N,), -1), mask.sum(1).float(), torch.ones(N, dtype=torch.bool))


@pytest.mark.parametrize("minibatches", [1, 3, 5, 16])
def test_minibatches_is_exactly_the_number_of_optimizer_steps(minibatches):
    """16 rows in 5 minibatches: torch.chunk gives 4 parts, so the run took 4 steps, not 5."""
    model, batch = tiny_batch()
    run, _ = update_once(rl.Config(loss="grpo", group_size=4, minibatches=minibatches, beta=0.0), model, batch)
    assert {int(s["step"]) for s in run.opt.state.values()} == {minibatches}


def test_fewer_rows_than_minibatches_stops_with_one_line():
    model, batch = tiny_batch(n_groups=1)
    with pytest.raises(rl.UserError, match="minibatches=5 but a rank holds only 4 rows"):
        update_once(rl.Config(loss="grpo", group_size=4, minibatches=5, beta=0.0), model, batch)


@pytest.mark.parametrize("kw, msg", [
    (dict(clip_c=0.5), "clip_c must be > 1"), (dict(clip_c=1.0), "clip_c must be > 1"),
    (dict(loss="reinforce", ppo_epochs=2), "reinforce takes one optimizer step per batch"),
    (dict(loss="rloo", minibatches=2), "rloo takes one optimizer step per batch"),
    (dict(loss="dpo", minibatches=2), "dpo takes one optimizer step per batch"),
    (dict(loss="sft", ppo_epochs=3), "sft takes one optimizer step per batch"),
    (dict(loss="opd", reward="rm", teacher_ckpt="t.pt"), "opd learns from its teacher, never from a reward"),
    (dict(loss="gkd", reward="rm", teacher_ckpt="t.pt"), "gkd learns from its teacher"),
    (dict(loss="opd", overlong_window=4, teacher_ckpt="t.pt"), "opd does not learn from rewards"),
    (dict(loss="gkd", overlong_window=2, teacher_ckpt="t.pt"), "gkd does not learn from rewards"),
    (dict(loss="rft", overlong_window=2), "rft does not learn from rewards"),
    (dict(loss="dpo", pairs="online", dynamic_sampling=False), "dynamic sampling is always on"),
    (dict(loss="grpo", pairs="online"), "grpo has no pairs"),
])
def test_settings_that_change_the_algorithm_are_refused(tmp_path, kw, msg):
    with pytest.raises(rl.UserError, match=msg):
        rl.main(rl.Config(out_dir=str(tmp_path / "out"), **kw))
    assert not (tmp_path / "out").exists()


def test_cliff_is_refused_without_the_exact_verifier_or_with_bpe(sft_ckpt, tmp_path, monkeypatch):
    """CLIFF compares the response with the gold tokens: another verifier (or BPE, where many token
    sequences spell one answer) can accept an answer that differs from them."""
    from nanorl.checkpoint import model_from_checkpoint, save_checkpoint
    ck = load_checkpoint(sft_ckpt)
    model, tok = model_from_checkpoint(ck, sft_ckpt)
    save_checkpoint(str(tmp_path / "final.pt"), model, None, {**ck["config"], "verifier": "final"}, 0, tok)
    with pytest.raises(rl.UserError, match="cliff finds the first wrong token.*verifier 'final'"):
        rl.main(rl.Config(loss="cliff", sft_ckpt=str(tmp_path / "final.pt"), out_dir=str(tmp_path / "o")))
    from test_sft import BPE, toy_bpe
    sft.main(sft.Config(tokenizer=toy_bpe(monkeypatch), out_dir=str(tmp_path / "bpe"), **{**BPE, "max_iters": 0}))
    with pytest.raises(rl.UserError, match="cliff finds the first wrong token.*BPETokenizer"):
        rl.main(rl.Config(loss="cliff", sft_ckpt=str(tmp_path / "bpe" / "ckpt.pt"), out_dir=str(tmp_path / "o")))


def test_dynamic_sampling_keeps_groups_by_accuracy_not_by_shaped_reward(monkeypatch):
    """DAPO keeps a group when 0 < accuracy < 1. An all-wrong group whose overlong shaping differs
    (rewards -1, -0.5, 0, 0) has no signal and is dropped; with a reward model, equal scores are.
    The groups all lost and all won are counted by their scores."""
    class RM:  # its scores: equal in the first group only
        def score(self, b, normalize, update):
            b.reward = torch.tensor([0.3, 0.3, 0.3, 0.3, 0.1, 0.2, 0.1, 0.2, 0.5, 0.6, 0.7, 0.8])

    def fake_rollout(cfg, row, run, idx, gen, G, temperature):
        correct = torch.tensor([0., 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1])  # all wrong, mixed, all right
        reward = correct + torch.tensor([-1, -0.5, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.5])  # shaped
        return rl.rows.Rollout(torch.arange(12)[:, None], torch.zeros(12), torch.ones(12, 1), torch.zeros(12, 1),
                          reward=reward, score=correct, length=torch.ones(12),
                          finished=torch.ones(12, dtype=torch.bool))

    monkeypatch.setattr(rl, "rollout", fake_rollout)
    cfg = rl.Config(loss="dapo", prompts_per_step=3, group_size=4, max_refills=0, max_new_tokens=8)
    run = make_run(cfg, None, char_task(list(range(10))))
    batch, stats = rl.collect(cfg, L.ALGOS["dapo"], run, None)
    assert batch.ids.flatten().tolist() == list(range(4, 8)) and stats["rl/zero_std_frac"] == pytest.approx(2 / 3)
    assert stats["rl/all_lost_frac"] == pytest.approx(1 / 3) and stats["rl/all_won_frac"] == pytest.approx(1 / 3)
    run.rm = RM()
    batch, stats = rl.collect(cfg, L.ALGOS["dapo"], run, None)
    assert batch.ids.flatten().tolist() == list(range(4, 12)) and stats["rl/zero_std_frac"] == pytest.approx(1 / 3)


def test_a_special_token_inside_a_response_earns_nothing(monkeypatch):
    """'1 0 <pad> 8 1 <eos>' decodes to '1081' (decode drops PAD), but it is not what a correct
    policy samples: reward 0, and CLIFF's first wrong token is the PAD, position 2."""
    from data.tasks import ALPHABET, format_answer
    from tokenizer import CharTokenizer
    tok = CharTokenizer(ALPHABET)
    gold = "1081"
    answer = tok.encode(format_answer(gold, False))
    rows = [answer + [tok.eos_id], answer[:2] + [tok.pad_id] + answer[2:] + [tok.eos_id]]

    def fake_generate(model, prompts, max_new_tokens, eos_id, pad_id, G=1, **kw):
        p = prompts[0]
        ids = torch.tensor([p + rows[0] + [pad_id], p + rows[1]])  # right padding after the first EOS
        mask = torch.tensor([[0] * len(p) + [1] * len(r) + [0] * (6 - len(r)) for r in rows])
        return {"ids": ids, "response_mask": mask, "action_mask": mask, "logps": torch.zeros(2, 6),
                "offsets": torch.zeros(2, dtype=torch.long), "prompt_len": len(p)}

    monkeypatch.setattr(rl, "generate", fake_generate)
    cfg = rl.Config(loss="cliff", group_size=2, max_new_tokens=6, overlong_window=0)
    run = make_run(cfg, None, char_task([("23*47=", gold)], reverse=False))
    out = rl.rollout(cfg, L.ALGOS["cliff"], run, [0], None, 2, 1.0)
    assert out.score.tolist() == [1.0, 0.0] and out.first_wrong.tolist() == [-1, 2]


def test_the_same_response_under_two_prompts_gets_each_prompts_grade(monkeypatch):
    """A group's identical samples are graded once, but "6" answers 2*3 and not 2*4: the grading key
    holds the prompt."""
    from data.tasks import ALPHABET
    from tokenizer import CharTokenizer
    tok = CharTokenizer(ALPHABET)
    answer = tok.encode("6") + [tok.eos_id]

    def fake_generate(model, prompts, max_new_tokens, eos_id, pad_id, G=1, **kw):
        rows = [p + answer for p in prompts for _ in range(G)]  # every prompt of 4 tokens
        mask = torch.tensor([[0] * 4 + [1, 1]] * len(rows))
        return {"ids": torch.tensor(rows), "logps": torch.zeros(len(rows), 2),
                "response_mask": mask, "action_mask": mask,
                "offsets": torch.zeros(len(rows), dtype=torch.long), "prompt_len": 4}

    monkeypatch.setattr(rl, "generate", fake_generate)
    cfg = rl.Config(group_size=2, max_new_tokens=2, overlong_window=0)
    run = make_run(cfg, None, char_task([("2*3=", "6"), ("2*4=", "8")], reverse=False))
    out = rl.rollout(cfg, L.ALGOS["grpo"], run, [0, 1], None, 2, 1.0)
    assert out.score.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_checkpoint_settings_have_one_source_of_truth(sft_ckpt, tmp_path):
    """A checkpoint whose config lacks 'reverse' (then sft.py's default True) used to be read as False by
    rl.py, reward_model.py and sample.py, and an RM without 'lik_coef' (default 1.0) as 0.0: now each
    reader fails naming the key."""
    import reward_model
    import sample
    from nanorl.checkpoint import CheckpointError, model_from_checkpoint, save_checkpoint
    from model import GPT, GPTConfig
    ck = load_checkpoint(sft_ckpt)
    model, tok = model_from_checkpoint(ck, sft_ckpt)
    cfg = {k: v for k, v in ck["config"].items() if k != "reverse"}
    save_checkpoint(str(tmp_path / "old.pt"), model, None, cfg, 0, tok)
    old = str(tmp_path / "old.pt")
    for run_it in (lambda: rl.main(rl.Config(sft_ckpt=old, out_dir=str(tmp_path / "rl"))),
                   lambda: reward_model.main(reward_model.Config(sft_ckpt=old, out_dir=str(tmp_path / "rm"))),
                   lambda: sample.main(sample.Config(ckpt=old, prompt="23*47="))):
        with pytest.raises(CheckpointError, match="old.pt: its config lacks 'reverse'"):
            run_it()
    rm = GPT(GPTConfig(**{**ck["model_args"], "scalar_head": True}))
    save_checkpoint(str(tmp_path / "rm.pt"), rm, None, {"task": "mul", "reverse": True}, 0, tok)
    with pytest.raises(CheckpointError, match="rm.pt: its config lacks 'lik_coef'"):
        rl.main(rl.Config(loss="ppo", reward="rm", rm_ckpt=str(tmp_path / "rm.pt"), sft_ckpt=sft_ckpt,
                          out_dir=str(tmp_path / "rl")))


def test_sampler_calls_hold_at_most_sample_batch_size_rows(sft_ckpt, monkeypatch):
    """--sample_batch_size chunks the sampler (rollouts, evals, eval KL) apart from the training
    micro-batches: no generate call holds more rows, and the rollout still has every row; 0 (the
    default) samples a round's rows in one call, and a split's in one."""
    from model import seeded
    from nanorl import evaluate
    sizes, generate = [], rl.generate
    monkeypatch.setattr(rl, "generate", lambda m, prompts, *a, G=1, **k: sizes.append(len(prompts) * G)
                        or generate(m, prompts, *a, G=G, **k))
    model, task = rl.load_policy(sft_ckpt, False, torch.device("cpu"))
    cfg = rl.Config(group_size=4, sample_batch_size=8, eval_samples=2, max_new_tokens=8)
    out = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, model, task), list(range(5)), seeded("cpu", 0), 4, 1.0)
    assert sizes == [8, 8, 4] and out.ids.size(0) == 20
    sizes.clear()
    monkeypatch.setattr(evaluate, "generate", rl.generate)
    task.val, task.test = task.test[:6], task.test[:10]
    evaluate.evaluate_policy(model, model, task, cfg, seeded("cpu", 1))
    assert sizes and max(sizes) <= 8
    sizes.clear()
    cfg = dataclasses.replace(cfg, sample_batch_size=0)
    rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, model, task), list(range(5)), seeded("cpu", 0), 4, 1.0)
    evaluate.evaluate_policy(model, model, task, cfg, seeded("cpu", 1))
    assert sizes == [20, 10, 20, 6]  # the rollout; test greedy, sampled x 2; val greedy


def test_cov_tokens_are_chosen_over_the_minibatch_from_the_current_policy(monkeypatch):
    """KL-Cov takes max(floor(0.002 * n_valid), 1) = 1 token per minibatch, however many micro-batches it is
    accumulated in (4 here); at a rollout's first optimizer step from the sampler's log-probs (theta = theta_old),
    later from a fresh no-grad forward of the moved policy."""
    model, batch = tiny_batch()
    seen, select = [], L.cov_select

    def spy(lp, old, adv, mask, *a, **k):
        seen.append((lp, old, mask, select(lp, old, adv, mask, *a, **k)))
        return seen[-1][-1]
    monkeypatch.setattr(L, "cov_select", spy)
    cfg = rl.Config(loss="kl_cov", group_size=4, micro_batch_size=4, ppo_epochs=2, minibatches=2)
    _, stats = update_once(cfg, model, batch)
    assert [int(sel.sum()) for *_, sel in seen] == [1, 1, 1, 1]  # not one per micro-batch of 4 rows
    assert stats["rl/cov_frac"] == pytest.approx(sum(1 / m.sum().item() for _, _, m, _ in seen) / 4)
    assert len(seen) == 4 and torch.equal(seen[0][0], seen[0][1])  # the first: the sampler's log-probs
    assert all((lp - old).abs().max() > 1e-4 for lp, old, *_ in seen[1:])  # the others: the policy has moved


def test_remax_baseline_is_each_prompts_greedy_reward(sft_ckpt, varied_reward):
    """ReMax samples a greedy response per prompt in the same step: its reward is the baseline of the
    prompt's G rows, and its mean is logged."""
    model, task = rl.load_policy(sft_ckpt, False, torch.device("cpu"))
    cfg = rl.Config(loss="remax", prompts_per_step=4, group_size=4, overlong_window=0, dynamic_sampling=False, max_new_tokens=8)
    row = L.ALGOS["remax"]
    batch, stats = rl.collect(cfg, row, make_run(cfg, model, task), torch.Generator().manual_seed(0))
    idx = rl.PromptSampler(len(task.train), 0, False).draw(4)
    greedy = rl.rollout(cfg, row, make_run(cfg, model, task), idx, None, 1, 0.0)
    assert torch.equal(batch.baseline, greedy.reward.repeat_interleave(4))
    assert stats["rl/greedy_reward"] == pytest.approx(greedy.reward.mean().item())


def test_remax_dynamic_sampling_counts_the_greedy_reward(monkeypatch):
    """An all-wrong group whose greedy answer is right has signal under ReMax (A = -1 on every row): kept;
    a group equal to its greedy reward is dropped."""
    def fake_rollout(cfg, row, run, idx, gen, G, temperature):
        if G == 1:  # the greedy responses
            return rl.rows.Rollout(*([None] * 4), reward=torch.tensor([1.0, 0.0]), length=torch.ones(2))
        correct = torch.zeros(8)
        return rl.rows.Rollout(torch.arange(8)[:, None], torch.zeros(8), torch.ones(8, 1), torch.zeros(8, 1),
                          reward=correct, score=correct, length=torch.ones(8),
                          finished=torch.ones(8, dtype=torch.bool))

    monkeypatch.setattr(rl, "rollout", fake_rollout)
    cfg = rl.Config(loss="remax", prompts_per_step=2, group_size=4, max_refills=0, max_new_tokens=8)
    batch, stats = rl.collect(cfg, L.ALGOS["remax"], make_run(cfg, None, char_task(list(range(10)))), None)
    assert batch.ids.flatten().tolist() == [0, 1, 2, 3] and batch.baseline.tolist() == [1.0] * 4
    assert stats["rl/zero_std_frac"] == 0.5 and stats["rl/greedy_reward"] == 0.5


def test_an_online_pairs_step_without_a_mixed_group_updates_nothing(sft_ckpt, tmp_path, monkeypatch):
    """No group holds a right and a wrong answer, so collect keeps none: the step logs n_groups 0
    and skips the update (it handed the train problems to the offline pairs reader)."""
    monkeypatch.setitem(VERIFIERS, "exact", lambda text, gold, reverse=False: 0.0)
    res, rows = run(sft_ckpt, tmp_path, loss="dpo", pairs="online", max_refills=1, eval_samples=0)
    train = [r for r in rows if "rl/n_groups" in r]
    assert len(train) == 2 and all(r["rl/n_groups"] == 0 and "rl/loss" not in r for r in train)
    assert all(torch.equal(p, q) for p, q in zip(res["model"].parameters(), res["ref"].parameters()))


@pytest.mark.parametrize("loss", ["grpo", "remax"])
def test_rollout_tok_s_counts_every_token_sampled(sft_ckpt, tmp_path, monkeypatch, varied_reward, loss):
    """Refills, dropped groups and ReMax's greedy answers all cost sampling time: each is counted."""
    sampled, real = [], rl.generate
    monkeypatch.setattr(rl, "generate", lambda *a, **k: sampled.append(real(*a, **k)) or sampled[-1])
    _, rows = run(sft_ckpt, tmp_path, loss=loss, max_refills=2, eval_samples=0)
    train = [r for r in rows if "perf/rollout_tok_s" in r]
    assert sum(r["rl/zero_std_frac"] for r in train) > 0  # some groups were dropped
    assert sum(r["perf/rollout_tokens"] for r in train) == sum(o["response_mask"].sum().item() for o in sampled)
    for r in train:
        assert r["perf/rollout_tok_s"] * r["perf/rollout_s"] == pytest.approx(r["perf/rollout_tokens"])


@pytest.mark.parametrize("loss", ["dpo", "kto", "simpo", "sft"])
def test_micro_batch_size_bounds_preference_and_sft_forwards(sft_ckpt, tmp_path, monkeypatch, loss):
    """--micro_batch_size is the memory knob of every row: no forward of a preference or sft step
    holds more rows, and micro-batches add up to the whole batch's loss and gradient."""
    import model as M
    from nanorl import pref
    sizes, real, step = [[]], M.response_forward, pref.step  # the step's forwards, not the evals'
    monkeypatch.setattr(M, "response_forward", lambda m, ids, *a, **k: sizes[-1].append(len(ids)) or real(m, ids, *a, **k))
    def recorded(*a):  # the forwards of the step go in a list of their own
        sizes.append([])
        out = step(*a)
        sizes.append([])
        return out
    monkeypatch.setattr(pref, "step", recorded)
    run(sft_ckpt, tmp_path, loss=loss, pairs_per_step=8, micro_batch_size=4, max_iters=1, eval_interval=100,
        eval_samples=0)
    assert sizes[1] and max(sizes[1]) <= 4 and sum(sizes[1]) >= 8
    model, task = rl.load_policy(sft_ckpt, False, torch.device("cpu"))
    row = L.ALGOS[loss]
    data = pref.data(rl.Config(loss=loss), row, task)[:8]
    rows, labels = (task.gold_rows(data), None) if row.data == "gold" else pref.record_rows(task.tok, data, True)
    grads = []
    for max_rows in (None, 3):
        model.zero_grad()
        loss_value, _ = pref.rows_loss(model, copy.deepcopy(model), task.tok.pad_id, rows, labels, row,
                                       L.resolve_hparams(loss), max_rows)
        grads.append((loss_value, [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    for g, h in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(h, g, atol=1e-6, rtol=1e-5)


def test_rl_takes_the_checkpoints_max_new_tokens_and_warns_when_no_answer_ends(sft_ckpt, tmp_path, capsys):
    """Unset, max_new_tokens is the SFT checkpoint's (a tool's traces need 80, not 8); a step in
    which every rollout was cut says so in its line, not silently "n_groups 0"."""
    ck = load_checkpoint(sft_ckpt)
    cfg = rl.setup(*rl.check(rl.Config(sft_ckpt=sft_ckpt)), torch.device("cpu"), 0, 1)[0]
    assert cfg.max_new_tokens == ck["config"]["max_new_tokens"] and rl.Config().max_new_tokens is None
    _, rows = run(sft_ckpt, tmp_path, max_new_tokens=1, eval_samples=0, max_iters=4)
    cut = [r["rl/sampled_truncated_frac"] == 1 for r in rows if "rl/n_groups" in r]
    lines = [line for line in capsys.readouterr().out.splitlines() if "/4 |" in line]  # the step lines
    assert any(cut) and cut == ["WARNING: every rollout ran out of max_new_tokens=1" in x for x in lines]


def test_prompt_selection_skips_the_groups_dynamic_sampling_found_flat(monkeypatch):
    """With turn rewards, a group lost in every game whose returns differ has a signal: it is trained
    on and not skipped on its next visit; a group whose returns are equal (its scores differ) is flat
    for both. Selection records what the flatness test reads: the return."""
    def fake_rollout(cfg, row, run, idx, gen, G, temperature):
        correct = torch.tensor([0., 0, 0, 0, 1, 0, 1, 0])  # lost everywhere; mixed
        turns = torch.tensor([[0.1], [0.2], [0.3], [0.4], [0.0], [1.0], [0.0], [1.0]])  # returns: differ; all 1
        return rl.rows.Rollout(torch.arange(8)[:, None], torch.zeros(8), torch.ones(8, 1), torch.zeros(8, 1),
                          reward=correct + turns[:, 0], score=correct, length=torch.ones(8),
                          finished=torch.ones(8, dtype=torch.bool), turn_rewards=turns)

    monkeypatch.setattr(rl, "rollout", fake_rollout)
    cfg = rl.Config(loss="grpo", prompts_per_step=2, group_size=4, max_refills=0, max_new_tokens=8)
    run = make_run(cfg, None, char_task(list(range(10))), selection=True)
    batch, stats = rl.collect(cfg, L.ALGOS["grpo"], run, None)
    idx = run.prompts.order[:2]  # the two prompts this step drew
    assert batch.ids.flatten().tolist() == [0, 1, 2, 3] and stats["rl/zero_std_frac"] == 0.5
    assert run.prompts.saturated == {idx[1]}


@pytest.mark.parametrize("kw, on", [(dict(loss="grpo"), True), (dict(loss="grpo", dynamic_sampling=False), False),
                                    (dict(loss="dpo", pairs="online"), True), (dict(loss="kto", pairs="online"), True),
                                    (dict(loss="opd", teacher_ckpt="t.pt"), False), (dict(loss="rft"), False)])
def test_dynamic_sampling_is_decided_once_in_check(kw, on):
    """Online pairs need a right and a wrong answer in every group: always on; a teacher's rows and
    the supervised baselines learn from no reward: off; the rest as the flag says."""
    assert rl.check(rl.Config(**kw))[0].dynamic_sampling is on


def test_pass_at_k_row_takes_its_k():
    """The pass_at_k row's advantages are losses.pass_k_advantages of each group at the row's k (a
    group of 4 with one right answer: 1 and -1/3 each at k = 2, 1.732 and -0.577 at k = 1)."""
    b = rl.rows.Rollout(ids=torch.zeros(8, 3, dtype=torch.long), offsets=torch.zeros(8), mu=None,
                        mask=torch.ones(8, 3))
    b.reward = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])
    cfg, algo = rl.Config(loss="pass_at_k", group_size=4), L.ALGOS["pass_at_k"]
    for k, right, wrong in ((2, 1.0, -1 / 3), (1, 3 ** 0.5, -1 / 3 ** 0.5)):
        hp = L.resolve_hparams("pass_at_k", pass_k=k)
        adv, inputs = rl.advantages_of(algo, hp)(cfg, algo, lone(hp), b)
        want = torch.tensor([right, wrong, wrong, wrong, 0, 0, 0, 0])
        torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)
    assert L.resolve_hparams("pass_at_k")["pass_k"] == 8 and algo.binary and inputs == {}


def test_the_reference_reads_the_rollout_at_the_sampling_temperature():
    """At step 1 the reference is the policy: its log-probs of a rollout sampled at temperature 0.7 are
    the sampler's, to fp32 rounding, so the KL term starts at 0."""
    model, b = tiny_batch(temperature=0.7)
    cfg = rl.Config(loss="grpo", beta=0.04, temperature=0.7, group_size=4, log_rollouts=0)
    run, _ = update_once(cfg, model, b)
    _, batch, _, _, inputs = run.trained
    assert torch.allclose(inputs["ref_logp"], b.old_logp, atol=1e-5)
    run.state = SimpleNamespace(step=1)
    assert abs(rl.after_step(run)["rl/kl"]) < 1e-6
