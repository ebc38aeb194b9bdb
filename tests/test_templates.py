"""Environments with any tokenizer (nanorl/templates.py, nanorl/episodes.py): stop strings read on
the sampled text, templates and their bridges, BPE turns kept token for token from the sampler to
the trainer. Tiny models, CPU."""
import copy
import functools
from types import SimpleNamespace

import pytest
import tiktoken
import torch

import rl
from envs import guess
from model import GPT, GPTConfig, generate, logprobs
from nanorl import bpe, templates
from nanorl.config import UserError
from nanorl.episodes import Episodes, bridge, demo_rows, play_demo
from nanorl.evaluate import Task, env_of, task_alphabet
from tests.test_tools import assert_no_leak, with_turn_credit
from tokenizer import CharTokenizer

GUESS = env_of("env:guess")
CHAR = CharTokenizer(task_alphabet("env:guess", guess.splits()["test"]))
ROLE = templates.RoleColon()


def role_games(n=300):
    """The random player's games as role_colon writes them (a BPE's training text)."""
    task = Task(bpe.learn("", 0), "env:guess", False, "exact", 0, env_module=GUESS,
                template="role_colon", train=guess.splits(n)["train"])
    task.check_data()
    return "\n".join(task.tok.decode(p + r) for p, r, _ in task.gold_rows(task.train))


@functools.lru_cache(maxsize=None)
def role_bpe():
    return bpe.learn(role_games(), 512)


