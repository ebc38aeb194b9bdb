"""Environments (nanorl/episodes.py, envs/guess.py): the game's rules by hand and fuzzed, its
demonstrations replayed, the sampler with a state per row (masks, log-probs, rewards on each turn's
last token, prefix sharing across secrets), per-turn rewards through every kind of advantage by
hand, the leak test over several turns, and the game end to end (resume with queued rollouts,
torchrun)."""
import copy
import functools
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st

import losses as L
import rl
import sft
from data.tasks import DataError
from envs import guess
from model import GPT, GPTConfig, generate, logprobs, responses
from nanorl.episodes import Episodes, demo_rows, play_demo
from bench.guess import binary_search
from nanorl import evaluate
from nanorl.evaluate import Task, env_of, task_alphabet
from tests.test_rl import lone, make_run
from tests.test_tools import assert_no_leak, end, with_turn_credit
from tokenizer import CharTokenizer
from verify import episode_return

GUESS = env_of("env:guess")
TOK = CharTokenizer(task_alphabet("env:guess", guess.splits()["test"]))
PROMPT = TOK.encode(guess.PROMPT)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def episodes(secrets, G=1, **args):
    return Episodes(GUESS, [(guess.PROMPT, str(s)) for s in secrets], G, TOK, False, args)


def play(env, r, turns):
    """Row r's turns (texts) through env as the sampler would -> the response's text."""
    ids = []
    for t in turns:
        ids += TOK.encode(t + "|")
        ids += end(env, r, ids)[0]
    return TOK.decode(ids) + ("<eos>" if ids[-1:] == [TOK.eos_id] else "")


# ---------------------------------------------------------------- the game


def test_the_game_by_hand():
    """Secret 37: `<` lower, `>` higher; the interval shrinks, a guess outside it is inconsistent
    but still answered; the win ends the episode (EOS forced); the score is the win."""
    env = episodes([37])
    assert play(env, 0, ["50", "25", "60", "26", "49", "37"]) == "50|<25|>60|<26|>49|<37|=<eos>"
    game = env.envs[0]  # 26 and 49, the interval's ends after 50 and 25, are consistent; 60 is not
    assert (game.lo, game.hi, game.turns, game.won, game.inconsistent, game.invalid) == (37, 37, 6, True, 1, 0)
    assert game.guesses == [50, 25, 60, 26, 49, 37] and env.score(0, "") == 1.0
    lost = episodes([37])
    assert play(lost, 0, ["1", "2", "3", "4", "5", "6", "7"]) == "1|>2|>3|>4|>5|>6|>7|><eos>"
    assert lost.score(0, None) == 0.0 and lost.envs[0].turns == 7


@pytest.mark.parametrize("turn", ["abc", "0", "101", "007", "٣", "", "5 ", " 5", "-5", "+5", "5.0", "1" * 5000])
def test_every_output_gets_an_answer_and_counts_a_turn(turn):
    """A non-number, out of range, leading zeros, unicode digits, whitespace, a sign, 5,000 digits
    (past Python's int limit), an empty turn: `?`, a turn spent, counted invalid, never an error."""
    game = guess.Env("5")
    assert game.step(turn) == ("?", 0.0, False) and (game.turns, game.invalid) == (1, 1)
    if set(turn) <= set(TOK.chars):  # as the sampler hands it over
        env = episodes([5])
        assert end(env, 0, TOK.encode(turn + "|")) == (TOK.encode("?"), 0.0) and env.envs[0].invalid == 1


def test_a_special_token_inside_a_turn_and_turns_after_the_end():
    """A special token in a turn: `?`; after the end nothing changes."""
    env = episodes([5])
    ids = TOK.encode("1") + [TOK.pad_id] + TOK.encode("|")
    assert end(env, 0, ids) == (TOK.encode("?"), 0.0) and env.envs[0].invalid == 1
    game = guess.Env("5")
    for _ in range(7):
        game.step("x")
    assert game.step("5") == ("", 0.0, True) and game.invalid == 7 and not game.won


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, TOK.vocab_size - 1), max_size=60), st.integers(1, 100))
def test_any_ids_get_a_bounded_answer(ids, secret):
    env = episodes([secret])
    obs, reward = end(env, 0, ids + TOK.encode("|"))
    assert TOK.decode(obs) in ("<", ">", "=", "?") and reward == 0.0
    assert obs[-1:] != [TOK.eos_id] or env.envs[0].won


