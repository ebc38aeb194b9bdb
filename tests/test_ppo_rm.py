"""PPO's value head and the RLHF path: reward_model.py trains a Bradley-Terry RM, rl.py --reward=rm
scores rollouts with it, and bad RM checkpoints fail with one clear line."""
import json
import math

import pytest
import torch

import losses as L
import reward_model
import rl
from nanorl.config import UserError
from nanorl.checkpoint import load_checkpoint, save_checkpoint
from model import GPT, GPTConfig, logprobs
from tokenizer import CharTokenizer

from test_rl import run, varied_reward  # noqa: F401 (a fixture)

TINY_RM = dict(batch_size=16, max_iters=20, eval_interval=20, policy_samples=1, eval_policy_samples=2, threads=1)


def test_reward_model_trains_and_reports_per_kind(rm_ckpt):
    path, m, out = rm_ckpt
    kinds = ["carry", "last_digit", "length", "neighbour", "swap"]
    assert all(0 <= m[f"eval/pair_accuracy/{k}"] <= 1 for k in kinds)
    assert 0 <= m["eval/policy_pair_accuracy"] <= 1 and 0 <= m["val/pair_accuracy"] <= 1
    assert 0 <= m["val/policy_pair_accuracy"] <= 1
    ck = load_checkpoint(path)
    assert ck["model_args"]["scalar_head"] and ck["step"] == 20
    rows = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval/pair_accuracy" in r] == [0, 20]