def byte_bpe(*merges):
    """A BPE of the 256 bytes and the given merges (bytes, each of two tokens already there)."""
    ranks = {bytes([b]): b for b in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    return bpe.BPETokenizer(tiktoken.Encoding("t", pat_str=r"[^\n]+|\n", mergeable_ranks=ranks,
                                              special_tokens={"<|endoftext|>": len(ranks)}))


def ids_of(tok, *pieces):
    """Token ids of each piece's bytes, a token each: a split the sampler may draw."""
    return [tok.enc.encode_single_token(p) for p in pieces]


# ---------------------------------------------------------------- (b) stop strings


def test_a_stop_across_four_tokens_ends_the_turn_at_its_last():
    tok = role_bpe()
    turn = ids_of(tok, b" ", b"5", b"0", b"\n", b"\n", b"Use", b"r", b":")  # "Use" "r": not BPE's "User"
    reads = [templates.read_turn(tok, turn[:k], (ROLE.stop,)) for k in range(1, 9)]
    assert reads == [None] * 7 + [(" 50", "stop")]
    assert tok.encode("\n\nUser:") != turn[3:]  # the sampled split is not the canonical one


def test_a_stop_that_ends_inside_a_longer_token_keeps_the_whole_token():
    tok = byte_bpe(b"|<", b"50")
    assert templates.read_turn(tok, ids_of(tok, b"50", b"|<"), ("|",)) == ("50", "stop")
    assert templates.stop_ids(tok, ("|",)) is None  # "|<" holds "|": the text is read
    assert templates.stop_ids(CHAR, ("|",)) == tuple(CHAR.encode("|"))  # one char: by id


class Reader:
    """An environment whose turns end on the two-character stop "##": it keeps what it reads."""
    stops, max_turns, max_obs, invalid = ("##",), 3, 4, 0

    def __init__(self, answer):
        self.read = []

    def step(self, turn):
        self.read.append(turn)
        return "ok", 1.0, False

    def score(self, final):
        return 0.0


@pytest.mark.parametrize("split", [(b"7", b"##"), (b"7", b"#", b"#"), (b"7", b"#", b"#>")])
def test_every_tokenization_of_a_one_token_stop_ends_the_turn_alike(split):
    """A learned BPE makes "##" one token, but the policy may write it as "#" "#", or end it inside
    "#>": each ends the turn at its last token, the environment reads "7" and its bridge follows.
    Matched by id alone, only the first would end."""
    tok = bpe.learn("1##\n" * 40 + "2#>\n" * 30, 300)
    assert len(tok.encode("##")) == 1 and len(tok.encode("#>")) == 1
    games = Episodes(SimpleNamespace(Env=Reader, __name__="reader"), [("go:", "x")], 1, tok, False, {})
    toks, act = [], torch.tensor([True])
    for k, token in enumerate(ids_of(tok, *split)):
        toks.append(torch.tensor([token]))
        games.end_turns(toks, act)
        assert games.envs[0].read == ([] if k < len(split) - 1 else ["7"])
    assert games.queue == {0: tok.encode("ok")} and games.rewards == {(0, len(split) - 1): 1.0}
    assert templates.stop_ids(tok, ("##",)) is None  # "#" and "#>" begin with the stop's rest
    assert templates.stop_ids(byte_bpe(b"##"), ("##",)) is None  # "#" alone begins its rest
    assert templates.stop_ids(byte_bpe(b"|<"), ("<",)) is None  # "|<" holds it
    assert templates.stop_ids(CHAR, ("|",)) == tuple(CHAR.encode("|"))  # one char: by id


def test_a_stop_that_splits_a_utf8_character_waits_for_its_last_byte():
    """"é" is 2 bytes: with the first alone the text holds nothing past "a" (the byte is held
    back, never read as U+FFFD), and the second completes the stop."""
    tok = byte_bpe()
    e1, e2 = "é".encode()
    assert tok.text_so_far([ord("a"), e1]) == "a"
    assert templates.read_turn(tok, [ord("a"), e1], ("é", "\ufffd")) is None
    assert templates.read_turn(tok, [ord("a"), e1, e2], ("é",)) == ("a", "stop")


def test_two_stops_or_a_stop_then_eos_are_malformed_and_eos_alone_ends_the_answer():
    tok = byte_bpe(b"||", b"|<")
    stops = ("|",)
    assert templates.read_turn(tok, ids_of(tok, b"5", b"||"), stops) == (None, "malformed")
    games = Episodes(GUESS, [(guess.PROMPT, "37")], 1, tok, False, {})
    assert games.ended(0, ids_of(tok, b"5", b"||")) == (None, "malformed")  # the Env reads None
    assert games.step(0, ids_of(tok, b"5", b"||"), None, "malformed")[0] == tok.encode("?")
    assert games.visits[0].how == "malformed" and games.envs[0].invalid == 1
    assert templates.read_turn(tok, ids_of(tok, b"5", b"|") + [tok.eos_id], stops) == (None, "malformed")
    assert templates.read_turn(tok, ids_of(tok, b"5") + [tok.eos_id], stops) == ("5", "eos")
    assert templates.read_turn(tok, ids_of(tok, b"5", b"|<"), stops) == ("5", "stop")
    assert templates.find_stop("ab\n\nUser:", ("User:", "\n\n")) == (2, 4)  # the first completed


# ---------------------------------------------------------------- (e) templates

TALK = [("user", "1-100:"), ("assistant", "50"), ("user", "<"), ("assistant", "25"), ("user", ">"),
        ("assistant", "37"), ("user", "=")]


def rendered(template, stops):
    """The 3-turn game of TALK as the template writes it: prompt, then each turn and bridge."""
    text, last = template.prompt(TALK[0][1]), len(TALK) - 1
    for k in range(1, last, 2):
        text += template.demo_turn(TALK[k][1], stops[0])
        text += template.observation(TALK[k + 1][1], k + 1 == last)
    return text


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
REWRITES = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not "
            "loop.last %}...{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def hf_tokenizer(tmp_path, chat_template):
    """A Hugging Face tokenizer folder with this chat template, made offline."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    hf.chat_template = chat_template
    hf.save_pretrained(tmp_path)
    return f"chat:{tmp_path}"


def test_each_templates_three_turn_rendering_is_golden(tmp_path):
    assert rendered(templates.of("plain"), ("|",)) == "1-100:50|<25|>37|="
    assert rendered(ROLE, ("|",)) == ("User: 1-100:\n\nAssistant: 50\n\nUser: <\n\nAssistant: 25\n\nUser: >"
                                      "\n\nAssistant: 37\n\nUser: =")
    chat = templates.of(hf_tokenizer(tmp_path, CHATML))
    assert chat.stop == "<|im_end|>" and chat.stops(("|",)) == ("<|im_end|>",)
    assert rendered(chat, ("|",)) == (
        "<|im_start|>user\n1-100:<|im_end|>\n<|im_start|>assistant\n50<|im_end|>\n<|im_start|>user\n<<|im_end|>\n"
        "<|im_start|>assistant\n25<|im_end|>\n<|im_start|>user\n><|im_end|>\n<|im_start|>assistant\n37<|im_end|>\n"
        "<|im_start|>user\n=<|im_end|>\n")
    assert ROLE.turn(" 50") == "50" and chat.turn("50") == "50"


def test_a_chat_template_that_rewrites_history_is_refused_in_one_line(tmp_path):
    """A template that drops an earlier assistant message's content (as reasoning templates drop
    its thinking) would change ids the policy sampled: refused when it loads."""
    with pytest.raises(UserError, match=r"^template 'chat:.*' is not prefix-preserving: its rendering of 3 "
                                        r"messages does not begin with that of 2$"):
        templates.of(hf_tokenizer(tmp_path, REWRITES))
    with pytest.raises(UserError, match="^unknown template 'roles'; valid: plain, role_colon, chat:PATH$"):
        templates.of("roles")
    with pytest.raises(UserError, match="^template 'chat:/nowhere': cannot load a tokenizer"):
        templates.of("chat:/nowhere")


def chatml(assistant="{{ m['content'] }}<|im_end|>", window=""):
    """ChatML with its assistant message written as given, over messages{window}."""
    return (f"{{% for m in messages{window} %}}<|im_start|>{{{{ m['role'] }}}}\n{{% if m['role'] == "
            f"'assistant' %}}{assistant}{{% else %}}{{{{ m['content'] }}}}<|im_end|>{{% endif %}}\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


R1 = chatml("{% set c = m['content'] %}{% if '</think>' in c and not loop.last %}"
            "{% set c = c.split('</think>')[-1] %}{% endif %}{{ c }}<|im_end|>")


@pytest.mark.parametrize("chat_template,k", [
    (R1, 5),  # drops the think block of the 4th message, an earlier answer, once a 5th comes
    (chatml(window="[-6:]"), 7),  # keeps the last 6 messages
    (chatml("{{ m['content'] }}\n<|im_end|>"), 2),  # its stop is not what follows the answer
])
def test_templates_that_rewrite_earlier_turns_or_pad_the_stop_are_refused(tmp_path, chat_template, k):
    """A reasoning template's think stripping and a window both rewrite turns the policy already
    sampled; a newline before the end-of-turn marker is text the policy never wrote."""
    with pytest.raises(UserError, match=rf"^template 'chat:.*' is not prefix-preserving: its "
                                        rf"rendering of {k} messages does not begin with that of {k - 1}$"):
        templates.of(hf_tokenizer(tmp_path, chat_template))
    assert templates.of(hf_tokenizer(tmp_path / "plain", chatml())).stop == "<|im_end|>"


# ---------------------------------------------------------------- sampling with a BPE model


def tiny(tok, seed=0, values=False):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=96, vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=32,
                         scalar_head=values)).eval()


# a policy that writes guesses and ends its turns: each token's logits pushed by the token it reads
SCRIPT = {b":": {b" ": 10}, b" ": {b"5": 6, b"1": 6, b"7": 6}, b"5": {b"0": 8, b"\n": 6},
          b"0": {b"\n": 8}, b"1": {b"\n": 8}, b"7": {b"\n": 8},
          b"\n": {b"\n": 8, b"User": 7, b"Use": 7}, b"Use": {b"r": 10}, b"r": {b":": 10},
          b"User": {b":": 10}}


def scripted(model, tok):
    """model's logits at each position plus SCRIPT's row of the token read there (any other: a
    newline), the same in prefill, cached decode and the trainer's forward -> the hooks."""
    one = tok.enc.encode_single_token
    table = torch.zeros(tok.vocab_size, tok.vocab_size)
    table[:, one(b"\n")] = 4.0
    for read, nxt in SCRIPT.items():
        table[one(read)] = 0.0
        for token, push in nxt.items():
            table[one(read), one(token)] = push
    seen = {}
    def read(mod, args, kw):  # the ids whose logits the head computes: those kept
        seen.update(idx=args[0] if kw.get("keep") is None else args[0][kw["keep"]])
    pre = model.register_forward_pre_hook(read, with_kwargs=True)
    post = model.lm_head.register_forward_hook(lambda mod, inp, out: out + table[seen["idx"]])
    return pre, post