def test_process_reward_is_the_share_of_the_interval_ruled_out():
    """log2(before / after) / log2(100) per turn: 100 -> 49 -> 24 -> 1 (the win); the turns of a
    won game sum to 1; an inconsistent or invalid guess rules nothing out."""
    game = guess.Env("37", process_reward=True)
    rewards = [game.step(t)[1] for t in ("50", "70", "x", "25", "37")]
    want = [math.log2(100 / 49), 0, 0, math.log2(49 / 24), math.log2(24 / 1)]
    assert rewards == pytest.approx([w / math.log2(100) for w in want])
    assert sum(rewards) == pytest.approx(1.0)


@pytest.mark.parametrize("empty", ["train", "val", "test"])
def test_an_environment_with_an_empty_split_is_one_line(monkeypatch, empty):
    """An env: task whose splits() gives an empty split stops where its splits load, naming it,
    not at the first eval (a division by its size 0)."""
    splits = {s: [] if s == empty else guess.splits(4)[s] for s in ("train", "val", "test")}
    monkeypatch.setattr(evaluate, "env_of", lambda name: SimpleNamespace(splits=lambda: splits))
    with pytest.raises(DataError, match=rf"^task 'env:empty': its {empty} split is empty$"):
        evaluate.task_splits("env:empty")


def test_binary_search_is_the_limit():
    turns = [binary_search(s) for s in range(1, 101)]
    assert max(turns) == 7 and sum(turns) / 100 == 5.80 and binary_search(50) == 1


def test_every_demonstration_replays_through_the_environment():
    """All 20,000 train games: each guess is consistent and its answer the environment's; a game
    ends on the win or at 7 turns; the random consistent player wins about half (0.507)."""
    problems = guess.splits()["train"]
    rows = demo_rows(GUESS, problems, TOK, False)
    wins = 0
    for (prompt, ids, mask), (_, answer) in zip(rows, problems):
        parts = TOK.decode(ids).split("|")  # "50", "<25", ..., "=": an answer, then a guess
        game = guess.Env(answer)
        for turn, obs in zip([parts[0]] + [p[1:] for p in parts[1:-1]], [p[0] for p in parts[1:]]):
            lo, hi = game.lo, game.hi
            assert game.step(turn)[0] == obs and lo <= int(turn) <= hi  # the env's; consistent
        assert ids[-1] == TOK.eos_id and mask[-1] == 0  # the game ends it, not the policy
        assert game.won or game.turns == 7
        assert [m for t, m in zip(TOK.decode(ids), mask) if t in "<>=?"] == [0] * (len(parts) - 1)
        wins += game.won
    assert prompt == PROMPT and 0.49 < wins / len(rows) < 0.53


# ---------------------------------------------------------------- the sampler


def tiny_model(seed=0, values=False):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=48, vocab_size=TOK.vocab_size, n_layer=2, n_head=2, n_embd=32,
                         scalar_head=values)).eval()


def sample(model, secrets, G=4, seed=0, use_cache=True, max_new_tokens=40, **args):
    games = episodes(secrets, G, **args)
    out = generate(model, [PROMPT] * len(secrets), max_new_tokens, TOK.eos_id, TOK.pad_id, G=G,
                   generator=torch.Generator().manual_seed(seed), use_cache=use_cache, episodes=games)
    return out, games


def biased(model, text):
    """model's logits pushed towards the characters of text (a policy that guesses them)."""
    bias = torch.zeros(TOK.vocab_size)
    bias[TOK.encode(text)] = 30.0
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)


