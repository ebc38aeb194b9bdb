"""The task a checkpoint was trained on (Task), and the routing of a task's name (one in
data.tasks.TASKS, env:NAME, rg:NAME or your folder) to its splits, verifier and environment;
held-out evaluation of a policy on it (greedy accuracy, unbiased pass@k, KL to the reference)."""
import importlib
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

import losses
from data.tasks import (ALPHABET, TASKS, DataError, Row, format_answer, flip_numbers, line_of,
                        load_split, parse_answer, problem_key)
from model import generate, logprobs, responses
from nanorl.checkpoint import ckpt_settings, load_checkpoint, model_from_checkpoint
from nanorl.config import UserError
from nanorl.rows import encode_prompts, gold_rows
from nanorl import rg, templates
from nanorl.episodes import Episodes, check_env, demo_rows
from tokenizer import final_text
from verify import VERIFIERS, grade


@dataclass
class Task:
    """The task a checkpoint was trained on: its tokenizer, digit order, verifier and splits, and
    the environment its episodes play in (an envs/ module, or None) with its arguments."""
    tok: object
    name: str  # a name in data.tasks.TASKS, env:NAME, rg:NAME, or a folder
    reverse: bool  # numbers least-significant digit first
    verifier_name: str  # a name in verify.VERIFIERS (an environment scores its own episodes)
    n_train: int  # the labels SFT saw: the first n_train of a seeded shuffle, 0 = all
    train: list = field(default_factory=list)  # [(prompt, answer)], or the rows a loss reads
    val: list = field(default_factory=list)
    test: list = field(default_factory=list)
    env_module: object = None  # the envs/ module of its episodes (env_of), or None
    env_args: dict = field(default_factory=dict)  # its Env's arguments (--env_args)
    template: str = "plain"  # how its episodes are written (nanorl/templates.py)
    rg: dict = field(default_factory=dict)  # an rg: task's generator config (nanorl/rg.py)
    scorer: object = None  # an rg: task's score(question, answer)
    max_new_tokens: int = 8  # SFT's: its answers (an environment's episodes) fit it
    grade: Callable = field(init=False, repr=False)  # (text, problem) -> score: __post_init__

    def __post_init__(self):  # the grade of a text, bound once: rg's generator's, or verify's
        self.grade = partial(grade_rg, self.scorer, self.reverse) if self.scorer else \
            partial(grade, self.verifier_name, self.reverse)

    @classmethod
    def of(cls, ckpt, path, tok, env_args=None):
        """The checkpoint's task (its own settings, never a reader's defaults), splits loaded."""
        name, reverse, vname = ckpt_settings(ckpt, path, "task", "reverse", "verifier")
        verifier_of(vname)
        c = ckpt["config"]  # the template: plain in a checkpoint older than templates
        splits, scorer = task_splits(name, c.get("rg") or {}, getattr(tok, "chars", None))
        task = cls(tok, name, reverse, vname, c.get("n_train", 0), *splits.values(),
                   env_module=env_of(name), rg=c.get("rg") or {}, scorer=scorer,
                   template=c.get("template", "plain"), env_args=env_args or {},
                   max_new_tokens=c.get("max_new_tokens", 8))
        task.check_data()
        return task

    @property
    def verifier(self):
        return VERIFIERS[self.verifier_name]

    def episodes(self, problems, G):
        """The episodes of G rows per problem for model.generate, or None without an environment."""
        return self.env_module and Episodes(self.env_module, problems, G, self.tok, self.reverse,
                                            self.env_args, templates.of(self.template))

    def gold_rows(self, problems):
        """[(prompt ids, gold answer ids + EOS[, its action mask])]: an environment's are its
        demonstrations played through it."""
        if self.env_module:
            return demo_rows(self.env_module, problems, self.tok, self.reverse,
                             template=templates.of(self.template))
        return gold_rows(self.tok, problems, self.reverse)

    def score(self, ids, act, problem, episodes=None, r=0):
        """A response's final score in [0, 1]: its episode's (row r of episodes), else the task's
        grade of the text the policy wrote after the environment's last token (rl.scored's)."""
        text = final_text(self.tok, ids, act)
        return episodes.score(r, text) if episodes is not None else self.grade(text, problem)

    def check_data(self):
        """The splits as they load. An environment's prompts are written by its template, and it
        keeps its Env contract and takes --env_args and its rows' fields (it scores its own
        episodes). Your own files' and rg: tasks' gold answers, written as the model writes them,
        must score 1 (else one line: file:line and the verifier that takes it); val or test
        prompts that reorder a train prompt's numbers and words get one warning."""
        if self.env_module or self.env_args:  # the prompts as the episodes' template writes them
            write = templates.of(self.template).prompt
            self.train, self.val, self.test = (
                [Row(write(row[0]), row[1], getattr(row, "fields", None), row[0]) for row in split]
                for split in (self.train, self.val, self.test))
            return check_env(self.name, self.env_module, self.env_args, self.train[0])
        if self.name in TASKS:  # generated tasks are right by construction
            return
        for split in ("train", "val", "test"):
            for i, (prompt, gold) in enumerate(getattr(self, split)):
                text = format_answer(gold, self.reverse)  # as the model writes it, then EOS
                if self.score(self.tok.encode(text) + [self.tok.eos_id], None, (prompt, gold)) < 1:
                    raise DataError(self.bad_gold(split, i, text))
        train = {problem_key(p): p for p, _ in self.train}
        near = [(p, train[problem_key(p)]) for s in (self.val, self.test) for p, _ in s
                if problem_key(p) in train]
        if near:
            print(f"warning: {self.name}: {len(near)} val/test prompts have a train prompt of the "
                  f"same numbers and words (a duplicate or reordering), e.g. {near[0][0]!r} and "
                  f"{near[0][1]!r}", flush=True)

    def bad_gold(self, split, i, text):
        """Why gold answer i of a split scores below 1, in one line."""
        prompt, gold = getattr(self, split)[i]
        if self.scorer:
            return (f"{self.name} {split}: the generator's own score_answer gives its gold answer "
                    f"{gold!r} to {prompt!r} less than 1")
        fits = [n for n, f in VERIFIERS.items() if f(text, gold, reverse=self.reverse) == 1]
        return (f"{line_of(self.name, split, i)} gold answer {gold!r} scores 0 under the verifier "
                f"{self.verifier_name!r}" + (f": use --verifier={fits[0]}" if fits else
                                              ", and under every other"))

    def normal_order(self, response):
        """A decoded response as a person reads it: with reverse, an answer's digits turned back
        ("486" for the model's "684"), an environment's numbers each turned back."""
        return (flip_numbers if self.env_module else parse_answer)(response, self.reverse)

    def settings(self):
        return {"task": self.name, "reverse": self.reverse, "verifier": self.verifier_name,
                "n_train": self.n_train, "rg": self.rg, "template": self.template}

    def check(self, max_new_tokens, block_size):
        """Every train prompt and max_new_tokens fit the model's context."""
        longest = max(map(len, encode_prompts(self.tok, [p for p, _ in self.train], self.reverse)))
        if longest + max_new_tokens > block_size:
            raise UserError(f"max_new_tokens={max_new_tokens} does not fit block_size={block_size}")


