"""
Environments in the sampler: a row's episode, opened by tasks that name one (an `envs/` file).

An environment is a class `Env` in an envs/ file, a fresh one per episode, built from a task row's
answer (its hidden state: a secret, never in the prompt) and --env_args; its contract is `Env`
below, checked when a task loads. An optional `state()` names the state a turn starts from
(hashable: GiGPO's step groups, the count bonus of nanorl/explore.py); an optional
`winning_moves()`, an oracle, counts the moves that keep a win possible (the eval's losing states
and critical-turn entropy). Text is in normal digit order: Episodes turns it as the task does.

Episodes holds the rows of one sampler call and gives model.generate its two hooks: `force` puts
the environment's pending tokens into the rows inside an observation (action 0, log-prob 0, a
token a decode step), and `end_turns` hands each row that sampled `turn_end` to its Env and queues
the observation (then EOS when the episode is done); the turn's reward lands on that token.
Every turn taken is kept as a Visit.
"""
import inspect
import random
from typing import Any, NamedTuple, Optional, Protocol

import torch

from data.tasks import DataError, format_prompt
from nanorl.config import UserError


class Env(Protocol):
    """One episode: what the class `Env` of an envs/ file has (envs/guess.py's, for one)."""
    turn_end: str  # the character that ends a policy turn
    max_turns: int  # the episode ends after this many turns (EOS forced)
    max_obs: int  # an observation's tokens at most (the rest is cut)
    invalid: int  # the turns so far it could not take (eval/invalid_frac)

    def step(self, turn: Optional[str]) -> tuple[str, float, bool]:
        """A turn's text (None: it held a special token) -> (observation, reward, done)."""

    def score(self, final: Optional[str]) -> float:
        """final: the policy's text after the last observation (None: no EOS) -> [0, 1]."""


def check_env(task, module, args, answer):
    """One line for a task without an environment given --env_args, --env_args its Env does not
    take, or an Env (built from a task answer) that lacks a member of the contract."""
    if module is None:
        raise UserError(f"--env_args: task {task!r} has no environment")
    valid = [p for p in inspect.signature(module.Env).parameters if p != "answer"]
    bad = [k for k in args if k not in valid]
    if bad:
        raise UserError(f"--env_args: {module.__name__}'s environment has no argument {bad[0]!r}; "
                        f"it takes {', '.join(valid) or 'none'}")
    env = module.Env(answer, **args)
    missing = [k for k in [*Env.__annotations__, "step", "score"] if not hasattr(env, k)]
    if missing or len(env.turn_end) != 1:
        why = f"it has no {missing[0]!r}" if missing else "turn_end is not one character"
        raise UserError(f"{module.__name__}.Env breaks nanorl/episodes.py's Env contract: {why}")


class Visit(NamedTuple):  # a turn taken: where it ends, from what, and the oracle's verdict
    row: int
    start: int  # its first token's response position
    end: int  # its last token's (where its reward lands)
    state: Any  # Env.state() before it (None without one): the count bonus's s
    action: Optional[str]  # its text, normal order (None: it held a special token)
    before: Optional[int]  # Env.winning_moves() before it and after (None without one)
    after: Optional[int]

    @property
    def lost(self):
        """The move lost a winnable game: winning moves before it, none after."""
        return self.before is not None and self.before > 0 and self.after == 0