def test_sampler_runs_a_state_per_row_and_matches_the_trainer():
    """Observations forced after each `|` (action 0, log-prob 0, counted in max_new_tokens), the
    turn's reward on its `|`, cached = uncached, trainer = sampler on the policy's tokens."""
    model = tiny_model()
    hook = biased(model, "0123456789|")  # mostly numbers and turn ends: several turns a row
    try:
        (out, env), (plain, _) = sample(model, [3, 50, 97], process_reward=True), \
            sample(model, [3, 50, 97], use_cache=False, process_reward=True)
        lp = logprobs(model, out["ids"], out["offsets"], out["action_mask"][:, out["prompt_len"]:])[0]
    finally:
        hook.remove()
    for k in ("ids", "response_mask", "action_mask", "turn_rewards"):
        assert torch.equal(out[k], plain[k]), k
    P = out["prompt_len"]
    act, ids = out["action_mask"][:, P:], out["ids"][:, P:]
    ends = (act == 1) & (ids == TOK.encode("|")[0])  # (N, L)
    assert ends.sum(1).tolist() == env.turns and max(env.turns) >= 3
    assert ((out["turn_rewards"] != 0) <= ends).all() and (out["turn_rewards"] > 0).any()
    after = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # the observation's place
    live = after & (out["response_mask"][:, P:] == 1)
    assert (act[live] == 0).all() and (out["logps"][act == 0] == 0).all()
    torch.testing.assert_close(lp, out["logps"], atol=2e-5, rtol=0)


def test_rows_of_one_text_split_when_their_secrets_answer_differently():
    """Secrets 2 and 98 behind one prompt text: a guess such as 5 gets `<` in one game and `>` in
    the other, and from there the rows part; prefix sharing keeps every row as an uncached run
    gives it (ids, masks, log-probs)."""
    model = tiny_model(seed=2)
    hook = biased(model, "50|")
    try:
        out, _ = sample(model, [2, 98], G=4, max_new_tokens=12, seed=3)
        plain, _ = sample(model, [2, 98], G=4, max_new_tokens=12, seed=3, use_cache=False)
    finally:
        hook.remove()
    for k in ("ids", "response_mask", "action_mask"):
        assert torch.equal(out[k], plain[k]), k
    torch.testing.assert_close(out["logps"], plain["logps"], atol=1e-5, rtol=0)
    P = out["prompt_len"]
    first = [TOK.decode(r).split("|")[:2] for r in out["ids"][:, P:].tolist()]  # turn, answer + ...
    assert any(a[0] == b[0] and a[1][:1] != b[1][:1] for a in first[:4] for b in first[4:])


class Chatty:
    """An environment that answers too much and never ends: the bounds must."""
    stops, max_turns, max_obs = ("|",), 3, 2

    def __init__(self, answer):
        self.invalid = 0

    def step(self, turn):
        return "<<<<", 0.5, False

    def score(self, final):
        return 0.0


class Finals:
    """An environment that scores what the policy wrote last: 1 for any text, even "", 0.5 for None."""
    stops, max_turns, max_obs = ("|",), 3, 2

    def __init__(self, answer):
        self.invalid = 0

    def score(self, final):
        return 0.5 if final is None else 1.0


def test_an_unfinished_episode_is_scored_with_none():
    """final None: the policy never ended with EOS; "": it ended with nothing after the last answer."""
    env = Episodes(SimpleNamespace(Env=Finals), [("1-100:", "1"), ("1-100:", "2")], 1, TOK, False, {})
    assert (env.score(0, None), env.score(1, "")) == (0.5, 1.0)


def test_observations_are_cut_to_max_obs_and_episodes_end_after_max_turns():
    from types import SimpleNamespace
    env = Episodes(SimpleNamespace(Env=Chatty), [("1-100:", "1")], 1, TOK, False, {})
    assert play(env, 0, ["1", "2", "3"]) == "1|<<2|<<3|<<<eos>"
    assert env.turns == [3]
    ids, mask = play_demo(SimpleNamespace(Env=Chatty), ("1-100:", "1"), ["1", "2", "3", "4"], "5", TOK, False)
    assert TOK.decode(ids) == "1|<<2|<<3|<<" and mask == [1, 1, 0, 0] * 3 + [0]


# ---------------------------------------------------------------- rewards by hand


