"""
Exploration, off by default: a count bonus on each turn's (state, action), a within-group repeat
penalty, and a hot-then-cold temperature schedule (docs/algorithms.md, "Exploration: the oracle,
negative samples, a count bonus, a temperature schedule, pass@k").

    python rl.py configs/rl_guess_pp.py --count_bonus=0.2 --temperature_start=1.3

Count bonus (count-based novelty, as in MERCI, arXiv 2510.16614): a turn from state s (its Env's
state()) that writes action a earns c / sqrt(1 + N(s, a)) on its last token, N the times this rank
took a from s before this sampler call; the repeat penalty takes p x the share of the group's other
rows that took the same a from the same s. Both are turn rewards, so algorithms of per-turn credit
(GiGPO, VinePPO, REINFORCE++) place them on the turn (VinePPO's branches, for its values, are scored
without them). Both anneal linearly to 0 by explore_iters, and the temperature from
temperature_start to --temperature (the sampler's and the loss's, the step's throughout); the
steps after explore_iters sharpen at --temperature with no bonus.
"""
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Optional

from nanorl.config import UserError, check_bounds


@dataclass
class Flags:
    count_bonus: float = 0.0  # c: a turn earns c / sqrt(1 + N(s, a)); needs an Env with state()
    repeat_penalty: float = 0.0  # p x the share of its group's other rows with the same (s, a)
    temperature_start: Optional[float] = None  # hot: annealed linearly to --temperature
    explore_iters: Optional[int] = None  # the step the anneals end; None: max_iters


FLAGS = tuple(Flags.__annotations__)  # any of them set: rl.py explores


class Scheduled:
    """rl.py's step function (inner), checked and run with each step's config -> its stats and
    the schedule's values."""

    def __init__(self, cfg, algo, task, step):
        check_bounds(cfg, "temperature_start explore_iters > 0", "count_bonus repeat_penalty >= 0")
        if cfg.async_rollouts or cfg.inflight or cfg.replay or algo.family != "pg":
            raise UserError("the exploration flags (count_bonus, repeat_penalty, "
                            "temperature_start) need a synchronous policy-gradient algorithm")
        if cfg.temperature_start and cfg.staleness:  # its rollout was sampled k steps hotter
            raise UserError("--temperature_start sets each step's temperature, and --staleness=k "
                            "would train step s-k's rollout at step s's: set one of them")
        counted = cfg.count_bonus or cfg.repeat_penalty
        if counted and not (task.env_module and hasattr(task.env_module.Env, "state")):
            raise UserError("count_bonus and repeat_penalty count (state, action) pairs: the "
                            "task needs an environment whose Env has a state() method")
        if counted and algo.binary:
            raise UserError(f"count_bonus and repeat_penalty are turn rewards, and {cfg.loss} "
                            "needs 0/1 rewards")
        if not (counted or cfg.temperature_start):
            raise UserError("explore_iters ends the anneals of count_bonus, repeat_penalty and "
                            "temperature_start: set one of them")
        self.inner = step

    def __call__(self, cfg, algo, run, lr, gen):
        cfg = scheduled(cfg, run.state.step)
        return {**self.inner(cfg, algo, run, lr, gen), "rl/temperature": cfg.temperature,
                "rl/count_bonus": cfg.count_bonus, "rl/repeat_penalty": cfg.repeat_penalty}


def scheduled(cfg, done):
    """The config of the step after `done` steps: its temperature and bonus weights, annealed
    linearly over explore_iters steps (None: max_iters)."""
    frac = min(1.0, done / (cfg.explore_iters or cfg.max_iters))  # 1 from explore_iters on
    hot = cfg.temperature if cfg.temperature_start is None else cfg.temperature_start
    return replace(cfg, temperature=hot + (cfg.temperature - hot) * frac,
                   count_bonus=cfg.count_bonus * (1 - frac),
                   repeat_penalty=cfg.repeat_penalty * (1 - frac))


def bonus(cfg, counts, batch, episodes, G):
    """A sampler call's Rollout (its rows: episodes' envs, G a group) -> its turn rewards and
    rewards with each turn's count bonus and repeat penalty; then counts N(s, a) += its turns."""
    turns = [((v.row, v.end), (v.state, v.action)) for v in episodes.visits]
    in_group = Counter((row // G, key) for (row, _), key in turns)  # the group's same (s, a)
    for (row, end), key in turns:
        extra = cfg.count_bonus / math.sqrt(1 + counts[key])
        if G > 1:  # ReMax's greedy answer is a group of one: no other row to repeat
            extra -= cfg.repeat_penalty * (in_group[row // G, key] - 1) / (G - 1)
        batch.turn_rewards[row, end] += extra
        batch.reward[row] += extra
    counts.update(key for _, key in turns)
    return batch
