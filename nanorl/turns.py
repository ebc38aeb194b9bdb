"""
Credit per turn (docs/algorithms.md#credit-per-turn-vineppo-and-gigpo; the formulas:
losses.vine_advantages, losses.step_advantages): after dynamic sampling, in the sampler, each kept
episode's turns are replayed through fresh environments (Episodes.retake) and every policy token
gets its turn's V(s_k) (VinePPO: the mean return from s_k of at least K = --branches continuations,
the group's other rows through the prefix, then branches sampled from it; never the row's own; or,
with --value_table, a running mean of every past return from the Env's state()) or state (GiGPO:
an Env's optional state()).

    python rl.py configs/rl_guess_pp.py configs/rl_guess_vine.py
    python rl.py configs/rl_guess_pp.py --loss=vineppo --value_table=0.05 --dynamic_sampling=false
    python rl.py configs/rl_guess.py configs/rl_guess_gigpo.py
"""
import torch

from model import generate, responses
from nanorl import rows
from nanorl.config import UserError

KINDS = ("vine", "step_group")  # the advantages of losses.ALGOS that read a turn's credit


def check(cfg, algo, task):
    """One line for a task or a flag the turns' credit cannot take."""
    env = task.env_module
    if algo.advantage == "step_group" and env and not hasattr(env.Env, "state"):
        raise UserError(f"{cfg.loss} groups turns by the environment's state: "
                        f"{env.__name__}.Env has no state() method")
    if algo.advantage == "vine" and cfg.branches is not None and cfg.branches < 1:
        raise UserError(f"branches must be >= 1, got {cfg.branches}")
    if algo.advantage == "vine" and cfg.value_table:  # 0 and None: branches
        check_table(cfg, env)
    if algo.advantage == "vine" and (cfg.reward != "verifier" or cfg.overlong_window):
        raise UserError(f"{cfg.loss} scores its branches as the episodes are scored: the "
                        "verifier (--reward=verifier), no shaping (--overlong_window=0)")


def check_table(cfg, env):
    """One line for a value table (--value_table set) VinePPO cannot keep."""
    if not 0 <= cfg.value_table <= 1:
        raise UserError(f"value_table must be in [0, 1], got {cfg.value_table}")
    if cfg.branches is not None:
        raise UserError("VinePPO's values come from --branches or from --value_table: set one")
    if not (env and hasattr(env.Env, "state")):
        raise UserError("value_table keys its values by the environment's state: the task "
                        "needs an environment whose Env has a state() method")
    if cfg.dynamic_sampling:
        raise UserError("value_table learns from every episode, and dynamic sampling drops the "
                        "groups without signal: set --dynamic_sampling=false")


