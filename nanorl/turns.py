"""
Credit per turn of an environment's episodes, for the rows whose advantage is a turn's
(losses.vine_advantages, losses.step_advantages hold the formulas). After dynamic sampling, in
the sampler, each kept episode's turns are replayed through fresh environments
(Episodes.retake), and every policy token gets its turn's:

- VinePPO (Kazemnejad et al. 2024, arXiv 2410.01679): V(s_k), the value of the state turn k
  starts from, is the mean return from there of at least K = --branches continuations of that
  prefix (the prompt, then the episode up to the turn): the group's other rows through the same
  prefix, which are such continuations already, topped up with branches, new continuations
  sampled with the environment replayed to the prefix. A row's own future never enters its
  V (leave-one-out); V(s_0), the prompt's, is the group's other rows' mean return (G - 1 >= K:
  no branch); a prefix every row shares needs none either. model.generate's prefix tree runs
  a prefix's branches off one prefill.
- GiGPO (Feng et al. 2025, arXiv 2505.10978): the state each turn starts from, as the
  environment's optional `state()` names it; a group's turns from one state form a step group.
  Without an environment an episode is one turn, from the prompt.

    python rl.py configs/rl_guess_vine.py
    python rl.py configs/rl_guess_gigpo.py
"""
import torch

from model import generate
from nanorl import rows
from nanorl.config import UserError

KINDS = ("vine", "step")  # the advantages of losses.ALGOS that read a turn's credit


def check(cfg, algo, task):
    """One line for a task or a flag the turns' credit cannot take."""
    if algo.advantage == "step" and task.env_module and not hasattr(task.env_module.Env, "state"):
        raise UserError(f"{cfg.loss} groups turns by the environment's state: "
                        f"{task.env_module.__name__}.Env has no state() method")
    if algo.advantage == "vine" and cfg.branches is not None and cfg.branches < 1:
        raise UserError(f"branches must be >= 1, got {cfg.branches}")
    if algo.advantage == "vine" and (cfg.reward != "verifier" or cfg.overlong_window):
        raise UserError(f"{cfg.loss} scores its branches as the episodes are scored: the "
                        "verifier (--reward=verifier), no shaping (--overlong_window=0)")


@torch.no_grad()
def credit(cfg, algo, run, batch, idx, flat, gen):
    """The rows kept of the groups of train problems idx (flat: the groups without signal,
    dropped under dynamic sampling) -> batch, with values (VinePPO) or states (GiGPO) on
    each token: its turn's."""
    task, G, L = run.task, cfg.group_size, batch.mask.size(1)
    problems = [task.train[i] for i, f in zip(idx, flat.tolist())
                if not (f and cfg.dynamic_sampling)]  # one a group, as the batch's rows
    ids, acts = rows.responses(batch), batch.mask.tolist()
    episodes = task.episodes(problems, G)  # fresh environments (None without one)
    turns = [episodes.retake(r, i, a) if episodes else [(0, None)]
             for r, (i, a) in enumerate(zip(ids, acts))]  # [(start, state)] a row
    if algo.advantage == "step":  # GiGPO: a state's id, the same for a group's equal states
        names = {}
        states = [[names.setdefault((r // G, s), len(names)) for _, s in row]
                  for r, row in enumerate(turns)]
        batch.states = spread(turns, states, L).long().to(batch.mask.device)
        return batch
    K, paths = run.hp["branches"], {}  # (group, prefix) -> the group's rows through it
    for r, row in enumerate(turns):
        for s, _ in row:
            paths.setdefault((r // G, tuple(ids[r][:s])), []).append(r)
    got = {key: max(0, K - len(rs) + 1) for key, rs in paths.items()}  # branches each needs
    got = branch(cfg, run, problems, {key: (paths[key][0], n) for key, n in got.items() if n},
                 acts, gen)
    before = torch.zeros_like(batch.mask, dtype=torch.float) if batch.turn_rewards is None \
        else batch.turn_rewards.cumsum(1) - batch.turn_rewards  # (N, L) earned before each
    value = {}  # (row, start) -> V(s_k): the other rows' returns from s_k and the branches'
    for (g, prefix), rs in paths.items():
        s = len(prefix)
        togo = [batch.reward[r].item() - (before[r, s].item() if s else 0.0) for r in rs]
        extra = got.get((g, prefix), [])
        for r, own in zip(rs, togo):
            value[r, s] = (sum(togo) - own + sum(extra)) / (len(rs) - 1 + len(extra))
    batch.values = spread(turns, [[value[r, s] for s, _ in row] for r, row in enumerate(turns)],
                          L).to(batch.mask.device)
    return batch


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
        per_call = max(1, cfg.sample_batch_size // n)
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
                     for q, (i, a) in enumerate(zip(rows.responses(out), act))]
            ret = torch.tensor(score)  # (len(part) n,) the score and the turns' rewards
            ret += out["turn_rewards"].sum(1).cpu() if episodes else 0.0
            returns.update(zip(part, ret.view(-1, n).tolist()))
    return returns


def spread(turns, per_turn, L):
    """Each row's value of turn k on its positions, from its start to the next turn's ->
    (N, L) float."""
    out = torch.zeros(len(turns), L)
    for r, (row, values) in enumerate(zip(turns, per_turn)):
        for (start, _), v in zip(row, values):
            out[r, start:] = v
    return out