def three_turns():
    """One row: a1 e a2 a3 e a4 e(EOS): turns end at 0, 2 (rewards 0.2, 0.3) and 4 (0.5), the
    final score 1, the environment's tokens at 1, 3, 5."""
    mask = torch.tensor([[1, 0, 1, 1, 0, 1, 0]])
    turn = torch.tensor([[0.2, 0, 0, 0.3, 0, 0.5, 0]])
    b = rl.rows.Rollout(torch.zeros(1, 9, dtype=torch.long), torch.zeros(1), mask, torch.zeros(1, 7),
                   torch.zeros(1, 7), torch.tensor([2.0]), torch.tensor([1.0]), length=torch.tensor([7.0]),
                   finished=torch.ones(1, dtype=torch.bool), turn_rewards=turn)
    b.values = torch.tensor([[0.5, 9.0, 0.4, 0.3, 9.0, 0.6, 9.0]])  # the env's: never read
    return b


def test_token_rows_see_every_turns_reward_at_its_position_across_the_gaps():
    """GAE (gamma 0.9, lam 0.8): r = (0.2, 0.3, 0.5 + 1) on the policy's tokens 0, 3, 5 (their
    turns' last), 0 at 2; the environment's positions skipped. REINFORCE++: the return-to-go."""
    b, g, lam = three_turns(), 0.9, 0.8
    hp = L.resolve_hparams("ppo", beta=0.0, gamma=g, lam=lam)
    adv, extra = rl.token_kind(rl.Config(group_size=1), L.ALGOS["ppo"], lone(hp), b)
    r, v = [0.2, 0.0, 0.3, 1.5], [0.5, 0.4, 0.3, 0.6]  # the policy's tokens 0, 2, 3, 5
    a, nxt_a, nxt_v = [0.0] * 4, 0.0, 0.0
    for t in reversed(range(4)):
        nxt_a = r[t] + g * nxt_v - v[t] + g * lam * nxt_a
        a[t], nxt_v = nxt_a, v[t]
    raw = torch.tensor([[a[0], 0, a[1], a[2], 0, a[3], 0]])
    torch.testing.assert_close(extra["value_targets"], torch.where(b.mask.bool(), raw + b.values, 0.0))
    torch.testing.assert_close(adv, L.whiten(raw, b.mask))
    adv, _ = rl.token_kind(rl.Config(group_size=1), L.ALGOS["reinforce_pp"], lone(L.resolve_hparams("reinforce_pp", beta=0.0)), b)
    togo = torch.tensor([[2.0, 0, 1.8, 1.8, 0, 1.5, 0]])  # 0.2 + 0.3 + 1.5, ...
    torch.testing.assert_close(adv, L.whiten(togo, b.mask))


def test_sequence_rows_use_the_episode_return():
    """GRPO's advantage of a group reads each row's return: final score + its turns' rewards."""
    b = three_turns()
    two = rl.cat([b, copy.deepcopy(b)])
    two.reward = torch.tensor([2.0, 1.0])  # 1 + (0.2 + 0.3 + 0.5); a loss with no reward at all
    hp = L.resolve_hparams("grpo")
    adv, _ = rl.advantages_of(L.ALGOS["grpo"], hp)(rl.Config(loss="grpo", group_size=2), L.ALGOS["grpo"],
                                                   lone(hp), two)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)
    assert episode_return(b.score, b.turn_rewards).tolist() == [pytest.approx(2.0)]


def test_rollout_puts_the_turns_rewards_in_the_return(monkeypatch):
    """rl.rollout on the game with process rewards: reward = the win + the turns' rewards, their
    sum at most 1 + 1; binary rows refuse an environment that pays every turn."""
    task = Task(TOK, "env:guess", False, "exact", 0, guess.splits()["test"], env_module=GUESS,
                env_args={"process_reward": True})
    model = tiny_model()
    hook = biased(model, "0123456789|")
    try:
        cfg = rl.Config(loss="grpo", group_size=4, max_new_tokens=40, overlong_window=0)
        b = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, model, task), list(range(8)),
                       torch.Generator().manual_seed(0), 4, 1.0)
        with pytest.raises(rl.UserError, match="maxrl needs 0/1 rewards"):
            cfg = rl.Config(loss="maxrl", group_size=4, max_new_tokens=40, overlong_window=0)
            rl.rollout(cfg, L.ALGOS["maxrl"], make_run(cfg, model, task), list(range(8)),
                       torch.Generator().manual_seed(0), 4, 1.0)
    finally:
        hook.remove()
    torch.testing.assert_close(b.reward, b.score + b.turn_rewards.sum(1))
    assert (b.turn_rewards.sum(1) <= 1 + 1e-6).all() and (b.turn_rewards > 0).any()
    assert b.turns.tolist() == ((b.mask == 1) & (b.ids[:, -b.mask.size(1):] == TOK.encode("|")[0])).sum(1).tolist()