def test_rm_score_is_the_head_at_eos_plus_the_answer_log_likelihood():
    """s = head(h at the last response token) + lik_coef * sum_t log p(answer token t), by hand per
    unpadded row; rl.py's left-padded rollout rows score the same as reward_model.py's right-padded ones."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=16, scalar_head=True)).eval()
    rows = [([3, 4, 5], [6, 1]), ([3, 4], [7, 8, 1])]
    for coef in (0.0, 0.5):
        s, logp, mask = reward_model.scores(model, rows, 0, coef)
        for i, (p, r) in enumerate(rows):  # each row alone, no padding
            logits, full = model(torch.tensor([p + r]), return_scalar=True)
            lp = torch.log_softmax(logits[0, len(p) - 1:-1], -1)[torch.arange(len(r)), torch.tensor(r)]  # (len(r),)
            assert s[i].item() == pytest.approx(full[0, -1].item() + coef * lp.sum().item(), abs=1e-5)
            assert torch.allclose(logp[i][mask[i].bool()], lp, atol=1e-5)
    rollout = rl.rows.Rollout(torch.tensor([[3, 4, 5, 6, 1, 0], [0, 3, 4, 7, 8, 1]]), torch.tensor([0, 1]),
                         torch.tensor([[1, 1, 0], [1, 1, 1]]), None)  # prompts left-padded to 3
    assert torch.allclose(rl.RewardModel(model, 0.5)(rollout), s, atol=1e-5)


def test_only_ppo_trains_a_value_head(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    res, rows = run(sft_ckpt, tmp_path / "ppo", loss="ppo", lr=1e-3, max_iters=3, eval_interval=3)
    head = res["model"].score_head
    assert head is not None and head.weight.abs().sum() > 0  # starts at exactly zero
    train = [r for r in rows if "rl/value_loss" in r]
    assert len(train) == 3 and all(math.isfinite(r["rl/explained_variance"]) for r in train)
    assert {"rl/approx_kl", "rl/clipfrac_low", "rl/values_mean", "rl/value_target_mean", "rl/kl"} <= set(train[-1])
    res, _ = run(sft_ckpt, tmp_path / "grpo", loss="grpo", max_iters=1, eval_interval=1)
    assert res["model"].score_head is None


def test_ppo_value_is_the_head_times_the_policy_probability_of_the_path_so_far():
    """V_t = head(h_t) * pi(y_<t | x): exactly the head at the first response token, and detached from
    the policy's log-probs (the value loss never pushes on the log-probs through the path probability)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=16, n_layer=1, n_head=2, n_embd=16, scalar_head=True))
    ids, P = torch.tensor([[3, 4, 5, 6, 7, 1], [0, 3, 4, 8, 1, 0]]), 3
    offsets, mask = torch.tensor([0, 1]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    logp, values_head, _ = logprobs(model, ids, offsets, mask, scalar=True)
    v = L.prefix_value(values_head, logp)
    _, head = model(ids, offsets, return_scalar=True)
    head = head[:, P - 1:-1]  # (2, 3) the state before each response token
    path = torch.exp(torch.nn.functional.pad(logp, (1, 0))[:, :-1].cumsum(1))
    assert torch.allclose(v, torch.where(mask.bool(), head * path, 0.0), atol=1e-6)  # the head runs where read
    assert torch.allclose(v[:, 0], head[:, 0], atol=1e-6)
    assert torch.autograd.grad(v.sum(), logp, allow_unused=True)[0] is None


def test_adaptive_kl_controller_moves_beta(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    """At step 1 the policy is the reference: KL 0 is below any target, so beta shrinks by the
    controller's largest step, 1 - 0.2 * (rollout rows) / 10000."""
    _, rows = run(sft_ckpt, tmp_path, loss="ppo", kl_target=0.01, max_iters=2)
    train = [r for r in rows if "rl/beta" in r]
    assert train[0]["rl/beta"] == 0.05 and abs(train[0]["rl/kl_k1_seq"]) < 1e-6
    assert train[1]["rl/beta"] == pytest.approx(0.05 * (1 - 0.2 * train[0]["rl/n_groups"] * 4 / 10000))


def test_ppo_with_reward_model(sft_ckpt, rm_ckpt, tmp_path):  # noqa: F811
    _, rows = run(sft_ckpt, tmp_path, loss="ppo", reward="rm", rm_ckpt=rm_ckpt[0])
    train = [r for r in rows if "rl/rm_reward" in r]
    assert len(train) == 2 and all(math.isfinite(r["rl/rm_reward"]) and 0 <= r["rl/accuracy"] <= 1 for r in train)


def test_bad_reward_model_checkpoints(sft_ckpt, tmp_path):  # noqa: F811
    with pytest.raises(Exception, match="no such checkpoint.*reward_model.py"):
        rl.main(rl.Config(loss="ppo", reward="rm", rm_ckpt=str(tmp_path / "none.pt"), sft_ckpt=sft_ckpt))
    with pytest.raises(UserError, match="not a reward model"):
        rl.main(rl.Config(loss="ppo", reward="rm", rm_ckpt=sft_ckpt, sft_ckpt=sft_ckpt))
    other = CharTokenizer("0123456789*=")
    model = GPT(GPTConfig(block_size=32, vocab_size=other.vocab_size, n_layer=1, n_head=2, n_embd=32, scalar_head=True))
    save_checkpoint(str(tmp_path / "rm.pt"), model, tokenizer=other)
    with pytest.raises(UserError, match="tokenizer differs"):
        rl.main(rl.Config(loss="ppo", reward="rm", rm_ckpt=str(tmp_path / "rm.pt"), sft_ckpt=sft_ckpt))
    with pytest.raises(UserError, match="gapo needs the verifier"):
        rl.main(rl.Config(loss="gapo", reward="rm", sft_ckpt=sft_ckpt))


def test_remax_scores_samples_and_their_greedy_baseline_on_one_scale(sft_ckpt, rm_ckpt):  # noqa: F811
    """ReMax with --reward=rm: the samples and each prompt's greedy response are normalised with one
    set of running statistics, which the samples alone update; so a sample identical to its prompt's
    greedy response gets advantage exactly 0."""
    from model import responses
    from nanorl.rm import RewardModel
    from test_rl import lone, make_run
    model, task = rl.load_policy(sft_ckpt, False, torch.device("cpu"))
    rm = RewardModel.load(rm_ckpt[0], task.tok, torch.device("cpu"))
    cfg = rl.Config(loss="remax", reward="rm", prompts_per_step=8, group_size=4, dynamic_sampling=False, max_new_tokens=8,
                    overlong_window=0, temperature=0.3)  # peaked: samples repeat the greedy answer
    row = L.ALGOS["remax"]
    batch, _ = rl.collect(cfg, row, make_run(cfg, model, task, rm=rm), torch.Generator().manual_seed(0))
    assert rm.n == 32  # the 32 samples; the 8 greedy rows leave the statistics alone
    idx = rl.PromptSampler(len(task.train), 0, False).draw(8)
    greedy = responses(rl.rollout(cfg, row, make_run(cfg, model, task), idx, None, 1, 0.0))
    same = torch.tensor([r == greedy[i // 4] for i, r in enumerate(responses(batch))])  # (32,)
    hp = L.resolve_hparams("remax")
    adv, _ = rl.advantages_of(row, hp)(cfg, row, lone(hp), batch)
    assert same.sum() >= 2 and (adv[same] == 0).all() and (adv[~same] != 0).any()
