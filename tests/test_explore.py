"""Exploration to the optimum: the game's oracle (winning moves, oracle reward), the eval's losing
states and critical-turn entropy, negative-sample reinforcement (nsr, w_reinforce) and the count
bonus, repeat penalty and temperature schedule of nanorl/explore.py, each against a hand count."""
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import losses as L
import rl
from envs import guess
from nanorl import explore
from nanorl.episodes import Visit
from nanorl.evaluate import Task, critical_entropy, env_metrics, losing_states
from tests.test_envs import GUESS, TOK, biased, episodes, play, sample, tiny_model
from tests.test_rl import lone, make_run

# ---------------------------------------------------------------- the oracle


def brute_winnable(lo, hi, t):
    """Can some play find any secret of [lo, hi] within t guesses? By exhaustive search."""
    if lo > hi:
        return True
    if t == 0:
        return False
    return any(brute_winnable(lo, g - 1, t - 1) and brute_winnable(g + 1, hi, t - 1)
               for g in range(lo, hi + 1))


def test_winning_moves_by_hand():
    """[1, 100] with 7 turns: a guess g needs g - 1 <= 63 and 100 - g <= 63, so 37..64 (28 moves);
    [26, 54] with 5 turns: only 39, 40, 41; 29 numbers with 4 turns: none."""
    game = guess.Env("37")
    assert game.winning_moves() == 28
    game.lo, game.hi, game.turns = 26, 54, 2
    assert game.winning_moves() == 3
    game.turns = 3
    assert game.winning_moves() == 0
    game.lo = game.hi = 37
    game.won = True
    assert game.winning_moves() == 1  # a won game stays winnable


@pytest.mark.parametrize("lo,hi,t", [(1, 7, 3), (1, 8, 3), (3, 12, 4), (5, 5, 1), (2, 9, 3), (1, 15, 4),
                                     (50, 51, 3), (40, 45, 4), (99, 100, 2), (3, 5, 2)])
def test_winning_moves_are_the_moves_exhaustive_search_allows(lo, hi, t):
    """Every guess of 1..100: one inside [lo, hi] splits it, one outside spends the turn and keeps
    it, which a state with slack (its numbers fit one turn fewer) can afford."""
    game = guess.Env(str(lo))
    game.lo, game.hi, game.turns = lo, hi, guess.TURNS - t
    allowed = sum(brute_winnable(lo, g - 1, t - 1) and brute_winnable(g + 1, hi, t - 1)
                  if lo <= g <= hi else brute_winnable(lo, hi, t - 1)
                  for g in range(guess.LO, guess.HI + 1))
    assert game.winning_moves() == allowed


def test_a_slack_state_is_not_critical_and_a_win_on_the_last_turn_is_kept():
    """[50, 51] with 3 turns: both inside guesses win, and so do the 98 outside (2 numbers fit 2
    turns), so the state is not critical. Secret 37 won on the 7th turn (50 25 38 31 34 36 37): every
    move kept the game winnable, the last one too (+1 each; a won game stays at 1 move)."""
    game = guess.Env("50")
    game.lo, game.hi, game.turns = 50, 51, guess.TURNS - 3
    assert game.winning_moves() == 100
    last = guess.Env("37", oracle_reward=True)
    assert [last.step(g)[1] for g in "50 25 38 31 34 36 37".split()] == [1.0] * 7
    assert last.won and last.turns == 7 and last.winning_moves() == 1


def test_oracle_reward_by_hand():
    """Secret 37, oracle_reward: 50 keeps [1, 49] in 6 turns (+1); 10 leaves [11, 49], 39 numbers
    for 5 turns (-1); after that nothing is winnable (0). An invalid turn spends a turn: it loses
    the game where the interval no longer fits, else keeps it. process_reward adds its share."""
    game = guess.Env("37", oracle_reward=True)
    assert [game.step(g)[1] for g in ("50", "10", "40")] == [1.0, -1.0, 0.0]
    both = guess.Env("37", oracle_reward=True, process_reward=True)
    obs, reward, _ = both.step("50")
    assert reward == pytest.approx(1 + math.log2(100 / 49) / math.log2(100))
    spent = guess.Env("37", oracle_reward=True)
    assert spent.step("abc")[1] == -1.0  # a turn spent: 100 numbers do not fit 6 turns (63)
    slack = guess.Env("7", oracle_reward=True)
    slack.lo, slack.hi, slack.turns = 1, 10, 2
    assert slack.step("abc")[1] == 1.0  # 10 numbers still fit 4 turns
    lost = guess.Env("37", oracle_reward=True)
    lost.step("1"), lost.step("2")  # [3, 100] in 5 turns: lost at the second guess
    assert lost.winning_moves() == 0 and lost.step("50")[1] == 0.0


