"""Tool use: the calculator (envs/calculator.py, fuzzed with hostile text and ids), the traces it
replays, the sampler that runs it, and the action mask that keeps the environment's tokens out of
every loss."""
import copy
import functools
import math
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

import losses as L
from by_name import LOSSES
import model as M
import rl
import sft
from data.tasks import flip_numbers, load_split
from envs.calculator import CHARS, MAX_CALLS, MAX_DIGITS, calculator, demo
from model import GPT, GPTConfig, generate, logprobs
from nanorl import pref
from nanorl.episodes import Episodes, play_demo
from nanorl.evaluate import Task, env_metrics, env_of, task_alphabet
from rl import rollout_metrics
from tests.test_rl import make_run
from tokenizer import CharTokenizer

CALC = env_of("mul3_tool")  # the calculator module
TOK = CharTokenizer(task_alphabet("mul3_tool", []))
CALL = re.compile(r"\[([^\]]*)\]\{([^}]*)\}")


def episodes(problems, G=1, **args):
    """The calculator's episodes of G rows per problem, as rl.py and the evals make them."""
    return Episodes(CALC, problems, G, TOK, True, args)


def end(env, r, ids):
    """Row r's response ids, the last completing a stop, through env as the sampler hands them over
    -> (the bridge's ids, the turn's reward)."""
    return env.step(r, ids, *env.ended(r, ids))


def task(problems=(), test=(), **kw):
    return Task(TOK, "mul3_tool", True, "exact", 0, list(problems), [], list(test), env_module=CALC, **kw)


def trace(prompt, answer):
    """The demonstration's text in normal order."""
    turns, final = demo(prompt, answer)
    return "".join(f"{t}]{{{calculator(t[1:])}}}" for t in turns) + final


def oracle(text, reverse):
    """The grammar, written independently: `a*d` or a sum of 2-4 numbers of 1-8 ASCII digits."""
    ok = lambda s: 1 <= len(s) <= MAX_DIGITS and all(c in "0123456789" for c in s)  # noqa: E731
    flip = (lambda s: s[::-1]) if reverse else (lambda s: s)  # noqa: E731
    a, star, d = text.partition("*")
    if star and ok(a) and len(d) == 1 and ok(d):
        return flip(str(int(flip(a)) * int(d)))
    terms = text.split("+")
    if 2 <= len(terms) <= 4 and all(map(ok, terms)):
        return flip(str(sum(int(flip(t)) for t in terms)))
    return "?"


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), st.text("0123456789+*-٣ x\n", max_size=40),
                 st.text("0123456789", min_size=1, max_size=2000)))
def test_calculator_is_total_and_follows_its_grammar(text):
    """Garbage, unicode digits (\\d would take them), huge numbers: a string, never an error."""
    out = calculator(text)
    assert out == oracle(text, False)
    assert out == "?" or (out.isascii() and out.isdigit() and len(out) <= MAX_DIGITS + 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, TOK.vocab_size - 1), max_size=120))
def test_the_environment_answers_any_ids_with_a_bounded_result(ids):
    """Any turn ending with `]` (specials, nested calls, no open) -> `{...}`, reward 0."""
    env = episodes([("1*1=", "1")])
    out, reward = end(env, 0, ids + TOK.encode("]"))
    assert reward == 0 and TOK.decode(out[:1]) == "{" and 3 <= len(out) <= MAX_DIGITS + 4
    assert re.fullmatch(r"\{([0-9]+|\?)\}", TOK.decode(out[:-1] if out[-1] == TOK.eos_id else out))


def test_calls_past_the_limit_and_specials_get_the_error_token():
    """Numbers as the model writes them (reversed): `[21*3]` is 12 * 3, answered `{63}`."""
    env, call, ids = episodes([("1*1=", "1")]), TOK.encode("[21*3]"), []
    for k in range(1, 2 * MAX_CALLS + 1):
        ids += call
        obs, _ = end(env, 0, ids)
        ids += obs
        want = "{63}" if k <= MAX_CALLS else "{?}"
        assert obs == TOK.encode(want) + ([TOK.eos_id] if k == 2 * MAX_CALLS else [])
    assert end(episodes([("1*1=", "1")], broken=True), 0, call)[0] == TOK.encode("{?}")
    special = TOK.encode("[21*") + [TOK.eos_id] + TOK.encode("3]")
    assert end(episodes([("1*1=", "1")]), 0, special)[0] == TOK.encode("{?}")
    assert end(episodes([("1*1=", "1")]), 0, TOK.encode("21*3]"))[0] == TOK.encode("{?}")  # no open
    assert env.stats()[0].tolist() == [8] and env.stats()[1].tolist() == [4]  # turns, invalid