def bpe_rollout(secrets=(3, 50, 97), G=6, seed=1, use_cache=True, template=ROLE):
    tok = role_bpe()
    model = tiny(tok)
    hooks = scripted(model, tok)
    prompts = [tok.encode(template.prompt(guess.PROMPT))] * len(secrets)
    try:
        games = Episodes(GUESS, [(guess.PROMPT, str(s)) for s in secrets], G, tok, False, {}, template)
        out = generate(model, prompts, 80, tok.eos_id, tok.pad_id, G=G, use_cache=use_cache,
                       generator=torch.Generator().manual_seed(seed), episodes=games)
        lp = logprobs(model, out["ids"], out["offsets"], out["action_mask"][:, out["prompt_len"]:])[0]
    finally:
        [h.remove() for h in hooks]
    return tok, model, out, games, lp


def bridges(tok, games, r):
    """Row r's bridges replayed: each visit's environment answer as bridge() writes it."""
    env, out = GUESS.Env(games.envs[r].secret), []
    for v in [v for v in games.visits if v.row == r]:
        obs, _, done = env.step(v.action)
        out.append(bridge(tok, ROLE, env, obs, done or env.turns >= env.max_turns, False))
    return out


def test_bpe_turns_reach_the_trainer_as_sampled_and_the_context_is_their_concatenation():
    """(a) Non-canonical splits ("Use" "r", not BPE's "User") stay as drawn: each row's response is
    its turns' ids, each followed by its bridge (role_colon's text of the answer, encoded alone),
    so each turn's ids are a prefix of the next turn's context; what follows the last bridge is an
    unfinished turn. The trainer reads these ids (test (c) scores them)."""
    tok, _, out, games, _ = bpe_rollout()
    P, noncanonical = out["prompt_len"], 0
    for r, m in enumerate(out["response_mask"][:, P:]):
        resp, at = out["ids"][r, P:P + int(m.sum())].tolist(), 0
        for v, ids in zip([v for v in games.visits if v.row == r], bridges(tok, games, r)):
            assert v.start == at and resp[v.end + 1:v.end + 1 + len(ids)] == ids[:len(resp) - v.end - 1]
            turn = resp[v.start:v.end + 1]
            noncanonical += tok.encode(tok.decode(turn)) != turn
            assert tok.decode(ids) in {f" {o}{h}" for o in "<>=?" for h in ("\n\nAssistant:", "")}
            at = v.end + 1 + len(ids)
        if at < len(resp):  # the budget may cut a bridge (80 tokens), else an unfinished turn follows
            assert templates.read_turn(tok, resp[at:], (ROLE.stop,)) in (None, (tok.decode(resp[at:-1]), "eos"))
    assert noncanonical > 0 and max(games.turns) >= 3