def test_visits_record_state_action_and_the_oracle_before_and_after():
    env = episodes([37])
    play(env, 0, ["50", "10", "0"])
    v = env.visits
    assert [(x.row, x.state, x.action, x.before, x.after) for x in v] == [
        (0, (1, 100, 0), "50", 28, 15), (0, (1, 49, 1), "10", 15, 0), (0, (11, 49, 2), "0", 0, 0)]
    assert [(x.start, x.end) for x in v] == [(0, 2), (4, 6), (8, 9)]  # "50|" then "<" forced


def test_losing_states_and_critical_entropy_by_hand():
    """Losing states: the distinct states whose move took before > 0 to after 0. Critical entropy:
    the mean over moves from states with 1-3 winning moves of -sum log pi over the move's tokens."""
    calls = [(SimpleNamespace(visits=[Visit(0, 0, 2, "a", "1", 28, 15), Visit(0, 4, 6, "b", "2", 3, 0),
                                      Visit(1, 0, 1, "b", "3", 3, 0), Visit(1, 3, 5, "c", "4", 2, 1),
                                      Visit(1, 6, 7, "d", "5", 0, 0)]),
              {"logps": torch.tensor([[-0.1, -0.2, -0.3, 0, -0.5, -0.5, -1.0, 0],
                                      [-1.0, -1.0, 0, -0.25, -0.25, -0.5, -9.0, -9.0]])})]
    assert losing_states(e for e, _ in calls) == {"b"}
    # critical moves: row 0 [4, 6] 2.0, row 1 [0, 1] 2.0, row 1 [3, 5] 1.0 -> 5 / 3
    assert critical_entropy(calls, "eval") == {"eval/critical_entropy": pytest.approx(5 / 3)}
    assert critical_entropy([(SimpleNamespace(visits=[]), {})], "eval") == {}


def test_eval_logs_losing_states_of_the_greedy_games():
    """env_metrics on real greedy games of a policy that always guesses 1: from [1, 100] with 7
    turns, 1 loses winnability at once (99 numbers left for 6 turns), one losing state."""
    model = tiny_model()
    hook = biased(model, "1|")
    try:
        out, games = sample(model, [37, 80], G=1, seed=0)
    finally:
        hook.remove()
    m = env_metrics([(games, out)], "eval")
    assert m["eval/losing_states"] == 1 and losing_states([games]) == {(1, 100, 0)}

# ---------------------------------------------------------------- NSR, W-REINFORCE


def test_signed_advantages_by_hand():
    """Row 0 lost with turns paid +1, -1 (the oracle): c = -1 + r_k: 0 on the first turn, -2 on
    the second; row 1 won, one turn: c = +1. W-REINFORCE weighs positives by 0.1, NSR by 0."""
    m = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    tr = torch.tensor([[0, 1.0, 0, 0, -1, 0], [0, 0, 0, 0, 0, 0]])
    out = torch.tensor([0.0, 1.0])
    w = L.signed_advantages(out, tr, m, 0.1)
    torch.testing.assert_close(w, torch.tensor([[0, 0, 0, -2, -2, 0], [0.1, 0.1, 0.1, 0, 0, 0]]))
    nsr = L.signed_advantages(out, None, m, 0.0)  # no turn rewards: every token the outcome's
    torch.testing.assert_close(nsr, torch.tensor([[-1.0, -1, 0, -1, -1, 0], [0, 0, 0, 0, 0, 0]]))


