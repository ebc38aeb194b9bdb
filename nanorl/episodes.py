"""
Environments in the sampler: a row's episode, opened by tasks that name one (an `envs/` file).

An environment is a class `Env` in an envs/ file, a fresh one per episode, built from a problem's
answer (its hidden state: a secret, never in the prompt) and --env_args; its contract is `Env`
below, checked when a task loads. It speaks text: its turns end on stop strings, and a template
(nanorl/templates.py) writes its episode for any tokenizer. An optional `state()` names the state a
turn starts from (hashable: GiGPO's step groups, the count bonus of nanorl/explore.py); an optional
`winning_moves()`, an oracle, counts the moves that keep a win possible (the eval's losing states
and critical-turn entropy); an optional `max_turn_tokens` cuts a turn that long. Text is in
normal digit order: Episodes turns it as the task does.

Episodes holds the rows of one sampler call and gives model.generate its two hooks: `force` puts
the environment's pending tokens into the rows inside an observation (action 0, log-prob 0, a
token a decode step), and `end_turns` hands each row whose last token completed a stop to its Env
and queues the template's bridge (the observation, then EOS when the episode is done); the turn's
reward lands on that token. Every turn taken is kept as a Visit. SFT's demonstrations are played
through the same bridge (play_demo): their ids are the ones the sampler makes when they are forced.
"""
import inspect
import random
from typing import Any, NamedTuple, Optional, Protocol

import torch

from data.tasks import DataError, flip_numbers
from nanorl import templates
from nanorl.config import UserError


class Env(Protocol):
    """One episode: what the class `Env` of an envs/ file has (envs/guess.py's, for one)."""
    stops: tuple  # the strings that end a policy turn (the plain template's)
    max_turns: int  # the episode ends after this many turns (EOS forced)
    max_obs: int  # an observation's tokens at most (the rest is cut)
    invalid: int  # the turns so far it could not take (eval/invalid_frac)

    def step(self, turn: Optional[str]) -> tuple[str, float, bool]:
        """A turn's text before its stop (None: unreadable: a special token inside, a second stop,
        cut at max_turn_tokens) -> (observation, reward, done)."""

    def score(self, final: Optional[str]) -> float:
        """final: the policy's text after the last observation (None: no EOS) -> [0, 1]."""


def check_env(task, module, args, row):
    """One line for a task without an environment given --env_args, --env_args or a row's fields
    its Env does not take, or an Env (built from a task row) that lacks a member of the contract."""
    if module is None:
        raise UserError(f"--env_args: task {task!r} has no environment")
    valid = [p for p in inspect.signature(module.Env).parameters if p not in ("answer", "prompt")]
    rows = f"task {task!r}'s rows"
    for where, keys in (("--env_args", args), (rows, getattr(row, "fields", {}))):
        if bad := [k for k in keys if k not in valid]:
            raise UserError(f"{where}: {module.__name__}'s environment has no argument {bad[0]!r}; "
                            f"it takes {', '.join(valid) or 'none'}")
    env = make_env(module, row, args)
    missing = [k for k in [*Env.__annotations__, "step", "score"] if not hasattr(env, k)]
    stops = getattr(env, "stops", None)
    if missing or not (isinstance(stops, tuple) and stops and all(isinstance(s, str) and s
                                                                   for s in stops)):
        why = f"it has no {missing[0]!r}" if missing else "stops is not a tuple of strings"
        raise UserError(f"{module.__name__}.Env breaks nanorl/episodes.py's Env contract: {why}")


def make_env(module, row, args):
    """A fresh Env from a problem (prompt, answer): the answer, its JSONL fields over
    --env_args, and the prompt (as the task wrote it, before a template) if the Env takes one."""
    prompt, answer = row
    kw = {**args, **getattr(row, "fields", {})}
    if "prompt" in inspect.signature(module.Env).parameters:
        kw["prompt"] = getattr(row, "source", prompt)
    return module.Env(answer, **kw)


class Visit(NamedTuple):  # a turn taken: where it ends, from what, and the oracle's verdict
    row: int
    start: int  # its first token's response position
    end: int  # its last token's (where its reward lands)
    state: Any  # Env.state() before it (None without one): the count bonus's s
    action: Optional[str]  # its text, normal order (None: unreadable)
    before: Optional[int]  # Env.winning_moves() before it and after (None without one)
    after: Optional[int]
    how: str = "stop"  # how it ended: stop, malformed (templates.read_turn), length (its cap)

    @property
    def lost(self):
        """The move lost a winnable game: winning moves before it, none after."""
        return self.before is not None and self.before > 0 and self.after == 0