def test_the_action_mask_counts_the_sampled_tokens_and_rewards_sit_on_each_turns_last():
    """(d) Sum of the action mask = the tokens the policy drew (the response less its bridges);
    each turn's reward sits on its last token, an action."""
    tok, _, out, games, _ = bpe_rollout()
    P = out["prompt_len"]
    act, resp = out["action_mask"][:, P:], out["response_mask"][:, P:]
    for r in range(len(act)):
        n = int(resp[r].sum())  # the budget (80) may cut the last bridge
        forced = sum(min(len(ids), n - v.end - 1) for v, ids in
                     zip([v for v in games.visits if v.row == r], bridges(tok, games, r)))
        assert act[r].sum() == resp[r].sum() - forced
        for v in [v for v in games.visits if v.row == r]:
            assert act[r, v.end] == 1 and (v.end + 1 == act.size(1) or act[r, v.end + 1] == 0)
            assert out["turn_rewards"][r, v.end] == 0 or v.how == "stop"
    assert ((out["turn_rewards"] != 0) <= act.bool()).all()


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_sampler_logps_equal_the_trainers_over_three_turns(kind):
    """(c) Every action position, over rows of 3 turns and more: the trainer's log-prob is the
    sampler's within 1e-5 (fp32's floor, bench/logp_floor.py: the KV-cache decode and the full
    forward are different kernels; a CPU without AVX-512 lands past 1e-6),
    exactly 0 off the actions; cached and uncached sampling make the same rows."""
    if kind == "bpe":
        _, _, out, games, lp = bpe_rollout()
        plain = bpe_rollout(use_cache=False)[2]
    else:
        from tests.test_envs import TOK, sample, tiny_model
        model, bias = tiny_model(), torch.zeros(TOK.vocab_size)
        bias[TOK.encode("0123456789|")] = 5.0  # guesses and turn ends, logits of a trained size
        hook = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
        try:
            (out, games), (plain, _) = sample(model, [3, 50, 97]), sample(model, [3, 50, 97], use_cache=False)
            lp = logprobs(model, out["ids"], out["offsets"], out["action_mask"][:, out["prompt_len"]:])[0]
        finally:
            hook.remove()
    for k in ("ids", "action_mask", "response_mask"):
        assert torch.equal(out[k], plain[k]), k
    act = out["action_mask"][:, out["prompt_len"]:].bool()
    assert max(games.turns) >= 3 and act.sum() > 50
    assert (out["logps"][~act] == 0).all() and (lp[~act] == 0).all()
    assert (lp - out["logps"]).abs().max() <= 1e-5