class Episodes:
    """One episode per row, G rows per answer in the sampler's order, and the sampler's hooks."""

    def __init__(self, module, answers, G, tok, reverse, args):
        self.envs = [module.Env(a, **args) for a in answers for _ in range(G)]
        self.tok, self.reverse, self.eos = tok, reverse, tok.eos_id
        self.turn_end = tok.encode(module.Env.turn_end)[0]
        self.start = [0] * len(self.envs)  # where each row's current turn starts
        self.turns = [0] * len(self.envs)
        self.queue = {}  # row -> the observation's tokens it has still to take
        self.rewards = {}  # (row, response position) -> the reward of the turn that ended there
        self.visits = []  # every turn taken, a Visit each

    def force(self, tok, act):
        """Rows inside an observation take its next token, not their sample -> (tok, act), (N,)."""
        if self.queue:
            r = torch.tensor(list(self.queue), device=tok.device)
            tok[r], act[r] = torch.tensor([q.pop(0) for q in self.queue.values()]).to(tok), False
            self.queue = {k: q for k, q in self.queue.items() if q}
        return tok, act

    def end_turns(self, toks, act):
        """After a decode step (toks: the response's tokens so far, (N,) each): every row whose
        own last token ends its turn takes the environment's step; its observation is queued."""
        t, ends = len(toks) - 1, (act & (toks[-1] == self.turn_end)).nonzero()[:, 0].tolist()
        for r, ids in zip(ends, torch.stack(toks, 1)[ends].tolist() if ends else []):
            obs, self.rewards[r, t] = self.step(r, ids)
            if obs:
                self.queue[r] = obs

    def step(self, r, ids):
        """Row r's response ids so far end a turn -> (the ids to force, the turn's reward)."""
        env, turn = self.envs[r], ids[self.start[r]:-1]
        text = None if self.tok.special_ids.intersection(turn) else \
            format_prompt(self.tok.decode(turn), self.reverse)  # normal order
        oracle = getattr(env, "winning_moves", lambda: None)
        state, before = env.state() if hasattr(env, "state") else None, oracle()
        obs, reward, done = env.step(text)
        self.visits.append(Visit(r, self.start[r], len(ids) - 1, state, text, before, oracle()))
        self.turns[r] += 1
        obs = self.tok.encode(format_prompt(obs, self.reverse))[:env.max_obs]
        obs += [self.eos] if done or self.turns[r] >= env.max_turns else []
        self.start[r] = len(ids) + len(obs)
        return obs, float(reward)

    def retake(self, r, ids, act):
        """Row r's environment (fresh) retakes the turns of response ids (act: the policy's
        tokens) -> [(where each turn starts in ids, the state it starts from)], turns as
        losses.turn_index counts them; what the row samples next is a new response (a branch)."""
        env, out = self.envs[r], []
        for t, (i, a) in enumerate(zip(ids, act)):
            if a and (t == 0 or not act[t - 1]):  # a turn's first token
                out.append((t, env.state() if hasattr(env, "state") else None))
            if a and i == self.turn_end:
                self.step(r, ids[:t + 1])
        self.start[r] = 0
        return out

    def turn_rewards(self, L):
        """(N, L) each turn's reward on its last token, 0 elsewhere."""
        out = torch.zeros(len(self.envs), L)
        for (r, t), reward in self.rewards.items():
            out[r, t] = reward
        return out

    def score(self, r, final):
        """Row r's final score; final: the policy's text after the last observation, or None."""
        return float(self.envs[r].score(None if final is None else
                                        format_prompt(final, self.reverse)))

    def stats(self):
        """(turns, invalid turns), each (N,) float."""
        return (torch.tensor(self.turns, dtype=torch.float),
                torch.tensor([e.invalid for e in self.envs], dtype=torch.float))


def play_turns(module, answer, turns, tok, reverse):
    """Turns (normal order, each before its end) played through a fresh episode -> (their ids
    and the observations', the action mask, whether the episode ended)."""
    env, ids, mask = module.Env(answer), [], []
    for k, turn in enumerate(turns, 1):
        policy_ids = tok.encode(format_prompt(turn + env.turn_end, reverse))
        obs, _, done = env.step(turn)
        obs = tok.encode(format_prompt(obs, reverse))[:env.max_obs]
        ids += policy_ids + obs
        mask += [1] * len(policy_ids) + [0] * len(obs)
        if done or k >= env.max_turns:
            return ids, mask, True
    return ids, mask, False


def play_demo(module, answer, turns, final, tok, reverse):
    """A demonstration played through a fresh episode -> (its response ids, action mask): the
    turns and the observations they get (play_turns), then the final answer and EOS unless the
    environment ended the episode (EOS forced, action 0)."""
    ids, mask, done = play_turns(module, answer, turns, tok, reverse)
    if done:
        return ids + [tok.eos_id], mask + [0]
    if final is None:
        raise DataError(f"{module.__name__}: a demonstration ended before its episode did")
    policy_ids = tok.encode(format_prompt(final, reverse)) + [tok.eos_id]
    return ids + policy_ids, mask + [1] * len(policy_ids)


def demo_rows(module, problems, tok, reverse, seed=0):
    """[(prompt, answer)] -> [(prompt ids, demonstration ids + EOS, its action mask)] (SFT)."""
    rows = []
    for i, (prompt, answer) in enumerate(problems):
        turns, final = module.demo(prompt, answer, random.Random(f"{seed}:{i}"))
        rows.append((tok.encode(format_prompt(prompt, reverse)),
                     *play_demo(module, answer, turns, final, tok, reverse)))
    return rows