def test_episode_return_is_the_score_plus_the_turns_rewards_by_hand():
    b = three_turns()  # final score 1, turns 0.2 + 0.3 + 0.5
    b.turns, b.invalid = torch.tensor([3.0]), torch.tensor([0.0])
    assert rl.rollout_metrics(b)["rl/episode_return"] == pytest.approx(2.0)


def test_every_row_replays_through_its_own_groups_secret():
    """rl.rollout on 4 secrets x 4 games: each row's turns, stepped through a fresh Env of its
    group's secret, give the observations forced into it, its turn rewards, turns and score."""
    secrets = [3, 40, 77, 99]
    task = Task(TOK, "env:guess", False, "exact", 0, [(guess.PROMPT, str(s)) for s in secrets], env_module=GUESS,
                env_args={"process_reward": True})
    model = tiny_model(seed=3)
    hook = biased(model, "0123456789|")
    try:
        cfg = rl.Config(loss="grpo", group_size=4, max_new_tokens=40, overlong_window=0)
        b = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, model, task), [0, 1, 2, 3],
                       torch.Generator().manual_seed(5), 4, 1.0)
    finally:
        hook.remove()
    bar = TOK.encode("|")[0]
    for r, ids in enumerate(responses(b)):
        game, act = guess.Env(str(secrets[r // 4]), process_reward=True), b.mask[r].tolist()
        start, rewards = 0, torch.zeros_like(b.turn_rewards[r])
        for t, tok in enumerate(ids):
            if act[t] and tok == bar:  # the turn ends: the environment's answer follows
                obs, rewards[t], done = game.step(TOK.decode(ids[start:t]))
                forced = (TOK.encode(obs) + [TOK.eos_id] * done)[:len(ids) - t - 1]  # max_new_tokens cuts
                assert ids[t + 1:t + 1 + len(forced)] == forced and not any(act[t + 1:t + 1 + len(forced)])
                start = t + 1 + len(forced)
        assert torch.allclose(rewards, b.turn_rewards[r]) and b.turns[r] == game.turns
        assert b.score[r] == game.score(None) and b.invalid[r] == game.invalid
    assert len({tuple(x) for x in b.turn_rewards.tolist()}) > 4 and b.score.sum() > 0


# ---------------------------------------------------------------- no leak over several turns


@functools.lru_cache(maxsize=1)
def game_rollout():
    """Games of a tiny model that guesses a lot (4 groups of 4, process rewards): rows of 3
    turns and more, every group mixed 0/1."""
    secrets = [3, 40, 77, 99]
    model = tiny_model(seed=3)
    hook = biased(model, "0123456789|")
    try:
        out, env = sample(model, secrets, G=4, seed=5, process_reward=True)
    finally:
        hook.remove()
    P, N = out["prompt_len"], len(out["ids"])
    act, n = out["action_mask"][:, P:], out["response_mask"][:, P:].sum(1)
    reward = torch.tensor([1.0, 0.0] * (N // 2))
    turns, invalid = env.stats()
    b = rl.rows.Rollout(out["ids"], out["offsets"], act, out["logps"], out["logps"], reward + out["turn_rewards"].sum(1),
                   reward, torch.full((N,), -1), n.float(), torch.ones(N, dtype=torch.bool),
                   turn_rewards=out["turn_rewards"], turns=turns, invalid=invalid)
    assert (turns >= 3).sum() >= N // 2 and (out["turn_rewards"] != 0).any()
    return b


@pytest.mark.parametrize("name", sorted(L.ALGOS))
def test_observation_logits_of_every_turn_never_reach_a_loss_or_its_gradient(name, monkeypatch):
    """Logits moved at the observations of turns 1, 2, 3 and on: every row's loss and gradient are
    unchanged (tests/test_tools.py's leak test, on games)."""
    b = copy.deepcopy(game_rollout())
    if L.ALGOS[name].data == "samples":  # rft: the correct rows
        b.score = (b.score == 1).float()
    if L.ALGOS[name].binary:  # 0/1 rewards only
        b.turn_rewards, b.reward = torch.zeros_like(b.turn_rewards), b.score.clone()
    gold = Task(TOK, "env:guess", False, "exact", 0, env_module=GUESS).gold_rows(guess.splits()["test"][:8])
    with_turn_credit(b, name)  # VinePPO's values, GiGPO's states: any will do
    assert_no_leak(name, b, monkeypatch, model_fn=tiny_model, gold=gold)


@pytest.mark.parametrize("name", ["grpo", "reinforce_pp", "dpo"])
def test_the_game_leak_test_fails_when_the_action_mask_is_ignored(name, monkeypatch):
    b = copy.deepcopy(game_rollout())
    b.mask = (torch.arange(b.mask.size(1)) < b.length[:, None]).long()  # (N, L) every token
    gold = Task(TOK, "env:guess", False, "exact", 0, env_module=GUESS).gold_rows(guess.splits()["test"][:8])
    with pytest.raises(AssertionError):
        assert_no_leak(name, b, monkeypatch, model_fn=tiny_model, gold=gold)


# ---------------------------------------------------------------- the game end to end

TINY_GUESS = dict(task="env:guess", reverse=False, block_size=48, max_new_tokens=40, n_layer=1, n_head=2,
                  n_embd=32, batch_size=32, lr=3e-3, warmup_iters=5, max_iters=40, eval_interval=40,
                  eval_samples=0, threads=1, bf16=False)
TINY_RL = dict(max_iters=4, eval_interval=3, ckpt_interval=100, prompts_per_step=4, group_size=4, eval_samples=2,
               threads=1, env_args={"process_reward": True})


@pytest.mark.parametrize("loss, kw", [("grpo", dict(staleness=1)), ("ppo", {}),
                                      ("reinforce_pp", dict(count_bonus=0.3, temperature_start=1.3)),
                                      ("vineppo", dict(value_table=0.1, dynamic_sampling=False))])
def test_a_resumed_game_run_is_exact_with_its_queued_episodes(guess_ckpt, tmp_path, monkeypatch, loss, kw):
    """Interrupted in step 2 and resumed: the same weights and metrics as one whole run; with
    staleness 1 the queued rollout keeps each row's turn rewards, turns and invalid turns; with
    a count bonus the counts N(s, a) and the schedule resume too, with a value table its values."""
    from test_reliability import rows, same_weights, signal_on_call
    cfg = dict(TINY_RL, sft_ckpt=guess_ckpt, loss=loss, **kw)
    whole = rl.main(rl.Config(out_dir=str(tmp_path / "whole"), **cfg))
    signal_on_call(monkeypatch, rl, "collect", 2)
    rl.main(rl.Config(out_dir=str(tmp_path / "cut"), **cfg))
    queued = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["ranks"][0]["queue"]
    assert len(queued) == kw.get("staleness", 0) and all("turn_rewards" in b and "invalid" in b for b, _ in queued)
    monkeypatch.undo()
    resumed = rl.main(rl.Config(out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    assert same_weights(whole["model"].state_dict(), resumed["model"].state_dict(), tol=0)
    got, want = rows(tmp_path / "cut" / "metrics.jsonl"), rows(tmp_path / "whole" / "metrics.jsonl")
    assert got == want and any("rl/episode_return" in r for r in got)
    train = [r for r in got if "rl/turns" in r]
    assert train and all(0 <= r["rl/invalid_frac"] <= 1 and r["rl/env_token_frac"] > 0 for r in train)


def test_torchrun_plays_the_game_on_two_ranks(guess_ckpt, tmp_path):
    """Each rank plays its own share of the secrets (task.train[rank::2]) and the run finishes."""
    port = __import__("test_ddp").free_port()
    args = [f"--sft_ckpt={guess_ckpt}", f"--out_dir={tmp_path}", "--loss=grpo", "--prompts_per_step=4",
            "--group_size=4", "--max_iters=2", "--eval_samples=0", "--eval_interval=100", "--threads=1",
            '--env_args={"process_reward": true}']
    procs = [subprocess.Popen([sys.executable, "rl.py", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                              "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"})
             for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    train = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if "rl/turns" in line]
    assert len(train) == 2 and all(r["rl/turns"] > 0 for r in train)


def test_sample_plays_the_game_of_a_given_secret(guess_ckpt, tmp_path, capsys):
    """--prompt is the prompt verbatim and --answer its secret; a file's lines are prompt<TAB>answer. Each
    printed turn is the policy's guess and the answer of an Env of that secret."""
    import sample
    from nanorl.config import load_config
    (tmp_path / "games.txt").write_text("1-100:\t37\n1-100:\t5\n")
    for args, secrets in ((["--prompt=1-100:", "--answer=37"], [37]), ([f"--prompts_file={tmp_path / 'games.txt'}"], [37, 5])):
        sample.main(load_config(sample.Config, [f"--ckpt={guess_ckpt}", *args]))
        out = capsys.readouterr()
        games = out.out.split("1-100:\n")[1:]
        assert len(games) == len(secrets) and f"/{len(secrets)})" in out.err
        for secret, game in zip(secrets, games):
            env, lines = guess.Env(str(secret)), game.strip().split("\n")
            for line in lines[:-1]:
                turn, _, obs = line.strip().partition("  ")  # "50|  <"
                assert env.step(turn.removesuffix("|"))[0] == obs
            assert lines[-1].strip() == f"score {env.score(None)}"
    with pytest.raises(rl.UserError, match="--answer is --prompt's gold answer"):
        sample.main(load_config(sample.Config, [f"--ckpt={guess_ckpt}", "--split=test", "--answer=3"]))


def test_resume_without_the_runs_env_args_is_refused(guess_ckpt, tmp_path):
    """A process-reward run resumed without its --env_args would train on wins only."""
    cfg = dict(TINY_RL, sft_ckpt=guess_ckpt, loss="reinforce_pp", max_iters=1, out_dir=str(tmp_path))
    rl.main(rl.Config(**cfg))
    with pytest.raises(rl.UserError, match=r"cannot resume with env_args=\{\}: the run has env_args=\{'process_reward': "
                                           r"True\}, and a resumed run trains on what it did"):
        rl.main(rl.Config(**{**cfg, "env_args": {}, "resume": True}))


class NoInvalid:
    """An Env without `invalid`: the contract (nanorl/episodes.py's Env) says it must count them."""
    stops, max_turns, max_obs = ("|",), 3, 2

    def __init__(self, answer):
        pass

    def step(self, turn):
        return "<", 0.0, False

    def score(self, final):
        return 0.0


def test_an_environment_that_breaks_the_contract_stops_the_load_in_one_line(tmp_path, monkeypatch):
    from types import SimpleNamespace
    from nanorl.episodes import check_env
    broken = SimpleNamespace(__name__="envs.broken", Env=NoInvalid)
    with pytest.raises(rl.UserError, match=r"^envs.broken.Env breaks nanorl/episodes.py's Env contract: it has no "
                                           r"'invalid'$"):
        check_env("env:broken", broken, {}, ("1-100:", "1"))
    monkeypatch.setattr(NoInvalid, "invalid", 0, raising=False)
    for bad in ["|", ("",), (), ("|", 1)]:
        monkeypatch.setattr(NoInvalid, "stops", bad)
        with pytest.raises(rl.UserError, match="stops is not a tuple of strings"):
            check_env("env:broken", broken, {}, ("1-100:", "1"))
    monkeypatch.setattr(NoInvalid, "stops", ("|", "\n\nUser:"))
    check_env("env:broken", broken, {}, ("1-100:", "1"))
    monkeypatch.setattr(sft, "env_of", lambda task: broken if task == "env:guess" else None)
    monkeypatch.delattr(NoInvalid, "invalid")
    with pytest.raises(rl.UserError, match="it has no 'invalid'"):
        sft.main(sft.Config(out_dir=str(tmp_path), **{**TINY_GUESS, "max_iters": 1}))