def task_splits(name, rg_config=None, alphabet=None):
    """({split: [(prompt, answer)]}, an rg: task's scorer or None): reasoning-gym's, the
    environment's, else data's; an empty split is one line. alphabet: the characters your own
    task may use (None: any)."""
    scorer = None
    if name.startswith("rg:"):
        splits, scorer = rg.splits(name[3:], rg_config or {})
    elif name.startswith("env:"):  # env:NAME:FOLDER: your JSONL, an Env's settings in its rows
        folder = name.split(":", 2)[2:]
        splits = {s: load_split(folder[0], s, alphabet) if folder else env_of(name).splits()[s]
                  for s in ("train", "val", "test")}
    else:
        splits = {s: load_split(name, s, alphabet) for s in ("train", "val", "test")}
    for split, problems in splits.items():  # the eval divides by each split's size
        if not problems:
            raise DataError(f"task {name!r}: its {split} split is empty")
    return splits, scorer


def env_of(task):
    """The environment a task names (an envs/ module: its TASKS env, env:NAME or env:NAME:FOLDER),
    or None."""
    name = TASKS.get(task, {}).get("env") or task.startswith("env:") and task.split(":")[1]
    if not name:
        return None
    try:
        return importlib.import_module(f"envs.{name}")
    except ModuleNotFoundError:
        raise DataError(f"task {task!r}: no environment {name!r} (a file envs/{name}.py)") from None