def test_nsr_and_w_reinforce_rows_by_hand():
    """The rows' loss: token-mean of -A logp over the batch; NSR's gradient only lowers the wrong
    answer's tokens, W-REINFORCE's also raises the right one's by 0.1."""
    logp = torch.tensor([[-0.5, -1.0], [-0.2, -0.4]], requires_grad=True)
    m = torch.ones(2, 2)
    for name, pos in (("nsr", 0.0), ("w_reinforce", 0.1)):
        algo, hp = L.ALGOS[name], L.resolve_hparams(name)
        assert hp["pos_weight"] == pos and algo.ratio is None and algo.on_policy
        adv = L.signed_advantages(torch.tensor([1.0, 0.0]), None, m, hp["pos_weight"])
        loss, _ = L.algo_loss(algo, hp, logp, logp.detach(), adv, m)
        expect = -(pos * (-0.5 - 1.0) + -1 * (-0.2 - 0.4)) / 4
        assert loss.item() == pytest.approx(expect)
        (g,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(g, torch.tensor([[-pos / 4, -pos / 4], [0.25, 0.25]]))


def test_signed_kind_reads_the_outcome_without_the_turn_rewards():
    """rl's signed kind: R = the score (1 here) + the turns' rewards; the outcome is R without
    them, so a won game whose turns were paid 0.3 and -1 still counts as won."""
    b = rl.rows.Rollout(ids=torch.zeros(1, 5, dtype=torch.long), offsets=torch.zeros(1), mu=None,
                        mask=torch.tensor([[1, 0, 1, 1, 0]]))
    b.turn_rewards = torch.tensor([[0.3, 0, 0, -1.0, 0]])
    b.reward = torch.tensor([1.0 + 0.3 - 1.0])
    adv, _ = rl.ADVANTAGES["signed"](None, L.ALGOS["w_reinforce"], lone(L.resolve_hparams("w_reinforce")), b)
    torch.testing.assert_close(adv, torch.tensor([[0.13, 0, 0, -0.0, 0]]))

def test_signed_rows_take_the_kl_once_and_per_token_by_hand():
    """beta 0.5, k1 = logp - ref = [0.5, -1, _, 0] on the policy's tokens (position 2 is the
    environment's): rewards -beta k1 = [-0.25, 0.5, _, 0], their return-to-go [0.25, 0.5, 0, 0];
    the lost game's c = -1 on every policy token. Not once per sequence, nor at twice beta."""
    b = rl.rows.Rollout(ids=torch.zeros(1, 5, dtype=torch.long), offsets=torch.zeros(1), mu=None,
                        mask=torch.tensor([[1, 1, 0, 1]]))
    b.reward, b.old_logp = torch.tensor([0.0]), torch.tensor([[-1.0, -2.0, 0.0, -0.5]])
    b.ref_logp = torch.tensor([[-1.5, -1.0, 0.0, -0.5]])
    for name in ("nsr", "w_reinforce"):
        hp = L.resolve_hparams(name, beta=0.5)
        adv, _ = rl.advantages_of(L.ALGOS[name], hp)(rl.Config(loss=name), L.ALGOS[name], lone(hp), b)
        torch.testing.assert_close(adv, torch.tensor([[-0.75, -0.5, 0.0, -1.0]]))


# ---------------------------------------------------------------- the count bonus, the schedule


def test_schedule_anneals_the_temperature_and_the_bonus_linearly():
    cfg = rl.Config(temperature=1.0, temperature_start=1.4, count_bonus=0.2, repeat_penalty=0.1,
                    explore_iters=100, max_iters=150)
    at = {s: explore.scheduled(cfg, s) for s in (0, 25, 100, 140)}
    assert [round(c.temperature, 6) for c in at.values()] == [1.4, 1.3, 1.0, 1.0]
    assert [round(c.count_bonus, 6) for c in at.values()] == [0.2, 0.15, 0.0, 0.0]
    assert [round(c.repeat_penalty, 6) for c in at.values()] == [0.1, 0.075, 0.0, 0.0]
    untouched = explore.scheduled(rl.Config(count_bonus=0.5, max_iters=10), 5)  # None: max_iters
    assert untouched.temperature == 1.0 and untouched.count_bonus == 0.25


def test_count_bonus_and_repeat_penalty_by_hand():
    """2 groups of 2 rows. Row 0 and 1 (group 0) both guess 50 from the start, seen once before:
    c / sqrt(2) each, and each pays p x 1 / (G - 1) for the other; row 2 guesses 50 (group 1,
    alone: no penalty), row 3 guesses 60. Then N counts the call's turns."""
    env = episodes([37, 37], G=2)
    for r, turns in enumerate([["50"], ["50"], ["50", "20"], ["60"]]):
        play(env, r, turns)
    counts = Counter({((1, 100, 0), "50"): 1})
    L_ = 8
    b = SimpleNamespace(turn_rewards=torch.zeros(4, L_), reward=torch.ones(4))
    cfg = SimpleNamespace(count_bonus=0.4, repeat_penalty=0.2)
    explore.bonus(cfg, counts, b, env, 2)
    c1, c2 = 0.4 / math.sqrt(2), 0.4 / math.sqrt(1)
    expect = torch.zeros(4, L_)
    expect[0, 2] = expect[1, 2] = c1 - 0.2
    expect[2, 2], expect[2, 6] = c1, c2  # 20 from (1, 49, 1): never seen
    expect[3, 2] = c2
    torch.testing.assert_close(b.turn_rewards, expect)
    torch.testing.assert_close(b.reward, 1 + expect.sum(1))
    assert counts[(1, 100, 0), "50"] == 4 and counts[(1, 100, 0), "60"] == 1
    assert counts[(1, 49, 1), "20"] == 1


def test_a_group_of_one_earns_the_count_bonus_and_no_repeat_penalty():
    """ReMax's greedy answer is a group of one: its turns earn c / sqrt(1 + N) and pay no repeat
    penalty (no other row repeats them), where G - 1 = 0 once divided by zero."""
    env = episodes([37], G=1)
    play(env, 0, ["50", "20"])
    b = SimpleNamespace(turn_rewards=torch.zeros(1, 8), reward=torch.zeros(1))
    counts = Counter({((1, 100, 0), "50"): 3})
    explore.bonus(SimpleNamespace(count_bonus=0.4, repeat_penalty=0.2), counts, b, env, 1)
    expect = torch.zeros(1, 8)
    expect[0, 2], expect[0, 6] = 0.4 / math.sqrt(4), 0.4  # "50|", ">", "20|"
    torch.testing.assert_close(b.turn_rewards, expect)
    assert counts[(1, 100, 0), "50"] == 4


def test_pass_at_k_with_a_group_no_larger_than_k_is_refused_at_the_check():
    with pytest.raises(rl.UserError, match=r"^pass_k=8 must be in \[1, group_size - 1 = 7\]$"):
        rl.check(rl.Config(loss="pass_at_k", group_size=8))
    with pytest.raises(rl.UserError, match=r"^pass_k=4 must be in \[1, group_size - 1 = 3\]$"):
        rl.check(rl.Config(loss="pass_at_k", group_size=4, pass_k=4))
    assert rl.check(rl.Config(loss="pass_at_k", group_size=9))[2]["pass_k"] == 8


def test_the_bonus_reaches_the_rollout_and_its_counts():
    """rl.rollout on the game with --count_bonus: each turn's reward holds its bonus, the reward
    their sum and the win, and run.counts the rollout's turns."""
    task = Task(TOK, "env:guess", False, "exact", 0, guess.splits()["test"], env_module=GUESS)
    model = tiny_model()
    hook = biased(model, "0123456789|")
    try:
        cfg = rl.Config(loss="grpo", group_size=4, max_new_tokens=40, overlong_window=0,
                        count_bonus=0.5)
        run = make_run(cfg, model, task)
        b = rl.rollout(cfg, L.ALGOS["grpo"], run, list(range(4)), torch.Generator().manual_seed(0), 4, 1.0)
    finally:
        hook.remove()
    assert (b.turn_rewards[b.turn_rewards != 0] <= 0.5).all() and b.turn_rewards.sum() > 0
    torch.testing.assert_close(b.reward, b.score + b.turn_rewards.sum(1))
    assert sum(run.counts.values()) == int(b.turns.sum())


@pytest.mark.parametrize("flags,match", [
    (dict(count_bonus=0.1, task="add"), "needs an environment"),
    (dict(repeat_penalty=0.1, loss="dpo"), "synchronous policy-gradient"),
    (dict(temperature_start=1.3, staleness=1, async_rollouts=True), "synchronous"),
    (dict(temperature_start=1.3, staleness=2), "would train step s-k's rollout at step s's"),
    (dict(count_bonus=0.1, loss="pass_at_k"), "^count_bonus and repeat_penalty are turn rewards, "
                                              "and pass_at_k needs 0/1 rewards$"),
    (dict(repeat_penalty=0.1, loss="cliff"), "cliff needs 0/1 rewards"),
    (dict(explore_iters=10), "set one of them"),
    (dict(temperature_start=-1.0), "temperature_start must be > 0"),
    (dict(count_bonus=-0.1), "count_bonus must be >= 0")])
def test_exploration_flags_a_run_would_ignore_are_refused(flags, match):
    task_name = flags.pop("task", "env:guess")
    loss = flags.pop("loss", "grpo")
    cfg = rl.Config(loss=loss, **flags)
    env = GUESS if task_name.startswith("env:") else None
    task = SimpleNamespace(env_module=env)
    with pytest.raises(rl.UserError, match=match):
        explore.Scheduled(cfg, L.ALGOS[loss], task, None)


def test_scheduled_steps_see_their_temperature_and_log_it():
    seen = []
    step = explore.Scheduled(rl.Config(temperature_start=2.0, explore_iters=4), L.ALGOS["grpo"],
                             SimpleNamespace(env_module=GUESS),
                             lambda cfg, *a: seen.append(cfg.temperature) or {"rl/x": 1})
    for s in range(6):
        stats = step(rl.Config(temperature_start=2.0, explore_iters=4), None,
                     SimpleNamespace(state=SimpleNamespace(step=s)), 0.1, None)
    assert seen == [2.0, 1.75, 1.5, 1.25, 1.0, 1.0]
    assert stats == {"rl/x": 1, "rl/temperature": 1.0, "rl/count_bonus": 0.0, "rl/repeat_penalty": 0.0}


def test_signed_rows_keep_the_groups_that_lost_every_game():
    """NSR and W-REINFORCE have no group baseline: a group that lost every game pushes its moves
    down, so dynamic sampling never drops it (nor prompt selection skips its prompt)."""
    for name in ("nsr", "w_reinforce"):
        cfg, algo, _ = rl.check(rl.Config(loss=name))
        assert not cfg.dynamic_sampling and algo.flat_teaches
    assert rl.check(rl.Config(loss="grpo"))[0].dynamic_sampling