class Episodes:
    """One episode per row, G rows per task row in the sampler's order, and the sampler's hooks."""

    def __init__(self, module, problems, G, tok, reverse, args, template=templates.Plain()):
        self.envs = [make_env(module, row, args) for row in problems for _ in range(G)]
        self.tok, self.reverse, self.eos, self.template = tok, reverse, tok.eos_id, template
        self.stops = template.stops(module.Env.stops)
        self.fast = templates.stop_ids(tok, self.stops)  # None: each turn's text is read
        self.fast_ids = torch.tensor(self.fast or ())  # (S,) built once, not each decode step
        self.cap = getattr(module.Env, "max_turn_tokens", None)  # a turn's tokens at most
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
        own last token ends its turn takes the environment's step; its bridge is queued. A stop
        that is one token is matched by id; otherwise every acting row's turn text is read."""
        t, rows = len(toks) - 1, act
        if self.fast and not self.cap:  # only a stop's id can end a turn
            rows = act & torch.isin(toks[-1], self.fast_ids.to(act.device))
        rows = rows.nonzero()[:, 0].tolist()
        for r, ids in zip(rows, torch.stack(toks, 1)[rows].tolist() if rows else []):
            ended = self.ended(r, ids)
            if ended:
                obs, self.rewards[r, t] = self.step(r, ids, *ended)
                if obs:
                    self.queue[r] = obs

    def ended(self, r, ids):
        """Row r's response ids so far, the last the policy's -> None while its turn goes on, else
        (the turn's text for the environment, or None: unreadable; how it ended)."""
        turn = ids[self.start[r]:]
        read = None if self.fast and turn[-1] not in self.fast else \
            templates.read_turn(self.tok, turn, self.stops)
        if read is None and self.cap and len(turn) >= self.cap:
            read = None, "length"
        if read is None or read[1] == "eos":  # EOS: the final answer, for Env.score
            return None
        text, how = read
        return (None if text is None else
                self.template.turn(flip_numbers(text, self.reverse))), how  # normal order

    def step(self, r, ids, text, how="stop"):
        """Row r's response ids so far end a turn whose text is text -> (the bridge's ids to
        force, the turn's reward)."""
        env = self.envs[r]
        oracle = getattr(env, "winning_moves", lambda: None)
        state, before = env.state() if hasattr(env, "state") else None, oracle()
        obs, reward, done = env.step(text)
        self.visits.append(Visit(r, self.start[r], len(ids) - 1, state, text, before, oracle(),
                                 how))
        self.turns[r] += 1
        obs = bridge(self.tok, self.template, env, obs, done or self.turns[r] >= env.max_turns,
                     self.reverse)
        self.start[r] = len(ids) + len(obs)
        return obs, float(reward)

    def retake(self, r, ids, act):
        """Row r's environment (fresh) retakes the turns of response ids (act: the policy's
        tokens) -> [(where each turn starts in ids, the state it starts from)], turns as
        losses.turn_index counts them; what the row samples next is a new response (a branch)."""
        env, out = self.envs[r], []
        for t, a in enumerate(act):
            if a and (t == 0 or not act[t - 1]):  # a turn's first token
                out.append((t, env.state() if hasattr(env, "state") else None))
            if a and (ended := self.ended(r, ids[:t + 1])):
                self.step(r, ids[:t + 1], *ended)
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
                                        flip_numbers(final, self.reverse)))

    def stats(self):
        """(turns, invalid turns), each (N,) float."""
        return (torch.tensor(self.turns, dtype=torch.float),
                torch.tensor([e.invalid for e in self.envs], dtype=torch.float))


def bridge(tok, template, env, obs, done, reverse):
    """The environment's answer to a turn -> the ids forced after it: its text cut to env.max_obs
    tokens, written by the template and encoded alone, then EOS if the episode is done."""
    cut = tok.decode(tok.encode(flip_numbers(obs, reverse))[:env.max_obs])  # as the model reads
    text = template.observation(flip_numbers(cut, reverse), done)
    return tok.encode(flip_numbers(text, reverse)) + ([tok.eos_id] if done else [])


def play_turns(module, row, turns, tok, reverse, template=templates.Plain()):
    """Turns (normal order, each before its stop) played through a fresh episode as the sampler
    plays them when they are forced -> (their ids and the bridges', the action mask, whether the
    episode ended). A turn the sampler would end elsewhere, or read otherwise, is a DataError."""
    episodes, ids, mask = Episodes(module, [row], 1, tok, reverse, {}, template), [], []
    for turn in turns:
        policy = tok.encode(flip_numbers(template.demo_turn(turn, episodes.stops[0]), reverse))
        ends = [episodes.ended(0, ids + policy[:j]) for j in range(1, len(policy) + 1)]
        if any(ends[:-1]) or ends[-1] != (turn, "stop"):
            raise DataError(f"{module.__name__}: the demonstration's turn {turn!r}, written "
                            f"{template.demo_turn(turn, episodes.stops[0])!r}, is not read back "
                            "as one turn")
        obs = episodes.step(0, ids + policy, turn)[0]
        ids, mask = ids + policy + obs, mask + [1] * len(policy) + [0] * len(obs)
        if obs[-1:] == [tok.eos_id]:
            return ids, mask, True
    return ids, mask, False


def play_demo(module, row, turns, final, tok, reverse, template=templates.Plain()):
    """A demonstration played through a fresh episode -> (its response ids, action mask): the
    turns and the bridges they get (play_turns), then the final answer and EOS unless the
    environment ended the episode (EOS forced, action 0)."""
    ids, mask, done = play_turns(module, row, turns, tok, reverse, template)
    if done:
        return ids, mask
    if final is None:
        raise DataError(f"{module.__name__}: a demonstration ended before its episode did")
    policy_ids = tok.encode(flip_numbers(template.final(final), reverse)) + [tok.eos_id]
    return ids + policy_ids, mask + [1] * len(policy_ids)


def demo_rows(module, problems, tok, reverse, seed=0, template=templates.Plain()):
    """[(prompt, answer)] (the prompt as the template writes it) -> [(prompt ids, demonstration
    ids + EOS, its action mask)] (SFT)."""
    rows = []
    for i, row in enumerate(problems):
        prompt, answer = row  # the demo reads the prompt as the task wrote it
        turns, final = module.demo(getattr(row, "source", prompt), answer,
                                   random.Random(f"{seed}:{i}"))
        rows.append((tok.encode(flip_numbers(prompt, reverse)),
                     *play_demo(module, row, turns, final, tok, reverse, template)))
    return rows
