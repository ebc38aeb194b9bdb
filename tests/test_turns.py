"""Credit per turn (nanorl/turns.py, losses.vine_advantages / step_advantages): each advantage by hand
on a 3-turn episode, the environment replayed to each turn's state, VinePPO's branches from each turn's
own prefix, GiGPO's step groups keyed on the state, and the rows end to end on the game."""
from collections import Counter
from dataclasses import replace

import pytest
import torch

import losses as L
import rl
from nanorl import turns
from nanorl.config import UserError
from tests.test_envs import (GUESS, PROMPT, TINY_RL, TOK, biased, episodes, sample,  # noqa: F401
                             three_turns, tiny_model)
from nanorl.evaluate import Task
from model import responses
from tests.test_rl import lone, make_run


def test_turn_index_counts_runs_of_the_policys_tokens():
    m = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1], [0, 1, 1, 1, 1, 0, 0, 0]])
    assert L.turn_index(m).tolist() == [[0, 0, -1, 1, -1, -1, 2, 2], [-1, 0, 0, 0, 0, -1, -1, -1]]


def test_vine_advantage_of_a_three_turn_episode_by_hand():
    """three_turns: turns end at tokens 0, 3, 5 with rewards 0.2, 0.3, 0.5, the score 1 at the end.
    V(s_0) = 0.5, V(s_1) = 0.4, V(s_2) = 0.6: A_k = r_k + V(s_k+1) - V(s_k), V after the last 0."""
    b = three_turns()
    b.values = torch.tensor([[0.5, 9.0, 0.4, 0.4, 9.0, 0.6, 9.0]])  # a turn's value on its tokens
    r = b.turn_rewards + torch.tensor([[0, 0, 0, 0, 0, 1.0, 0]])  # the score on the last token
    a0, a1, a2 = 0.2 + 0.4 - 0.5, 0.3 + 0.6 - 0.4, 0.5 + 1.0 - 0.6
    want = torch.tensor([[a0, 0, a1, a1, 0, a2, 0]])
    torch.testing.assert_close(L.vine_advantages(r, b.values, b.mask), want)
    hp = L.resolve_hparams("vineppo", beta=0.0)  # the loop's: whitened over the policy's tokens
    adv, inputs = rl.token_kind(rl.Config(group_size=1), L.ALGOS["vineppo"], lone(hp), b)
    x = torch.tensor([a0, a1, a1, a2])
    x = (x - x.mean()) / x.std(correction=0)
    torch.testing.assert_close(adv, torch.tensor([[x[0], 0, x[1], x[2], 0, x[3], 0]]), atol=1e-5, rtol=0)
    assert inputs == {}


def test_gigpo_advantage_of_three_turn_episodes_by_hand():
    """Two groups of 2 rows, 3 turns each (three_turns' layout). Group 0's rows start turn 1 from one
    state, turn 2 from two; group 1's rows share every state id with group 0 but not its group.
    Step returns (gamma 0.5) are normalised within (group, state); the episode's in its group."""
    b = three_turns()
    b = rl.cat([b, b, b, b])
    b.turn_rewards = torch.tensor([[0.2, 0, 0, 0.3, 0, 0.5, 0], [0.2, 0, 0, 0.1, 0, 0.0, 0],
                                   [0.0, 0, 0, 0.0, 0, 0.0, 0], [0.0, 0, 0, 0.0, 0, 0.0, 0]])
    b.score = torch.tensor([1.0, 0.0, 1.0, 1.0])
    b.reward = b.score + b.turn_rewards.sum(1)
    b.states = torch.tensor([[0, 0, 1, 1, 0, 2, 0], [0, 0, 1, 1, 0, 3, 0]] * 2)
    hp = L.resolve_hparams("gigpo", beta=0.0, gamma=0.5, step_weight=1.0)
    adv, _ = rl.token_kind(rl.Config(group_size=2), L.ALGOS["gigpo"], lone(hp), b)

    def norm(x):  # population std, as GRPO's
        x = torch.tensor(x)
        return (x - x.mean()) / (x.std(correction=0) + 1e-6) if x.std() > 0 else torch.zeros_like(x)
    r0, r1 = [0.2, 0.3, 1.5], [0.2, 0.1, 0.0]  # group 0's turn rewards, the score on the last
    ret0 = [r0[0] + 0.5 * r0[1] + 0.25 * r0[2], r0[1] + 0.5 * r0[2], r0[2]]
    ret1 = [r1[0] + 0.5 * r1[1] + 0.25 * r1[2], r1[1] + 0.5 * r1[2], r1[2]]
    episode = norm([2.0, 0.3])
    s0, s1 = norm([ret0[0], ret1[0]]), norm([ret0[1], ret1[1]])  # turn 2: groups of one, 0
    want0 = [episode[0] + s0[0], episode[0] + s1[0], episode[0] + s1[0], episode[0]]
    want1 = [episode[1] + s0[1], episode[1] + s1[1], episode[1] + s1[1], episode[1]]
    torch.testing.assert_close(adv[0, [0, 2, 3, 5]], torch.stack(want0))
    torch.testing.assert_close(adv[1, [0, 2, 3, 5]], torch.stack(want1))
    torch.testing.assert_close(adv[2:], torch.zeros(2, 7))  # group 1: all equal, nothing to learn
    assert (adv[:, [1, 4, 6]] == 0).all()  # the environment's tokens