@pytest.mark.parametrize("reverse", [True, False])
def test_every_trace_replays_through_the_calculator(reverse):
    """All 10k problems of every split: each call's result is the calculator's, MAX_CALLS
    calls, the final answer scores 1, and the replayed ids are the trace's."""
    for split in ("train", "val", "test"):
        for p, a in load_split("mul3_tool", split):
            text = trace(p, a)
            calls = CALL.findall(text)
            assert len(calls) == MAX_CALLS and all(calculator(e) == r for e, r in calls)
            ids, mask = play_demo(CALC, (p, a), *demo(p, a), TOK, reverse)
            assert ids == TOK.encode(flip_numbers(text, reverse)) + [TOK.eos_id]
            assert CALC.Env(a).score(text.rpartition("}")[2]) == 1.0


def test_sft_loss_is_zero_exactly_on_the_tool_results():
    problems = load_split("mul3_tool", "test")[:50]
    for loss_on in ("response", "all"):
        x, y, mask = sft.encode_split(task().gold_rows(problems), TOK.pad_id, loss_on)
        for row, m, (p, a) in zip(y.tolist(), mask.tolist(), problems):
            start = len(TOK.encode(flip_numbers(p, True))) - 1  # y: the inputs shifted by one
            got = [t for t, k in zip(row[start:], m[start:]) if k]  # the trace's targets
            text = re.sub(r"\{[^}]*\}", "", flip_numbers(trace(p, a), True))
            assert got == TOK.encode(text) + [TOK.eos_id]  # the results are never targets
            assert all(m[:start]) == (loss_on == "all") and any(m[:start]) == (loss_on == "all")


# ---------------------------------------------------------------- the sampler runs the tool


def tool_model(seed=0, values=False):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=96, vocab_size=TOK.vocab_size, n_layer=2, n_head=2,
                         n_embd=32, scalar_head=values)).eval()


def sample(model, use_cache=True, G=8, seed=1, temperature=1.0):
    problems = load_split("mul3_tool", "val")[:6]
    prompts = [TOK.encode(flip_numbers(p, True)) for p, _ in problems]
    return generate(model, prompts, 40, TOK.eos_id, TOK.pad_id, G=G, temperature=temperature,
                    generator=torch.Generator().manual_seed(seed), use_cache=use_cache,
                    episodes=episodes(problems, G))