def task_alphabet(task, problems):
    """ALPHABET, plus the characters of the task's environment and of your own task's problems,
    sorted (the same files always give the same ids)."""
    text = ("" if task in TASKS else "".join(p + a for p, a in problems)) + \
        getattr(env_of(task), "CHARS", "")
    return ALPHABET + "".join(sorted(set(text) - set(ALPHABET)))


def grade_rg(scorer, reverse, text, problem):
    """An rg: task's grade: its generator's score_answer of the text, digits turned back (0 if the
    policy never ended)."""
    return 0.0 if text is None else scorer(problem[0], parse_answer(text, reverse))


def verifier_of(name):
    """The reward function verify.VERIFIERS[name], or a UserError naming the valid ones."""
    if name not in VERIFIERS:
        raise UserError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]


def load_policy(path, values, dev, env_args=None):
    """The SFT checkpoint -> (the policy in eval mode: no dropout in any log-prob, its
    Task). values: PPO's value head on the policy's trunk, 0 at the start, not noise."""
    ckpt = load_checkpoint(path, hint="make one with: python sft.py configs/mul.py")
    model, tok = model_from_checkpoint(ckpt, path, scalar_head=values)
    if values and not ckpt["model_args"].get("scalar_head"):
        torch.nn.init.zeros_(model.score_head.weight)
    return model.to(dev).eval(), Task.of(ckpt, path, tok, env_args)


# held-out evaluation: greedy answers and samples of a policy on its task's test and val
def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # C(n-c, k) = 0 when k > n-c


def pass_k_name(n_samples, k=8):
    """evaluate's pass@k metric name: pass@k, or pass@n_samples when fewer samples are drawn."""
    return f"pass@{min(k, n_samples)}"