def test_step_groups_follow_the_state_and_the_group():
    """Equal returns in a step group: 0; a state id shared by two groups is two step groups."""
    m = torch.tensor([[1, 0], [1, 0], [1, 0], [1, 0]])
    r = torch.tensor([[1.0, 0], [0.0, 0], [1.0, 0], [3.0, 0]])
    states = torch.zeros(4, 2, dtype=torch.long)
    one = L.step_advantages(r, states, torch.zeros(4, dtype=torch.long), m, 1.0)
    two = L.step_advantages(r, states, torch.tensor([0, 0, 1, 1]), m, 1.0)
    torch.testing.assert_close(two[:, 0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5, rtol=0)
    x = torch.tensor([1.0, 0.0, 1.0, 3.0])
    torch.testing.assert_close(one[:, 0], (x - x.mean()) / (x.std(correction=0) + 1e-6))


# ---------------------------------------------------------------- replaying the turns

def test_retake_finds_each_turns_start_and_the_state_it_starts_from():
    """1-100:50|<25|>37|= (secret 37): turns start at 0, 4, 8; states (1, 100, 0), (1, 49, 1),
    (26, 49, 2); the row then goes on as a new response, its environment at turn 3."""
    ids = TOK.encode("50|<25|>37|=") + [TOK.eos_id]
    act = [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0]
    env = episodes([37])
    assert env.retake(0, ids, act) == [(0, (1, 100, 0)), (4, (1, 49, 1)), (8, (26, 49, 2))]
    assert env.envs[0].won and env.turns[0] == 3 and env.start[0] == 0
    env = episodes([37])
    assert env.retake(0, ids[:8], act[:8]) == [(0, (1, 100, 0)), (4, (1, 49, 1))]
    assert (env.envs[0].lo, env.envs[0].hi, env.turns[0]) == (26, 49, 2) and env.start[0] == 0


def game_batch(model, secrets, G, temperature=1.0, seed=0):
    """Rows of games of model -> (the Rollout as rl.scored builds it, the Run, cfg)."""
    task = Task(TOK, "env:guess", False, "exact", 0, env_module=GUESS, env_args={"process_reward": True})
    task.train = [(guess_prompt(), str(s)) for s in secrets]
    cfg = rl.Config(loss="vineppo", group_size=G, temperature=temperature, max_new_tokens=40,
                    sample_batch_size=64, env_args={"process_reward": True})
    run = make_run(cfg, model, task)
    gen = torch.Generator().manual_seed(seed)
    batch = rl.rollout(cfg, L.ALGOS["vineppo"], run, list(range(len(secrets))), gen, G, temperature)
    return batch, run, cfg, gen


def guess_prompt():
    return TOK.decode(PROMPT)


def scripted(model):
    """model's logits pushed to a script read off the token before: the prompt's ':' opens 50,
    '<' guesses 2, '>' 7, and a guess ends its turn: games of several turns, all different."""
    script = {":": "5", "5": "0", "0": "|", "<": "2", "2": "|", ">": "7", "7": "|"}

    def hook(mod, args, kw, logits):  # (B, T, V), or (K, V) at the positions kept
        ids = args[0] if kw.get("keep") is None else args[0][kw["keep"]]
        bias = torch.zeros_like(logits)
        for before, after in script.items():
            bias[..., TOK.encode(after)[0]] += 60.0 * (ids == TOK.encode(before)[0])
        return logits + bias
    return model.register_forward_hook(hook, with_kwargs=True)


def test_branches_of_a_deterministic_policy_reproduce_each_episodes_return_to_go():
    """At temperature 1e-3 a scripted policy is greedy: the branches from each turn's state replay
    the episode's own future, so V(s_k) is its return from turn k (turn rewards, then the win) and
    every advantage is 0. A branch from another prefix, row or state would not match."""
    model = tiny_model(seed=3)
    hook = scripted(model)
    try:
        b, run, cfg, gen = game_batch(model, [3, 40, 77, 99], G=2, temperature=1e-3)
        flat = torch.zeros(4, dtype=torch.bool)
        b = turns.credit(cfg, L.ALGOS["vineppo"], run, b, list(range(4)), flat, gen)
    finally:
        hook.remove()
    turn = L.turn_index(b.mask)  # (N, L)
    assert turn.max() >= 2  # 3 turns and more
    r = b.turn_rewards.clone()
    r[torch.arange(len(r)), b.mask.shape[1] - 1 - b.mask.flip(1).argmax(1)] += b.score
    togo = r.flip(1).cumsum(1).flip(1)  # (N, L) the return from each position on
    first = b.mask.bool() & (turn != torch.nn.functional.pad(turn, (1, 0), value=-1)[:, :-1])
    torch.testing.assert_close(b.values[first], togo[first], atol=1e-5, rtol=0)
    r[turn < 0] = 0.0
    torch.testing.assert_close(L.vine_advantages(r, b.values, b.mask), torch.zeros_like(r), atol=1e-5, rtol=0)


def test_each_prefix_gets_k_continuations_from_its_replayed_state(monkeypatch):
    """A sampling policy, K = 3, G = 4. A prefix that m rows of a group pass through at a turn's
    start is branched K - m + 1 times (none if m > K), every branch from the prefix's state (the
    environment replayed: the interval and turns a fresh game has there); each row's V(s_k) is the
    mean return from s_k of the other m - 1 rows and the branches, V(s_0) the others' mean return."""
    model, secrets = tiny_model(seed=3), [3, 40, 77, 99]
    hook = biased(model, "0123456789|")
    calls, branched = [], {}

    def spy(model, prompts, max_new_tokens, *args, episodes=None, G=1, **kw):
        calls.append(([list(p) for p in prompts], [(e.lo, e.hi, e.turns) for e in episodes.envs], G))
        return rl.generate(model, prompts, max_new_tokens, *args, episodes=episodes, G=G, **kw)

    def spy_branch(*args):
        branched.update(branch(*args))
        return branched
    branch = turns.branch
    try:
        b, run, cfg, gen = game_batch(model, secrets, G=4)
        run.hp["branches"] = 3
        monkeypatch.setattr(turns, "generate", spy)
        monkeypatch.setattr(turns, "branch", spy_branch)
        b = turns.credit(cfg, L.ALGOS["vineppo"], run, b, list(range(4)), torch.zeros(4, dtype=torch.bool), gen)
    finally:
        hook.remove()
    through, state = {}, {}  # (group, prefix) -> [(row, start)], the state a fresh game has there
    for r, (row, act) in enumerate(zip(responses(b), b.mask.tolist())):
        for start, _ in episodes([secrets[r // 4]]).retake(0, row, act):
            env = episodes([secrets[r // 4]])
            env.retake(0, row[:start], act[:start])
            through.setdefault((r // 4, tuple(row[:start])), []).append((r, start))
            state[r // 4, tuple(row[:start])] = (env.envs[0].lo, env.envs[0].hi, env.envs[0].turns)
    want = {key: 3 - len(rs) + 1 for key, rs in through.items() if len(rs) <= 3}
    seen = Counter()  # (prefix, its state, branches): groups of different secrets may share one
    for prompts, states, G in calls:
        for p, prompt in enumerate(prompts):
            assert states[p * G:(p + 1) * G] == [states[p * G]] * G
            seen[tuple(prompt[len(PROMPT):]), states[p * G], G] += 1
    assert seen == Counter((prefix, state[g, prefix], n) for (g, prefix), n in want.items())
    assert len(want) > 10 and max(len(rs) for rs in through.values()) > 1
    for (g, prefix), rs in through.items():
        togo = {r: b.reward[r].item() - b.turn_rewards[r, :start].sum().item() for r, start in rs}
        extra = branched.get((g, prefix), [])
        assert len(extra) == want.get((g, prefix), 0)
        for r, start in rs:
            v = (sum(togo.values()) - togo[r] + sum(extra)) / (len(rs) - 1 + len(extra))
            assert b.values[r, start].item() == pytest.approx(v, abs=1e-5)
    R = b.reward.view(4, 4)
    torch.testing.assert_close(b.values[:, 0], ((R.sum(1, keepdim=True) - R) / 3).flatten())


def test_value_table_is_a_running_mean_that_forgets_at_its_rate():
    """Rate 0.4: a state's first visit sets V = G, its second moves V by 1/2, its third by
    max(1/3, 0.4) = 0.4; each turn then reads its state's V after the call's visits."""
    table = {}
    rows_ = [[(0, "a"), (3, "b")], [(0, "a"), (2, "c")]]
    got = turns.table_values(table, rows_, [[1.0, 0.5], [0.0, 0.2]], 0.4)
    assert got == [[0.5, 0.5], [0.5, 0.2]]  # a: 1.0, then 1.0 + (0.0 - 1.0) / 2
    assert table == {"a": (2, 0.5), "b": (1, 0.5), "c": (1, 0.2)}
    assert turns.table_values(table, [[(0, "a")]], [[1.5]], 0.4) == [[0.5 + 0.4 * (1.5 - 0.5)]]
    assert table["a"][0] == 3


def test_value_table_gives_each_turn_the_mean_return_from_its_state():
    """A rate near 0 keeps the exact mean: every turn's V(s_k), on each of its tokens, is the
    mean return-to-go (turn rewards, then the score) of every visit to s_k in the batch, the
    environment replayed to find s_k; the row's advantages then follow losses.vine_advantages."""
    model = tiny_model(seed=3)
    hook = biased(model, "0123456789|")
    try:
        b, run, cfg, gen = game_batch(model, [3, 40, 77], G=4)
        run.hp["value_table"] = 1e-9
        cfg = replace(cfg, dynamic_sampling=False)
        b = turns.credit(cfg, L.ALGOS["vineppo"], run, b, [0, 1, 2], torch.zeros(3, dtype=torch.bool), gen)
    finally:
        hook.remove()
    r = b.turn_rewards.clone()
    r[torch.arange(len(r)), b.mask.shape[1] - 1 - b.mask.flip(1).argmax(1)] += b.score
    togo = r.flip(1).cumsum(1).flip(1)  # (N, L) the return from each position on
    visits = []  # (row, start, end, state)
    for i, (row, act) in enumerate(zip(responses(b), b.mask.tolist())):
        starts = episodes([[3, 40, 77][i // 4]]).retake(0, row, act)
        ends = [s for s, _ in starts[1:]] + [len(row)]
        visits += [(i, s, e, state) for (s, state), e in zip(starts, ends)]
    by_state = {}
    for i, s, _, state in visits:
        by_state.setdefault(state, []).append(togo[i, s].item())
    assert max(len(v) for v in by_state.values()) > 1 and len(by_state) > 5
    for i, s, e, state in visits:
        want = sum(by_state[state]) / len(by_state[state])
        torch.testing.assert_close(b.values[i, s:e], torch.full((e - s,), want), atol=1e-5, rtol=0)
    assert len(run.values) == len(by_state) and all(n == len(by_state[k]) for k, (n, _) in run.values.items())


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_gigpo_keys_each_turn_on_the_state_it_starts_from(dynamic_sampling):
    """Two turns of one group get one id exactly when their games reach the same interval at the
    same turn; other groups never share an id with them. Without dynamic sampling a flat group stays
    in the batch, and its rows keep their own problem (configs/rl_guess_gigpo.py's setting)."""
    model = tiny_model(seed=3)
    hook = biased(model, "0123456789|")
    flat = torch.tensor([not dynamic_sampling, False, False])  # (groups,) kept: none is dropped
    try:
        b, run, cfg, gen = game_batch(model, [3, 40, 77], G=4)
        cfg = replace(cfg, dynamic_sampling=dynamic_sampling)
        b = turns.credit(cfg, L.ALGOS["gigpo"], run, b, [0, 1, 2], flat, gen)
    finally:
        hook.remove()
    seen = {}  # id -> (group, state)
    for r, (row, act) in enumerate(zip(responses(b), b.mask.tolist())):
        for start, state in episodes([[3, 40, 77][r // 4]]).retake(0, row, act):
            key = (r // 4, state)
            assert seen.setdefault(int(b.states[r, start]), key) == key
    assert len(set(seen.values())) == len(seen) > 3


# ---------------------------------------------------------------- refusals, end to end

def test_what_the_turns_credit_cannot_read_is_refused_in_one_line():
    from envs import calculator
    tool = Task(TOK, "mul3_tool", True, "exact", 0, env_module=calculator)
    with pytest.raises(UserError, match="calculator.Env has no state"):
        turns.check(rl.Config(loss="gigpo"), L.ALGOS["gigpo"], tool)
    game = Task(TOK, "env:guess", False, "exact", 0, env_module=GUESS)
    turns.check(rl.Config(loss="gigpo"), L.ALGOS["gigpo"], game)
    with pytest.raises(UserError, match="branches must be >= 1, got 0"):
        turns.check(rl.Config(loss="vineppo", branches=0), L.ALGOS["vineppo"], game)
    off = dict(loss="vineppo", dynamic_sampling=False)
    turns.check(rl.Config(**off, value_table=0.05), L.ALGOS["vineppo"], game)
    for kw, words in ((dict(value_table=1.5), r"value_table must be in \[0, 1\], got 1.5"),
                      (dict(value_table=0.1, branches=2), "from --branches or from --value_table: set one"),
                      (dict(value_table=0.1, dynamic_sampling=True), "set --dynamic_sampling=false")):
        with pytest.raises(UserError, match=words):
            turns.check(rl.Config(**{**off, **kw}), L.ALGOS["vineppo"], game)
    with pytest.raises(UserError, match="value_table keys its values by the environment's state"):
        turns.check(rl.Config(**off, value_table=0.1), L.ALGOS["vineppo"], tool)
    for kw in (dict(reward="rm"), dict(overlong_window=4)):
        with pytest.raises(UserError, match=r"\(--reward=verifier\), no shaping \(--overlong_window=0\)"):
            turns.check(rl.Config(loss="vineppo", **kw), L.ALGOS["vineppo"], game)


@pytest.mark.parametrize("loss, dynamic_sampling", [("vineppo", True), ("gigpo", True), ("vineppo", False),
                                                    ("gigpo", False)])
def test_the_rows_play_the_game_end_to_end(guess_ckpt, tmp_path, loss, dynamic_sampling):  # noqa: F811
    cfg = rl.Config(**dict(TINY_RL, sft_ckpt=guess_ckpt, loss=loss, out_dir=str(tmp_path), beta=0.0,
                           log_rollouts=0, dynamic_sampling=dynamic_sampling))
    out = rl.main(cfg)
    assert out["metrics"]["eval/accuracy"] >= 0 and (tmp_path / "ckpt.pt").exists()