def test_sampler_forces_the_results_and_matches_the_trainer_with_and_without_cache():
    model = tool_model()
    out, plain = sample(model), sample(model, use_cache=False)
    for k in ("ids", "response_mask", "action_mask", "offsets"):
        assert torch.equal(out[k], plain[k]), k
    torch.testing.assert_close(out["logps"], plain["logps"], atol=1e-5, rtol=0)
    P = out["prompt_len"]
    act, resp = out["action_mask"][:, P:], out["response_mask"][:, P:]  # (N, L)
    n_calls, problems = [], load_split("mul3_tool", "val")[:6]
    for r, (ids, a, n) in enumerate(zip(out["ids"][:, P:].tolist(), act.tolist(), resp.sum(1).tolist())):
        closes, again, forced_all = [t for t in range(n) if a[t] and ids[t] == TOK.encode("]")[0]], \
            episodes(problems[r // 8:r // 8 + 1]), 0  # the row's calls replayed in a fresh episode
        for t in closes:  # the environment's tokens right after each call, none its own
            forced = end(again, 0, ids[:t + 1])[0][:n - t - 1]
            assert ids[t + 1:t + 1 + len(forced)] == forced
            assert not any(a[t + 1:t + 1 + len(forced)])
            forced_all += len(forced)
        assert sum(a[:n]) + forced_all == n
        n_calls.append(len(closes))
    assert {0, 1} <= set(n_calls) and max(n_calls) >= 3  # rows with no, one and several calls
    assert (out["logps"][act == 0] == 0).all()  # forced: log-prob 0
    lp = logprobs(model, out["ids"], out["offsets"], act, 1.0)[0]  # (N, L) the trainer's
    torch.testing.assert_close(lp, out["logps"], atol=2e-5, rtol=0)
    assert (lp[act == 0] == 0).all()


def test_forced_tokens_count_against_max_new_tokens():
    out = sample(tool_model(), G=4)
    assert out["ids"].size(1) - out["prompt_len"] <= 40


# ---------------------------------------------------------------- no leak through the mask


@functools.lru_cache(maxsize=1)
def sampled_rollout(G=4):
    """A rollout of a tiny random model with the calculator live: every group mixed 0/1."""
    model = tool_model(seed=3)
    out = sample(model, G=G, seed=5)
    P, N = out["prompt_len"], len(out["ids"])
    act, n = out["action_mask"][:, P:], out["response_mask"][:, P:].sum(1)
    reward = torch.tensor([1.0, 0.0] * (N // 2))
    b = rl.rows.Rollout(out["ids"], out["offsets"], act, out["logps"], out["logps"], reward, reward,
                   torch.full((N,), -1), n.float(), torch.ones(N, dtype=torch.bool))
    assert ((act == 0) & (torch.arange(act.size(1)) < n[:, None])).any(1).sum() >= N // 3
    return b


def tool_rollout():
    return copy.deepcopy(sampled_rollout())


def env_noise(monkeypatch, responses, scale):
    """Patch model.response_forward: add `scale` x noise to the logits (and the value head)
    that score the environment's tokens of any row whose response is one of `responses`
    [(ids, action mask)]."""
    env = {tuple(r): (torch.tensor(m) == 0).float() for r, m in responses}  # 1: the env's
    real, fired = M.response_forward, []

    def noisy(model, ids, offsets, P, used, return_scalar=False):
        out = real(model, ids, offsets, P, used, return_scalar)
        z, head = out if return_scalar else (out, None)
        e = torch.zeros(z.shape[:2])  # (N, L)
        for r, row in enumerate(ids[:, P:].tolist()):
            k = max((len(key) for key in env if tuple(row[:len(key)]) == key), default=0)
            e[r, :k] = env[tuple(row[:k])] if k else 0
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(len(fired)))
        fired.append(int(e.sum()))
        z = z + scale * e[..., None] * noise
        return (z, head + scale * e) if return_scalar else z

    monkeypatch.setattr(M, "response_forward", noisy)
    return fired


def with_turn_credit(b, name):
    """b with the per-turn inputs a row of nanorl/turns.py reads (values, state ids), if it reads them."""
    if L.ALGOS[name].advantage in ("vine", "step_group"):
        b.values = torch.rand(b.mask.shape, generator=torch.Generator().manual_seed(0))  # (N, L)
        b.states = L.turn_index(b.mask).clamp_min(0)  # (N, L) the turn: a state each
    return b


def loss_and_grads(name, b, monkeypatch, scale, model_fn=None, gold=None):
    """One loss of algorithm `name` on rollout b (pg: rl.pg_step at lr 0, unclipped: its
    advantages, its one update's loss and gradient; pairs, rft, sft: pref.rows_loss on `gold` rows)
    with the environment's logits moved by scale -> (loss, gradients). model_fn(seed, values): a
    model of b's vocabulary (default: the tool task's)."""
    row, model_fn = L.ALGOS[name], model_fn or tool_model
    model = model_fn(seed=3, values="values" in row.needs).train()  # b's sampler, [a head]
    cfg = rl.Config(loss=name, group_size=4, micro_batch_size=1024, overlong_window=0, grad_clip=0.0,
                    beta=0.1 if "beta" in row.defaults else None, dynamic_sampling=False,
                    pass_k=2 if name == "pass_at_k" else None)  # k below the group of 4
    teacher = model_fn(seed=9) if "teacher" in row.needs else None
    run, b = make_run(cfg, model, teacher=teacher), copy.copy(b)
    b.baseline = torch.linspace(0, 1, len(b.ids))  # (N,) ReMax's greedy rewards
    P = b.ids.size(1) - b.mask.size(1)
    gold = gold or task().gold_rows(load_split("mul3_tool", "val")[:8])
    fired = env_noise(monkeypatch, [(b.ids[r, P:P + k].tolist(), b.mask[r, :k].tolist()) for r, k
                                    in enumerate(b.length.long().tolist())] +
                      [(r, m) for _, r, m in gold], scale)
    model.zero_grad()
    if row.family == "pg":
        loss = torch.tensor(rl.pg_step(cfg, row, run, 0.0, torch.Generator().manual_seed(0), (b, {}))["rl/loss"])
    else:
        rows, labels = (gold, None) if row.data == "gold" else \
            pref.rollout_rows(b, row, cfg.group_size)
        loss, _ = pref.rows_loss(model, run.ref, 0, rows, labels, row, run.hp)  # PAD 0
    assert sum(fired) > 0, "no environment token reached the model"
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_no_leak(name, b, monkeypatch, **kw):
    loss, grads = loss_and_grads(name, b, monkeypatch, 0.0, **kw)
    moved, moved_grads = loss_and_grads(name, b, monkeypatch, 5.0, **kw)
    assert torch.isfinite(loss) and grads
    torch.testing.assert_close(moved, loss, atol=1e-6, rtol=1e-5)
    for g, h in zip(grads, moved_grads):
        torch.testing.assert_close(h, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(L.ALGOS))
def test_environment_logits_never_reach_a_loss_or_its_gradient(name, monkeypatch):
    b = tool_rollout()
    if L.ALGOS[name].data == "samples":  # rft: the correct rows
        b.score = b.reward.clone()
    with_turn_credit(b, name)  # VinePPO's values, GiGPO's states: any will do
    assert_no_leak(name, b, monkeypatch)


@pytest.mark.parametrize("name", ["grpo", "ppo", "dpo"])
def test_the_leak_test_fails_when_the_action_mask_is_ignored(name, monkeypatch):
    """The same check with the response mask in place of the action mask: it sees the leak."""
    b = tool_rollout()
    b.mask = (torch.arange(b.mask.size(1)) < b.length[:, None]).long()  # (N, L) every token
    with pytest.raises(AssertionError):
        assert_no_leak(name, b, monkeypatch)


def test_the_token_mean_divides_by_the_policys_tokens_by_hand():
    """dapo divides by every action token of the batch: at ratio 1 its loss is minus the sum of
    each row's advantage over its action tokens, over their count, never the response length."""
    b = tool_rollout()
    cfg = rl.Config(loss="dapo", group_size=4, micro_batch_size=1024, overlong_window=0)
    run = make_run(cfg, tool_model(seed=3))
    adv, _ = run.advantages(cfg, L.ALGOS["dapo"], run, b)
    loss = rl.pg_step(cfg, L.ALGOS["dapo"], run, 0.0, None, (b, {}))["rl/loss"]  # at ratio 1
    acts = b.mask.sum(1).tolist()  # (N,) the policy's tokens of each row
    assert sum(acts) < b.length.sum().item()
    want = -sum(a * n for a, n in zip(adv.tolist(), acts)) / sum(acts)
    assert loss == pytest.approx(want, abs=1e-5)


def test_eval_kl_and_length_count_only_the_policys_tokens_by_hand():
    """eval/kl is the k3 KL to the reference averaged over the action tokens of the eval samples
    (2 per test prompt here), eval/resp_len their count per answer: the calculator's results are in
    neither."""
    from nanorl.evaluate import evaluate
    from nanorl.rows import encode_prompts
    policy, ref = tool_model(seed=3), tool_model(seed=4)
    test = load_split("mul3_tool", "val")[:6]
    m = evaluate(policy, task(test=test), "test", 40, n_samples=2, batch_size=4, ref=ref,
                 generator=torch.Generator().manual_seed(7))[0]
    gen = torch.Generator().manual_seed(7)  # the greedy pass draws nothing from it
    kl, n_act, n_resp, rows = 0.0, 0, 0, 0
    for i in range(0, 6, 2):  # batch_size 4: 2 prompts x 2 samples a call
        prompts = encode_prompts(TOK, [p for p, _ in test[i:i + 2]], True)
        out = generate(policy, prompts, 40, TOK.eos_id, TOK.pad_id, G=2, generator=gen,
                       episodes=episodes(test[i:i + 2], 2))
        P, n_resp = out["prompt_len"], n_resp + out["response_mask"].sum().item()
        ref_lp = logprobs(ref, out["ids"], out["offsets"], out["action_mask"][:, P:])[0]
        for r, acts in enumerate(out["action_mask"][:, P:].tolist()):
            for t, a in enumerate(acts):
                if a:
                    x = ref_lp[r, t].item() - out["logps"][r, t].item()
                    kl, n_act = kl + math.exp(x) - x - 1, n_act + 1
            rows += 1
    assert n_act < n_resp  # the environment wrote some tokens
    assert m["eval/kl"] == pytest.approx(kl / n_act, rel=1e-4) and m["eval/resp_len"] == n_act / rows


# ---------------------------------------------------------------- gaps in the response


def test_gae_and_return_to_go_carry_across_an_environment_span_by_hand():
    """Tokens a, b (policy), e1 e2 (environment), c (policy, last): the environment's positions
    are skipped, so b's successor is c."""
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    r = torch.tensor([[0.1, 0.2, 9.0, 9.0, 1.0]])  # env rewards: never read
    v = torch.tensor([[0.5, 0.4, 7.0, 7.0, 0.3]])
    g, lam = 0.9, 0.8
    d_c = 1.0 - 0.3
    d_b = 0.2 + g * 0.3 - 0.4
    d_a = 0.1 + g * 0.4 - 0.5
    a_c, a_b = d_c, d_b + g * lam * d_c
    a_a = d_a + g * lam * a_b
    adv, ret = L.gae(r, v, mask, g, lam)
    torch.testing.assert_close(adv, torch.tensor([[a_a, a_b, 0, 0, a_c]]))
    torch.testing.assert_close(ret, torch.tensor([[a_a + 0.5, a_b + 0.4, 0, 0, a_c + 0.3]]))
    adv, ret = L.gae(r, torch.zeros_like(v), mask, 1.0, 1.0)  # REINFORCE++: return-to-go
    torch.testing.assert_close(adv, torch.tensor([[1.3, 1.2, 0, 0, 1.0]]))


def test_the_score_lands_on_the_last_action_token():
    mask = torch.tensor([[1, 0, 0, 1, 0], [1, 1, 1, 0, 0]])  # row 0 ends on an env-free EOS
    logp = torch.zeros(2, 5)
    ref = torch.full((2, 5), -0.5)
    rewards = L.kl_in_reward(torch.tensor([1.0, 2.0]), logp, ref, mask, 0.1)
    k1 = -0.1 * 0.5  # -beta (logp - ref)
    torch.testing.assert_close(rewards, torch.tensor([[k1, 0, 0, 1 + k1, 0],
                                                      [k1, k1, 2 + k1, 0, 0]]))


def test_episode_metrics_count_turns_invalid_turns_and_environment_tokens():
    """Two rows: one call answered, then the answer; a bad call, a good one, the answer."""
    problems = [("1*2=", "2"), ("1*1=", "1")]
    rows = [TOK.encode("[1*2]"), TOK.encode("[*]"), TOK.encode("[1*1]")]
    env, ids = episodes(problems), [[], []]
    for r, turn in ((0, rows[0]), (1, rows[1]), (1, rows[2])):
        ids[r] += turn
        ids[r] += end(env, r, ids[r])[0]
    ids = [ids[0] + TOK.encode("2") + [TOK.eos_id], ids[1] + TOK.encode("1") + [TOK.eos_id]]
    assert [TOK.decode(i) for i in ids] == ["[1*2]{2}2", "[*]{?}[1*1]{1}1"]
    out = {"prompt_len": 0, "response_mask": torch.tensor([[1] * 10 + [0] * 5, [1] * 15]),
           "action_mask": torch.tensor([[1] * 5 + [0] * 3 + [1, 1] + [0] * 5,
                                        [1] * 3 + [0] * 3 + [1] * 5 + [0] * 3 + [1]])}
    m = env_metrics([(env, out)], "eval")
    assert m == {"eval/turns": 1.5, "eval/invalid_frac": 1 / 3, "eval/env_token_frac": 9 / 25,
                 "eval/turns_malformed_frac": 0.0, "eval/turns_length_frac": 0.0}


def test_gold_rows_mask_exactly_the_results():
    (p, r, m), = task().gold_rows([("123*456=", "56088")])
    text = TOK.decode(r[:-1])
    assert text == "[321*6]{837}[321*5]{516}[321*4]{294}[837+0516+00294]{88065}88065"
    assert "".join(c for c, k in zip(text, m) if k) == re.sub(r"\{[^}]*\}", "", text)
    assert set(CHARS) <= set(TOK.chars)


# ---------------------------------------------------------------- bounds and gaps by hand


def test_calculator_bounds_by_hand():
    """The grammar's bounds, each side of each: 8 digits a number, a one-digit multiplier, 2 to
    4 terms; reversed numbers are turned back and forth; a PAD inside a call (decode would drop
    it: "21*3") gets the error token."""
    assert calculator("12345678*9") == "111111102" and calculator("123456789*9") == "?"
    assert calculator("12*34") == "?" and calculator("7") == "?"
    assert calculator("12345678+1") == "12345679" and calculator("123456789+1") == "?"
    assert calculator("1+12345678") == "12345679" and calculator("1+123456789") == "?"
    assert calculator("1+2+3+4") == "10" and calculator("1+2+3+4+5") == "?"
    env = episodes([("1*1=", "1")])  # the model's digit order, turned back and forth
    assert end(env, 0, TOK.encode("[21*3]"))[0] == TOK.encode("{63}")
    assert end(env, 0, TOK.encode("[21*3]{63}[9+1]"))[0] == TOK.encode("{01}")
    special = TOK.encode("[21*") + [TOK.pad_id] + TOK.encode("3]")
    assert end(episodes([("1*1=", "1")]), 0, special)[0] == TOK.encode("{?}")
    two_opens = episodes([("1*1=", "1")])  # a call is the text after the turn's last `[`
    assert end(two_opens, 0, TOK.encode("[9*9[21*3]"))[0] == TOK.encode("{63}")


def test_forced_results_count_against_max_new_tokens_by_hand():
    """A policy that always closes a call (`]` without `[`: the error result `{?}` is forced in)
    with max_new_tokens 10 writes exactly `]{?}]{?}]{`: the budget cuts the last result; the
    forced tokens are not actions and have log-prob 0, with and without the cache."""
    model = tool_model()
    bias = torch.zeros(TOK.vocab_size)
    bias[TOK.encode("]")[0]] = 50.0
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        for use_cache in (True, False):
            out = generate(model, [TOK.encode("321*654=")], 10, TOK.eos_id, TOK.pad_id, G=2,
                           generator=torch.Generator().manual_seed(0), use_cache=use_cache,
                           episodes=episodes([("456*123=", "56088")], 2))
            P = out["prompt_len"]
            assert out["ids"][:, P:].tolist() == [TOK.encode("]{?}]{?}]{")] * 2
            act = out["action_mask"][:, P:]
            assert act.tolist() == [[1, 0, 0, 0, 1, 0, 0, 0, 1, 0]] * 2
            assert out["response_mask"][:, P:].tolist() == [[1] * 10] * 2
            assert (out["logps"][act == 0] == 0).all() and out["logps"][act == 1].abs().max() < 1e-6
    finally:
        hook.remove()


def test_episode_counts_skip_the_padding_the_sampler_leaves():
    """The sampler's action mask is 0 on padding as on the environment's tokens: only the
    response's tokens count, in a rollout's metrics as in an eval's."""
    ids = torch.tensor([TOK.encode("[1*2]{2}2") + [TOK.eos_id] + [TOK.pad_id] * 5])  # (1, 15)
    mask = torch.tensor([[1] * 5 + [0] * 3 + [1, 1] + [0] * 5])
    b = rl.rows.Rollout(ids, torch.zeros(1), mask, torch.zeros(1, 15), reward=torch.ones(1),
                   score=torch.ones(1), length=torch.tensor([10.0]), finished=torch.ones(1),
                   turn_rewards=torch.zeros(1, 15), turns=torch.ones(1), invalid=torch.zeros(1))
    assert rollout_metrics(b)["rl/env_token_frac"] == pytest.approx(0.3)
    out = {"prompt_len": 0, "response_mask": (torch.arange(15) < 10).long()[None], "action_mask": mask}
    env = episodes([("1*2=", "2")])
    end(env, 0, TOK.encode("[1*2]"))
    assert env_metrics([(env, out)], "eval")["eval/env_token_frac"] == pytest.approx(0.3)


def test_pnpo_counts_only_the_policys_tokens_by_hand():
    """PNPO's t is a token's index among the policy's own: tokens a, (env, env), b, c with d =
    0.1 each have w_t = exp(0.3 / 3) at c, not exp(0.3 / 5); the gates (eps 0.2, h = sqrt(3 / t))
    let all three through: loss = -exp(0.1) A (lp_a + lp_b + lp_c) / 3, no gradient at the env's."""
    mask = torch.tensor([[1, 0, 0, 1, 1]])
    lp = torch.tensor([[-0.5, 9.0, 9.0, -1.5, -0.25]], requires_grad=True)  # env: junk
    old = torch.tensor([[-0.6, -9.0, -9.0, -1.6, -0.35]])
    loss, _ = LOSSES["pnpo"](lp, old, torch.tensor([2.0]), mask, eps_low=0.2, eps_high=0.2)
    loss.backward()
    w = torch.exp(torch.tensor(0.1)).item()
    assert loss.item() == pytest.approx(-w * 2.0 * (-0.5 - 1.5 - 0.25) / 3, abs=1e-6)
    torch.testing.assert_close(lp.grad, -w * 2.0 / 3 * mask.float())


def test_rollout_keeps_the_environments_tokens_in_each_response():
    """rl.rollout with the calculator live: the mask is the sampler's action mask, and each
    row's length counts every response token, the environment's too (they count in
    max_new_tokens), so the graded response is the whole trace."""
    problems = load_split("mul3_tool", "val")[:4]
    tsk = task(problems)
    cfg = rl.Config(loss="grpo", group_size=4, max_new_tokens=40, overlong_window=0)
    model = tool_model(seed=3)
    b = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, model, tsk), [0, 1, 2, 3],
                   torch.Generator().manual_seed(5), 4, 1.0)
    out = generate(model, [p for p, *_ in tsk.gold_rows(problems)], 40, TOK.eos_id, TOK.pad_id,
                   G=4, generator=torch.Generator().manual_seed(5), episodes=episodes(problems, 4))
    P = out["prompt_len"]
    assert torch.equal(b.mask, out["action_mask"][:, P:])
    assert b.length.tolist() == out["response_mask"][:, P:].sum(1).float().tolist()
    assert (b.length > b.mask.sum(1)).sum() >= 4  # rows with the environment's tokens


def fake_generate(rows, tok=TOK):
    """A model.generate stand-in whose rows are [(text, 1 if the environment wrote it)] segments
    (reversed digits, as the model writes them), each ended with EOS."""
    def generate(model, prompts, max_new_tokens, eos_id, pad_id, G=1, **kw):
        ids = [sum((tok.encode(t) for t, _ in r), []) + [eos_id] for r in rows]
        env = [sum(([e] * len(t) for t, e in r), []) + [0] for r in rows]
        L, P = max(map(len, ids)), len(prompts[0])
        out = torch.full((len(rows), P + L), pad_id)
        act, resp = torch.zeros(len(rows), P + L, dtype=torch.long), torch.zeros_like(out)
        for i, (r, e) in enumerate(zip(ids, env)):
            out[i, :P], out[i, P:P + len(r)] = torch.tensor(prompts[0]), torch.tensor(r)
            act[i, P:P + len(r)], resp[i, P:P + len(r)] = 1 - torch.tensor(e), 1
        return dict(ids=out, offsets=torch.zeros(len(rows), dtype=torch.long), action_mask=act,
                    response_mask=resp, logps=torch.zeros(len(rows), L), prompt_len=P,
                    turn_rewards=torch.zeros(len(rows), L))
    return generate


def test_the_reward_reads_the_text_after_the_environments_last_token(monkeypatch):
    """`}` is a token the policy may write itself: only the action mask says where the
    environment's last result ends. Gold 56088 (written 88065), the verifier of
    configs/mul3_tool.py: the answer after the policy's own `}` earns nothing."""
    from nanorl.config import load_config
    rows = [[("999}88065", 0)], [("[1*2}88065", 0)], [("[321*6]", 0), ("{837}", 1), ("77}88065", 0)],
            [("[321*6]", 0), ("{837}", 1), ("[837+0516]", 0), ("{88065}", 1), ("88065", 0)],
            [("[321*6]", 0), ("{88065}", 1)], [("88065", 0)]]
    verifier = load_config(sft.Config, ["configs/mul3_tool.py"]).verifier
    tsk = Task(TOK, "mul3_tool", True, verifier, 0, [("123*456=", "56088")], env_module=CALC)
    cfg = rl.Config(loss="grpo", group_size=len(rows), max_new_tokens=40, overlong_window=0)
    monkeypatch.setattr(rl, "generate", fake_generate(rows))
    b = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, None, tsk), [0], None, len(rows), 1.0)
    assert b.score.tolist() == [0, 0, 0, 1, 0, 1]


