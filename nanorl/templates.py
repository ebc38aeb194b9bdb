"""
Templates: how an environment's episode is written as text, for any tokenizer. A template renders
the prompt, names the stop strings that end the policy's turns, reads a turn's text for the
environment and writes the environment's answer, the bridge (encoded alone and forced into the
rows: action 0, log-prob 0). The policy's sampled ids are never decoded and re-encoded for
training: their text is only read, to find the stops (nanorl/episodes.py).

    plain       1-100:50|<25|>37|=        the environment's own stops
    role_colon  User: 1-100:\\n\\nAssistant: 50\\n\\nUser: <\\n\\nAssistant: ...  ("\\n\\nUser:")
    chat:PATH   a Hugging Face tokenizer's chat template (PATH: its local folder), refused at
                start-up unless each turn leaves the text before it as it was (prefix-preserving)

A turn ends after the token that completes its first stop; that whole token is kept (its text may
go on past the stop) and the environment reads the text before the stop.
"""
import functools

from nanorl.config import UserError


class Plain:
    """The environment's own format: the prompt as written, its stops, its answers as they come."""
    name = "plain"

    def prompt(self, text):
        return text

    def stops(self, env_stops):
        return tuple(env_stops)

    def turn(self, text):  # a turn's text before its stop -> what the environment reads
        return text

    def demo_turn(self, text, stop):  # a demonstration's turn as the policy writes it
        return text + stop

    def observation(self, text, done):  # the environment's answer as the policy reads it
        return text

    def final(self, text):  # a demonstration's final answer (EOS follows)
        return text


class RoleColon(Plain):
    """A base model's dialogue: "User: ...\\n\\nAssistant: ..."; the policy ends its turn by
    writing the next speaker's name, which stays in the context."""
    name, stop = "role_colon", "\n\nUser:"

    def prompt(self, text):
        return f"User: {text}\n\nAssistant:"

    def stops(self, env_stops):
        return (self.stop,)

    def turn(self, text):
        return text.strip()

    def demo_turn(self, text, stop):
        return f" {text}{self.stop}"

    def observation(self, text, done):
        return f" {text}" + ("" if done else "\n\nAssistant:")

    def final(self, text):
        return f" {text}"


class Chat(Plain):
    """A chat template (a Hugging Face tokenizer's apply_chat_template): the prompt is the user's
    first message, each observation the next; the stop is what the template writes after an
    assistant message (its end-of-turn marker)."""
    MARK = "\x00assistant\x00"  # a message no template writes itself

    def __init__(self, hf_tokenizer, name="chat"):
        self.hf, self.name = hf_tokenizer, name
        after = self.render([("user", "u"), ("assistant", self.MARK)]).split(self.MARK, 1)[1]
        self.stop = after.strip()
        if not self.stop:
            raise UserError(f"template {name!r} writes nothing after an assistant message: no "
                            "stop ends a turn")
        check_prefixes(self, name)

    def render(self, messages, generation_prompt=False):
        return self.hf.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                           tokenize=False, add_generation_prompt=generation_prompt)

    def prompt(self, text):
        return self.render([("user", text)], True)

    def stops(self, env_stops):
        return (self.stop,)

    def demo_turn(self, text, stop):
        return text + self.stop

    def observation(self, text, done):
        full = self.render([("user", "u"), ("assistant", self.MARK), ("user", text)], not done)
        return full.split(self.MARK + self.stop, 1)[1]


def check_prefixes(template, name):
    """One line unless every rendering of a dialogue begins with the one before it and each
    assistant message is followed by the stop: a template that rewrites earlier turns would change
    ids the policy already sampled. The dialogue holds what templates rewrite: reasoning in a think
    block (R1-style templates drop it from earlier turns) and more turns than a window keeps
    (messages[-6:])."""
    talk = [("user", "1-100:")]
    for k in range(12):  # every other answer thinks first
        answer = f"<think>{k} steps</think>{50 - k}" if k % 2 else str(50 - k)
        talk += [("assistant", answer), ("user", "<>"[k % 2])]
    before = ""
    for k in range(1, len(talk) + 1):
        text = template.render(talk[:k], talk[k - 1][0] == "user")
        turn = talk[k - 1][1] + template.stop if talk[k - 1][0] == "assistant" else ""
        if not text.startswith(before + turn):
            raise UserError(f"template {name!r} is not prefix-preserving: its rendering of "
                            f"{k} messages does not begin with that of {k - 1}")
        before = text


@functools.cache  # a chat template loads its tokenizer once
def of(name):
    """--template's value -> its template: plain, role_colon or chat:PATH (a tokenizer folder)."""
    if name == "plain":
        return Plain()
    if name == "role_colon":
        return RoleColon()
    if name.startswith("chat:"):
        from transformers import AutoTokenizer
        try:
            hf = AutoTokenizer.from_pretrained(name[5:], local_files_only=True)
        except (OSError, ValueError) as e:
            raise UserError(f"template {name!r}: cannot load a tokenizer from {name[5:]!r} "
                            f"({e.__class__.__name__})") from None
        if not hf.chat_template:
            raise UserError(f"template {name!r}: the tokenizer in {name[5:]!r} has no chat "
                            "template")
        return Chat(hf, name)
    raise UserError(f"unknown template {name!r}; valid: plain, role_colon, chat:PATH")


def find_stop(text, stops):
    """The stop a turn's text completes first -> (where it starts, where it ends), or None."""
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return min(hits)[::-1] if hits else None


def read_turn(tok, ids, stops):
    """A turn's ids (the policy's, its first to its last) -> None while it goes on, else (the text
    before its stop, how it ended): "stop", "eos" (the policy ended its answer: no stop), or
    "malformed" (text None: a special token inside, a second stop in the token that completed the
    first, or a stop then EOS)."""
    eos = ids[-1:] == [tok.eos_id]
    body = ids[:-1] if eos else ids
    if tok.special_ids.intersection(body):
        return None, "malformed"
    text = tok.text_so_far(body)
    hit = find_stop(text, stops)
    if hit is None:
        return (text, "eos") if eos else None
    if eos or find_stop(text[hit[1]:], stops):
        return None, "malformed"
    return text[:hit[0]], "stop"


@functools.cache
def stop_ids(tok, stops):
    """The stops' ids when a stop's text can only be written as its own one token (the fast path: a
    turn ends on an id, the char tokenizer's always), else None (read the text). Each stop must be
    one token, ASCII (no byte of it inside another character), held by no other token's text, and
    begun by none: a token that starts with the rest of a stop ("#" after "#" writes "##") would
    complete it across tokens, which an id never sees."""
    ids = [tok.encode(s) for s in stops]
    if any(len(i) != 1 for i in ids) or not all(s.isascii() for s in stops):
        return None
    texts = [tok.text_so_far([i]) for i in range(tok.vocab_size) if i not in tok.special_ids]
    others = [t for t in texts if t not in stops]  # a stop's own token ends the turn by id
    for s in stops:
        tails = tuple(s[j:] for j in range(1, len(s)))  # what a token after s[:j] would need
        if any(s in t for t in others) or tails and any(t.startswith(tails) for t in others):
            return None
    return tuple(i for i, in ids)