@torch.no_grad()
def credit(cfg, algo, run, batch, idx, flat, gen):
    """The kept rows of the groups of problems idx (flat: those dynamic sampling dropped) ->
    batch, each token with its turn's value (VinePPO) or state (GiGPO)."""
    task, G, L = run.task, cfg.group_size, batch.mask.size(1)
    problems = [task.train[i] for i, f in zip(idx, flat.tolist())
                if not (f and cfg.dynamic_sampling)]  # one a group, as the batch's rows
    ids, acts = responses(batch), batch.mask.tolist()
    episodes = task.episodes(problems, G)  # fresh environments (None without one)
    turns = [episodes.retake(r, i, a) if episodes else [(0, None)]
             for r, (i, a) in enumerate(zip(ids, acts))]  # [(start, state)] a row
    if algo.advantage == "step_group":  # GiGPO: a state's id, the same for a group's equal states
        names = {}
        states = [[names.setdefault((r // G, s), len(names)) for _, s in row]
                  for r, row in enumerate(turns)]
        batch.states = spread(turns, states, L).long().to(batch.mask.device)
        return batch
    earned = batch.turn_rewards if batch.turn_rewards is not None else torch.zeros_like(batch.mu)

    def togo(r, s):  # row r's return from its response position s: later turns' and the score
        return batch.reward[r].item() - earned[r, :s].sum().item()
    if run.hp["value_table"]:  # V(s_k) from every visit to s_k so far, this call's too
        returns = [[togo(r, s) for s, _ in row] for r, row in enumerate(turns)]
        value = table_values(run.values, turns, returns, run.hp["value_table"])
        batch.values = spread(turns, value, L).to(batch.mask.device)
        return batch
    K, paths = run.hp["branches"], {}  # (group, prefix) -> the group's rows through it
    for r, row in enumerate(turns):
        for s, _ in row:
            paths.setdefault((r // G, tuple(ids[r][:s])), []).append(r)
    need = {key: max(0, K - len(rs) + 1) for key, rs in paths.items()}  # branches each needs
    branched = branch(cfg, run, problems, {key: (paths[key][0], n) for key, n in need.items() if n},
                      acts, gen)  # (group, prefix) -> its branches' returns
    value = {}  # (row, start) -> V(s_k): the other rows' returns from s_k and the branches'
    for (g, prefix), rs in paths.items():
        s = len(prefix)
        ret, extra = [togo(r, s) for r in rs], branched.get((g, prefix), [])
        for r, own in zip(rs, ret):
            value[r, s] = (sum(ret) - own + sum(extra)) / (len(rs) - 1 + len(extra))
    batch.values = spread(turns, [[value[r, s] for s, _ in row] for r, row in enumerate(turns)],
                          L).to(batch.mask.device)
    return batch


def table_values(table, turns, togo, rate):
    """VinePPO's V(s) from a table (state -> (N, V)) instead of branches: each visit to state s
    with return G moves V(s) by max(1/N, rate) (G - V(s)), a running mean that forgets at the
    rate once N > 1/rate; then every turn reads its state's -> [[V(s_k)] a row]."""
    for row, returns in zip(turns, togo):
        for (_, state), ret in zip(row, returns):
            n, v = table.get(state, (0, 0.0))
            table[state] = n + 1, v + max(1 / (n + 1), rate) * (ret - v)
    return [[table[state][1] for _, state in row] for row in turns]


def branch(cfg, run, problems, wanted, acts, gen):
    """wanted: (group, prefix) -> (a row through it, n): n continuations from each prefix, in
    sampler calls of prefixes of one length and n (the context holds the longest prompt and
    max_new_tokens) -> (group, prefix) -> the n continuations' returns."""
    task, tok = run.task, run.task.tok
    prompts = rows.encode_prompts(tok, [p for p, _ in problems], task.reverse)
    full = {key: prompts[key[0]] + list(key[1]) for key in wanted}  # the branches' prompts
    returns, calls = {}, {}
    for key, (_, n) in wanted.items():
        calls.setdefault((len(full[key]), n), []).append(key)
    for (_, n), keys in calls.items():
        per_call = max(1, cfg.sample_batch_size // n) if cfg.sample_batch_size else len(keys)
        for part in [keys[i:i + per_call] for i in range(0, len(keys), per_call)]:
            episodes = task.episodes([problems[g] for g, _ in part], n)
            for j, (g, prefix) in enumerate(part if episodes else []):  # replayed to the prefix
                r = wanted[g, prefix][0]
                for row in range(j * n, (j + 1) * n):
                    episodes.retake(row, list(prefix), acts[r][:len(prefix)])
            budget = torch.tensor([cfg.max_new_tokens - len(prefix) for _, prefix in part])
            out = generate(run.model, [full[key] for key in part], int(budget.max()), tok.eos_id,
                           tok.pad_id, G=n, temperature=cfg.temperature, generator=gen,
                           episodes=episodes, budget=budget.repeat_interleave(n).to(gen.device))
            act = out["action_mask"][:, out["prompt_len"]:].tolist()
            score = [task.score(i, a, problems[part[q // n][0]], episodes, q)
                     for q, (i, a) in enumerate(zip(responses(out), act))]
            ret = torch.tensor(score)  # (len(part) n,) the score and the turns' rewards
            ret += out["turn_rewards"].sum(1).cpu() if episodes else 0.0
            returns.update(zip(part, ret.view(-1, n).tolist()))
    return returns


def spread(turns, per_turn, L):
    """(N, L): each row's value of turn k from the turn's start to the next turn's."""
    out = torch.zeros(len(turns), L)
    for r, (row, values) in enumerate(zip(turns, per_turn)):
        for (start, _), v in zip(row, values):
            out[r, start:] = v
    return out
