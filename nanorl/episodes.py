"""
Environments in the sampler: a row's episode, opened by tasks that name one (an `envs/` file).

An environment is a small class, a fresh one per episode, built from a task row's answer (the
hidden state: a secret is in the row's answer, never in its prompt). It declares `turn_end`, the
character that ends a policy turn, `max_turns` and `max_obs` (tokens); `step(turn)` takes the
text of a turn (None if it held a special token) and returns (observation, reward, done), and
`score(final)` the episode's final score, `final` being the text the policy wrote after the last
observation (None if it never ended with EOS). Text is in normal digit order: Episodes turns it
as the task writes it. `invalid` counts the turns it could not take.

Episodes holds the rows of one sampler call; model.generate calls `step` when a row samples the
turn's end and forces the observation (then EOS when done) into that row, a token a decode step,
action 0, log-prob 0; the turn's reward lands on its last action token (`turn_rewards`).
"""
import inspect
import random

import torch

from data.tasks import DataError, format_prompt
from nanorl.config import UserError


def check_args(task, env, args):
    """A one-line error for --env_args a task's environment (None: none) does not take."""
    if env is None:
        raise UserError(f"--env_args: task {task!r} has no environment")
    valid = [p for p in inspect.signature(env.Env).parameters if p != "answer"]
    bad = [k for k in args if k not in valid]
    if bad:
        raise UserError(f"--env_args: {env.__name__}'s environment has no argument {bad[0]!r}; "
                        f"it takes {', '.join(valid) or 'none'}")


class Episodes:
    """One episode per row: G rows per answer, in the sampler's order."""

    def __init__(self, env, answers, G, tok, reverse, args):
        self.envs = [env.Env(a, **args) for a in answers for _ in range(G)]
        self.tok, self.reverse, self.eos = tok, reverse, tok.eos_id
        self.turn_end = tok.encode(env.Env.turn_end)[0]
        self.start = [0] * len(self.envs)  # where each row's current turn starts
        self.turns = [0] * len(self.envs)

    def step(self, r, ids):
        """Row r's response ids so far end a turn -> (the ids to force, the turn's reward)."""
        env, turn = self.envs[r], ids[self.start[r]:-1]
        text = None if self.tok.special_ids.intersection(turn) else \
            format_prompt(self.tok.decode(turn), self.reverse)  # normal order
        obs, reward, done = env.step(text)
        self.turns[r] += 1
        obs = self.tok.encode(format_prompt(obs, self.reverse))[:env.max_obs]
        obs += [self.eos] if done or self.turns[r] >= env.max_turns else []
        self.start[r] = len(ids) + len(obs)
        return obs, float(reward)

    def score(self, r, final):
        """Row r's final score; final: the policy's text after the last observation, or None."""
        return float(self.envs[r].score(None if final is None else
                                        format_prompt(final, self.reverse)))

    def stats(self, rows=slice(None)):
        """(turns, invalid turns), each (N,) float."""
        return (torch.tensor(self.turns[rows], dtype=torch.float),
                torch.tensor([e.invalid for e in self.envs[rows]], dtype=torch.float))


def replay(env, answer, turns, final, tok, reverse):
    """A demonstration played through a fresh episode -> (its response ids, action mask): the
    turns (normal order, each before its end) and the observations they get, then the final
    answer and EOS unless the environment ended the episode (EOS forced, action 0)."""
    episode, ids, mask = env.Env(answer), [], []
    for k, turn in enumerate(turns, 1):
        policy_ids = tok.encode(format_prompt(turn + env.Env.turn_end, reverse))
        obs, _, done = episode.step(turn)
        obs = tok.encode(format_prompt(obs, reverse))[:env.Env.max_obs]
        ids, mask = ids + policy_ids + obs, mask + [1] * len(policy_ids) + [0] * len(obs)
        if done or k >= env.Env.max_turns:
            return ids + [tok.eos_id], mask + [0]
    if final is None:
        raise DataError(f"{env.__name__}: a demonstration ended before its episode did")
    policy_ids = tok.encode(format_prompt(final, reverse)) + [tok.eos_id]
    return ids + policy_ids, mask + [1] * len(policy_ids)


def demo_rows(env, problems, tok, reverse, seed=0):
    """[(prompt, answer)] -> [(prompt ids, demonstration ids + EOS, its action mask)] (SFT)."""
    rows = []
    for i, (prompt, answer) in enumerate(problems):
        turns, final = env.demo(prompt, answer, random.Random(f"{seed}:{i}"))
        rows.append((tok.encode(format_prompt(prompt, reverse)),
                     *replay(env, answer, turns, final, tok, reverse)))
    return rows