@functools.lru_cache(maxsize=1)
def bpe_game_batch():
    tok, _, out, games, _ = bpe_rollout(G=4)
    P, N = out["prompt_len"], len(out["ids"])
    act, n = out["action_mask"][:, P:], out["response_mask"][:, P:].sum(1)
    reward = torch.tensor([1.0, 0.0] * (N // 2))
    turns, invalid = games.stats()
    return rl.rows.Rollout(out["ids"], out["offsets"], act, out["logps"], out["logps"], reward, reward,
                           torch.full((N,), -1), n.float(), torch.ones(N, dtype=torch.bool),
                           turn_rewards=out["turn_rewards"], turns=turns, invalid=invalid), tok


def bpe_leak(name, monkeypatch, every_token=False):
    b, tok = bpe_game_batch()
    b = copy.deepcopy(b)
    if every_token:  # the response mask for the action mask: the leak the check must see
        b.mask = (torch.arange(b.mask.size(1)) < b.length[:, None]).long()
    with_turn_credit(b, name)
    task = Task(tok, "env:guess", False, "exact", 0, env_module=GUESS, template="role_colon",
                train=guess.splits()["test"][:8])
    task.check_data()  # the prompts as role_colon writes them
    assert_no_leak(name, b, monkeypatch, model_fn=lambda seed, values=False: tiny(tok, seed, values),
                   gold=task.gold_rows(task.train))


@pytest.mark.parametrize("name", ["grpo", "ppo", "dapo", "reinforce_pp", "dpo", "vineppo"])
def test_bpe_observation_logits_never_reach_a_loss_or_its_gradient(name, monkeypatch):
    """(c) Logits moved at every bridge token (role_colon's headers and the answers): each row's
    loss and gradients are unchanged."""
    bpe_leak(name, monkeypatch)


def test_the_bpe_leak_test_fails_when_the_action_mask_is_ignored(monkeypatch):
    with pytest.raises(AssertionError):
        bpe_leak("grpo", monkeypatch, every_token=True)


# ---------------------------------------------------------------- (d) bookkeeping


class Capped:
    """An environment whose turns end on "|" or after 3 tokens (max_turn_tokens): a turn cut
    there reaches it as None, reported as length."""
    stops, max_turns, max_obs, max_turn_tokens = ("|",), 3, 2, 3

    def __init__(self, answer):
        self.invalid, self.seen = 0, []

    def step(self, turn):
        self.seen.append(turn)
        self.invalid += turn is None
        return "<", 0.25, False

    def score(self, final):
        return 0.0


def test_a_turn_cut_by_the_cap_is_reported_as_length():
    """(d) A turn that reaches max_turn_tokens without its stop ends there: the environment reads
    None, the Visit says length, the turn's reward sits on its last token."""
    from types import SimpleNamespace
    capped = SimpleNamespace(Env=Capped)
    model = GPT(GPTConfig(block_size=32, vocab_size=CHAR.vocab_size, n_layer=1, n_head=1, n_embd=8)).eval()
    bias = torch.zeros(CHAR.vocab_size)
    bias[CHAR.encode("5")] = 50.0  # never a stop: every turn runs to the cap
    hook = model.lm_head.register_forward_hook(lambda mod, inp, o: o + bias)
    try:
        games = Episodes(capped, [("1-100:", "1")], 1, CHAR, False, {})
        out = generate(model, [CHAR.encode("1-100:")], 20, CHAR.eos_id, CHAR.pad_id, episodes=games)
    finally:
        hook.remove()
    assert [v.how for v in games.visits] == ["length"] * 3 and games.envs[0].seen == [None] * 3
    from nanorl.evaluate import env_metrics
    assert env_metrics([(games, out)], "eval")["eval/turns_length_frac"] == 1.0
    assert [v.end - v.start + 1 for v in games.visits] == [3, 3, 3]
    rewards = out["turn_rewards"][0]
    assert rewards.nonzero()[:, 0].tolist() == [v.end for v in games.visits] and rewards.sum() == 0.75
    P = out["prompt_len"]
    assert CHAR.decode(out["ids"][0, P:].tolist()) == "555<555<555<"


# ---------------------------------------------------------------- SFT through the same bridge


def forced_sample(tok, template, prompt_ids, demo, secret):
    """generate with a model whose every step draws the demonstration's next token -> its row."""
    model = tiny(tok)
    step = iter(range(len(demo) + 1))

    def teacher(mod, inp, out):
        t = next(step)
        forced = torch.full_like(out, -1e9)
        forced[..., demo[min(t, len(demo) - 1)]] = 0.0
        return forced
    hook = model.lm_head.register_forward_hook(teacher)
    try:
        games = Episodes(GUESS, [(guess.PROMPT, secret)], 1, tok, False, {}, template)
        out = generate(model, [prompt_ids], len(demo), tok.eos_id, tok.pad_id, episodes=games)
    finally:
        hook.remove()
    P = out["prompt_len"]
    n = int(out["response_mask"][0, P:].sum())
    return out["ids"][0, P:P + n].tolist(), out["action_mask"][0, P:P + n].tolist()


@pytest.mark.parametrize("template", ["plain", "role_colon"])
def test_a_demonstration_is_the_row_the_sampler_makes_when_its_turns_are_forced(template):
    """SFT's demonstrations and the sampler share the bridge: forcing a demonstration's own
    tokens through model.generate gives its ids and its action mask, BPE and char alike."""
    tmpl = templates.of(template)
    for tok in (role_bpe(),) if template == "role_colon" else (CHAR, byte_bpe(b"|<", b"|>")):
        problems = [(tmpl.prompt(guess.PROMPT), str(s)) for s in (37, 1, 100, 64)]
        for (p, secret), (prompt, ids, mask) in zip(problems, demo_rows(GUESS, problems, tok, False,
                                                                          template=tmpl)):
            assert forced_sample(tok, tmpl, prompt, ids, secret) == (ids, mask)


def test_a_demonstration_the_sampler_would_read_otherwise_is_refused():
    with pytest.raises(Exception, match=r"the demonstration's turn '5\|0', written '5\|0\|', is not read back"):
        play_demo(GUESS, (guess.PROMPT, "37"), ["5|0"], None, CHAR, False)


def test_bpe_learns_the_most_frequent_pair_first_by_hand():
    """"aaab aab": pieces "aaab" and " aab"; pairs aa 3, ab 2, " a" 1 -> "aa" first; then
    (aa, a) (aa, b) (" ", aa) once each, the smallest pair wins the tie: " aa". 259 tokens: the
    256 bytes, 2 merges and EOS."""
    tok = bpe.learn("aaab aab", 259)
    merges = {t: r for t, r in tok.enc._mergeable_ranks.items() if r >= 256}
    assert merges == {b"aa": 256, b" aa": 257} and tok.eos_id == 258 and tok.vocab_size == 259
    assert [tok.enc.decode_single_token_bytes(i) for i in tok.encode("aaab aab")] == [b"aa", b"a", b"b", b" aa", b"b"]


def test_bpe_tokenizers_round_trip_and_learn_deterministically():
    tok = role_bpe()
    again = bpe.learn(role_games(), 512)
    assert again.to_dict() == tok.to_dict() and bpe.from_dict(tok.to_dict()).encode("User: 1-100:") == \
        tok.encode("User: 1-100:")
    assert tok.vocab_size < 512 and {b"User", b"Assistant", b" <"} <= set(tok.enc._mergeable_ranks)
    assert tok.encode(" 50") == [tok.enc.encode_single_token(b) for b in (b" ", b"5", b"0")]  # digits apart


# ---------------------------------------------------------------- the Env built from the task row


class Echo:
    """An environment that keeps what it was built with: the prompt and a row's setting."""
    stops, max_turns, max_obs = ("|",), 2, 8

    def __init__(self, answer, prompt, level=0):
        self.answer, self.prompt, self.level, self.invalid = answer, prompt, level, 0

    def step(self, turn):
        return str(self.level), 0.0, False

    def score(self, final):
        return 0.0


def write_task(folder, rows):
    import json
    folder.mkdir(exist_ok=True)
    for split in ("train", "val", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_a_jsonl_row_carries_its_environments_settings(tmp_path, monkeypatch):
    """env:NAME:FOLDER: each row's other JSONL fields are its Env's arguments (over --env_args),
    the prompt as written (before the template) too if the Env takes it; a field the Env does not
    take is one line naming it."""
    import sys
    from types import ModuleType
    from nanorl.evaluate import task_splits
    module = ModuleType("envs.echo")
    module.Env, module.CHARS = Echo, "|"
    monkeypatch.setitem(sys.modules, "envs.echo", module)
    folder = write_task(tmp_path / "echo", [{"prompt": "2+2=", "answer": "4", "level": 3},
                                            {"prompt": "1+1=", "answer": "2"}])
    name = f"env:echo:{folder}"
    assert env_of(name) is module
    splits = task_splits(name)[0]
    task = Task(byte_bpe(), name, False, "exact", 0, *splits.values(), env_module=module, template="role_colon",
                env_args={"level": 1})
    task.check_data()
    assert task.train[0] == ("User: 2+2=\n\nAssistant:", "4") and task.train[0].fields == {"level": 3}
    envs = task.episodes(task.train, 2).envs
    assert [(e.prompt, e.answer, e.level) for e in envs] == [("2+2=", "4", 3)] * 2 + [("1+1=", "2", 1)] * 2
    write_task(tmp_path / "echo", [{"prompt": "2+2=", "answer": "4", "depth": 3}])
    task = Task(CHAR, name, False, "exact", 0, *task_splits(name)[0].values(), env_module=module)
    with pytest.raises(UserError, match=r"^task 'env:echo:.*'s rows: envs.echo's environment has no argument "
                                        r"'depth'; it takes level$"):
        task.check_data()


# ---------------------------------------------------------------- end to end


def metrics(path):
    import json
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize("task, template, shape", [
    ("env:guess", "role_colon", dict(block_size=112, max_new_tokens=96)),
    ("mul3_tool", "plain", dict(block_size=96, max_new_tokens=80))])
def test_sft_and_rl_play_with_a_learned_bpe(task, template, shape, tmp_path):
    """Guess the number as a dialogue and the calculator, each with --tokenizer=bpe:400: SFT
    learns the BPE and keeps it in its checkpoint; RL plays turns that end on text stops, the
    trainer's log-probs the sampler's (rl/logp_mismatch <= 1e-5 at every step)."""
    import sft
    sft.main(sft.Config(task=task, tokenizer="bpe:400", template=template, out_dir=str(tmp_path / "sft"),
                        n_layer=1, n_head=2, n_embd=32, batch_size=32, lr=3e-3, warmup_iters=5,
                        max_iters=120, eval_interval=120, eval_samples=0, threads=1, bf16=False, **shape))
    ckpt = torch.load(tmp_path / "sft" / "ckpt.pt", weights_only=True)
    assert ckpt["tokenizer"]["kind"] == "bpe" and ckpt["config"]["template"] == template
    rl.main(rl.Config(sft_ckpt=str(tmp_path / "sft" / "ckpt.pt"), out_dir=str(tmp_path / "rl"), loss="grpo",
                      max_iters=3, prompts_per_step=4, group_size=4, eval_samples=0, eval_interval=100,
                      dynamic_sampling=False, threads=1))
    train = [r for r in metrics(tmp_path / "rl" / "metrics.jsonl") if "rl/logp_mismatch" in r]
    assert len(train) == 3 and all(r["rl/logp_mismatch"] <= 1e-5 and r["rl/turns"] >= 1 for r in train)


def test_an_unknown_template_or_a_template_without_an_environment_is_refused():
    import sft
    with pytest.raises(UserError, match="^--template writes an environment's episodes; task 'mul' has none$"):
        sft.load_task(sft.Config(task="mul", template="role_colon"))
    with pytest.raises(UserError, match="^unknown template 'roles'"):
        sft.load_task(sft.Config(task="env:guess", reverse=False, template="roles"))
    with pytest.raises(UserError, match=r"^tokenizer 'bpe:12': write bpe:N with N >= 257"):
        sft.load_task(sft.Config(task="env:guess", reverse=False, tokenizer="bpe:12"))


def test_gpt2s_own_bpe_ends_a_role_colon_turn_where_its_file_is_cached():
    """GPT-2's encoding (skipped where tiktoken has no cached copy: no network here): "\\n\\nUser:"
    spans its tokens, and the turn is read the same with its canonical ids and a split of them."""
    from tokenizer import TokenizerError
    try:
        tok = bpe.load("gpt2")
    except TokenizerError:
        pytest.skip("GPT-2's BPE file is not cached")
    ids = tok.encode(" 50\n\nUser:")
    assert len(tok.encode("\n\nUser:")) > 1 and templates.stop_ids(tok, (ROLE.stop,)) is None
    assert [templates.read_turn(tok, ids[:k], (ROLE.stop,)) for k in range(1, len(ids) + 1)][-1] == (" 50", "stop")
    split = tok.encode(" 5") + tok.encode("0") + tok.encode("\n\nUser:")
    assert split != ids and templates.read_turn(tok, split, (ROLE.stop,)) == (" 50", "stop")