# ---------------------------------------------------------------- every family, end to end


@pytest.mark.parametrize("name", ["grpo", "ppo", "dpo", "rft", "gkd"])
def test_every_family_trains_on_the_tool_task(name, tool_ckpt, tmp_path, monkeypatch):
    """A step of each family with the calculator live (dpo: online pairs; gkd: a teacher),
    held-out evals with it: finite losses and the tool metrics, train and eval."""
    import json
    import nanorl.evaluate as E
    small = lambda task, split, *a: load_split(task, split, *a)[:24]  # noqa: E731 (fast evals)
    monkeypatch.setattr(E, "load_split", small)
    reward = (lambda *a, **k: 1.0) if name == "rft" else \
        (lambda text, gold, reverse=False: float(len(text or "") % 2))  # varied: never right
    monkeypatch.setattr(CALC, "exact_answer", reward)  # the calculator's score
    cfg = rl.Config(loss=name, sft_ckpt=tool_ckpt, out_dir=str(tmp_path), max_iters=2,
                    eval_interval=2, prompts_per_step=4, group_size=4, eval_samples=2,
                    max_new_tokens=80, threads=1, pairs="online" if name == "dpo" else "offline",
                    dynamic_sampling=name == "dpo",
                    teacher_ckpt=tool_ckpt if name == "gkd" else "")
    rl.main(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    train = [r for r in rows if "rl/loss" in r]
    assert train and all(math.isfinite(r["rl/loss"]) for r in train)
    assert all(0 <= r["rl/env_token_frac"] < 1 and r["rl/turns"] >= 0 for r in train)
    assert {"eval/turns", "eval/invalid_frac", "eval/env_token_frac"} <= set(rows[-1])


def test_sample_shows_the_trace_turn_by_turn_and_can_kill_the_tool(tool_ckpt, capsys):
    """Each sample: the prompt, then a line per turn, the policy's call and the environment's
    result, then the score; every result `{?}` when the calculator is broken."""
    import sample
    for broken in (False, True):
        sample.main(sample.Config(ckpt=tool_ckpt, prompt="123*456=", answer="56088", num_samples=8,
                                  temperature=1.0, env_args={"broken": broken}))
        lines = capsys.readouterr().out.splitlines()
        assert sum(line == "123*456=" for line in lines) == 8
        assert sum(line.startswith("  score ") for line in lines) == 8
        results = [m[1] for line in lines for m in re.finditer(r"\]  (\{[0-9?]*\})$", line)]
        assert len(results) > 8 and ({"{?}"} == set(results)) == broken
    with pytest.raises(rl.UserError, match="no argument 'python'"):
        sample.main(sample.Config(ckpt=tool_ckpt, prompt="1*2=", answer="2", env_args={"python": 1}))
    with pytest.raises(rl.UserError, match="need their answers"):
        sample.main(sample.Config(ckpt=tool_ckpt, prompt="1*2="))