@torch.no_grad()
def evaluate(model, task, split, max_new_tokens, n_samples=0, temperature=1.0, k=8, batch_size=256,
             generator=None, prefix="eval", n_show=3, ref=None):
    """Greedy accuracy (a score of 1) on a split of task, with an environment its episodes'
    turns; with n_samples > 0 also pass@1 and pass@k (n_samples per problem at `temperature`;
    pass@n_samples when fewer than k) and, given ref, those samples' KL to it (sample_kl).
    batch_size rows per sampler call at most (0: all in one). Returns (metrics, a few examples)."""
    tok, problems = task.tok, getattr(task, split)
    n, prompts = len(problems), encode_prompts(tok, [p for p, _ in problems], task.reverse)

    def sample(G, temp):  # -> ([(score, completion)] problem-major, [(episodes, generate's)])
        scored, outs, per_call = [], [], max(1, batch_size // G) if batch_size else n  # prompts
        for i in range(0, n, per_call):
            episodes = task.episodes(problems[i:i + per_call], G)
            out = generate(model, prompts[i:i + per_call], max_new_tokens, tok.eos_id, tok.pad_id,
                           G=G, temperature=temp, generator=generator, episodes=episodes)
            scored += score_samples(task, out, [p for p in problems[i:i + per_call]
                                                for _ in range(G)], episodes)
            outs.append((episodes, out))
        return scored, outs

    greedy, outs = sample(1, 0)
    metrics = {f"{prefix}/accuracy": sum(r == 1 for r, _ in greedy) / n, f"{prefix}/n": n,
               f"{prefix}/mean_score": sum(r for r, _ in greedy) / n,
               **(env_metrics(outs, prefix) if task.env_module else {})}
    examples = [{"prompt": p, "completion": text, "reward": r}
                for (p, _), (r, text) in zip(problems[:n_show], greedy)]
    if n_samples > 0:
        scored, outs = sample(n_samples, temperature)
        right = torch.tensor([r == 1 for r, _ in scored]).view(n, n_samples).sum(1).tolist()
        for kk in (1, k):
            metrics[f"{prefix}/{pass_k_name(n_samples, kk)}"] = \
                sum(pass_at_k(n_samples, int(c), min(kk, n_samples)) for c in right) / n
        if ref is not None:
            metrics.update(sample_kl(ref, outs, temperature, tok.eos_id, prefix))
        if task.env_module:  # the entropy where the oracle allows few moves
            metrics.update(critical_entropy(outs, prefix))
    return metrics, examples


def sample_kl(ref, calls, temperature, eos_id, prefix):
    """Sampler calls [(Episodes, generate's result)] -> the KL to ref (k3, a mean over the policy's
    tokens), the mean response length (its tokens with EOS), the share cut at max_new_tokens."""
    kl, n_act, finished = 0.0, 0, []
    for _, out in calls:
        mask = out["action_mask"][:, out["prompt_len"]:]  # (n, L)
        ref_lp = logprobs(ref, out["ids"], out["offsets"], mask, temperature)[0]
        kl += losses.masked_sum(losses.kl_estimate(out["logps"], ref_lp, "k3"), mask).item()
        n_act += mask.sum().item()
        finished += [r[-1:] == [eos_id] for r in responses(out)]
    return {f"{prefix}/kl": kl / max(1, n_act), f"{prefix}/resp_len": n_act / len(finished),
            f"{prefix}/truncated_frac": 1 - sum(finished) / len(finished)}


def score_samples(task, out, problems, episodes=None):
    """[(score, completion in normal order)] for each row of a `generate` result and its
    problem (Task.normal_order)."""
    acts = out["action_mask"][:, out["prompt_len"]:].tolist()
    return [(task.score(ids, act, p, episodes, r), task.normal_order(task.tok.decode(ids)))
            for r, (ids, p, act) in enumerate(zip(responses(out), problems, acts))]


def env_metrics(calls, prefix):
    """Sampler calls [(their Episodes, generate's result)] -> turns per episode, the share of
    turns the environment could not take, the shares of turns that ended malformed or at their
    cap (templates.read_turn), the share of response tokens it wrote, and with an oracle
    (Env.winning_moves) the losing states: the distinct states whose move lost a winnable game
    (greedy calls: the policy's modal move)."""
    turns, invalid = (torch.cat(t) for t in zip(*(episodes.stats() for episodes, _ in calls)))
    resp, act = (sum(out[k][:, out["prompt_len"]:].sum().item() for _, out in calls)
                 for k in ("response_mask", "action_mask"))
    out = {f"{prefix}/turns": turns.mean().item(),
           f"{prefix}/invalid_frac": invalid.sum().item() / max(1, turns.sum().item()),
           f"{prefix}/env_token_frac": 1 - act / max(1, resp),
           **{f"{prefix}/turns_{how}_frac": sum(v.how == how for e, _ in calls for v in e.visits)
              / max(1, turns.sum().item()) for how in ("malformed", "length")}}
    if any(v.before is not None for episodes, _ in calls for v in episodes.visits):
        out[f"{prefix}/losing_states"] = len(losing_states(episodes for episodes, _ in calls))
    return out


def losing_states(calls_episodes):
    """Episodes -> the set of states (Env.state()) from which a turn lost a winnable game."""
    return {v.state for episodes in calls_episodes for v in episodes.visits if v.lost}


def critical_entropy(calls, prefix, most=3):
    """Sampled calls -> the mean entropy (nats) of a move from a critical state (1 to `most`
    moves keep a win possible, Env.winning_moves): each move's -log pi(move), summed over its
    tokens, an unbiased estimate of the entropy of the move from its state. {} if none."""
    nll = [-out["logps"][v.row, v.start:v.end + 1].sum().item() for episodes, out in calls
           for v in episodes.visits if v.before is not None and 1 <= v.before <= most]
    return {f"{prefix}/critical_entropy": sum(nll) / len(nll)} if nll else {}


def evaluate_policy(model, ref, task, cfg, gen):
    """Greedy accuracy on test and val; on eval_samples samples of each test problem pass@1,
    pass@k and the KL to the reference -> (metrics, a few examples)."""
    kw = dict(batch_size=cfg.sample_batch_size, generator=gen)
    m, examples = evaluate(model, task, "test", cfg.max_new_tokens, n_samples=cfg.eval_samples,
                           temperature=cfg.temperature, ref=ref, **kw)
    val = evaluate(model, task, "val", cfg.max_new_tokens, prefix="val", **kw)[0]
    return {**m, **val}, examples
