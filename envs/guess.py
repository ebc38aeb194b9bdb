"""
Guess the number (TextArena's GuessTheNumber): a secret in 1..100, hidden in the problem's answer.
The policy writes a guess and ends its turn with `|`; the environment answers `<` (the secret is
lower), `>` (higher), `=` (found: the episode ends) or `?` (not a number in 1..100: a turn spent).
The episode also ends after 7 turns. Binary search always wins, in 5.80 turns on average.

    python sft.py configs/guess.py                        # imitate the random consistent player
    python rl.py configs/rl_guess.py                      # GRPO, reward 1 on a win
    python rl.py configs/rl_guess.py --loss=reinforce_pp --env_args='{"process_reward": true}'

    1-100:50|<25|>37|=      secret 37, won in 3 turns

The demonstrations are the random consistent player's: each guess uniform over the numbers
still possible. It wins within 7 turns about half the time. process_reward pays each turn the
share of the possible numbers it ruled out, log2(before / after) / log2(100): a won episode's
turns sum to 1, and the win adds 1.

The game has an exact optimum, so every state has an oracle: [lo, hi] with t turns left is
winnable iff hi - lo + 1 <= 2^t - 1, and winning_moves() counts the guesses that keep it so
(where the numbers left fit one turn fewer, a guess outside them too).
oracle_reward (a control: it tells the policy the answer) pays +1 for a turn that keeps the game
winnable and -1 for the turn that loses it, 0 once lost.

    python rl.py configs/rl_guess_pp.py --env_args='{"oracle_reward": true}'
"""
import math

CHARS = "|<>?:"
PROMPT, LO, HI, TURNS = "1-100:", 1, 100, 7


class Env:
    """One game: the secret, the numbers still possible [lo, hi], the turns and the outcome."""
    stops, max_turns, max_obs = ("|",), TURNS, 1

    def __init__(self, answer, process_reward=False, oracle_reward=False):
        self.secret, self.process_reward = int(answer), process_reward
        self.oracle_reward = oracle_reward
        self.lo, self.hi, self.turns, self.won = LO, HI, 0, False
        self.invalid, self.inconsistent, self.guesses = 0, 0, []

    def step(self, turn):
        if self.won or self.turns >= TURNS:  # a guess after the end: nothing changes
            return "", 0.0, True
        could_win = self.winning_moves() > 0
        self.turns += 1
        ok = turn is not None and len(turn) <= len(str(HI)) and turn.isascii() and turn.isdigit() \
            and turn == str(int(turn))  # int() refuses 4,300 digits: the length first
        guess = int(turn) if ok and LO <= int(turn) <= HI else None
        self.guesses.append(guess)
        if guess is None:
            self.invalid += 1
            return "?", self.oracle(could_win), self.turns >= TURNS
        before = self.hi - self.lo + 1
        self.inconsistent += not self.lo <= guess <= self.hi
        if guess < self.secret:
            self.lo, obs = max(self.lo, guess + 1), ">"
        elif guess > self.secret:
            self.hi, obs = min(self.hi, guess - 1), "<"
        else:
            self.lo = self.hi = guess
            self.won, obs = True, "="
        shrink = math.log2(before / (self.hi - self.lo + 1)) / math.log2(HI - LO + 1)
        reward = (shrink if self.process_reward else 0.0) + self.oracle(could_win)
        return obs, reward, self.won or self.turns >= TURNS

    def oracle(self, could_win):
        """oracle_reward's for the turn just taken: +1 kept winnable (or won), -1 lost it."""
        if not self.oracle_reward or not could_win:
            return 0.0
        return 1.0 if self.winning_moves() > 0 else -1.0

    def winning_moves(self):
        """The guesses in LO..HI that keep a win within the turns left (0: no play wins from here;
        a won game: 1). A guess g in [lo, hi] splits it, and each side must fit the turns after it:
        g - lo and hi - g <= m = 2^(t-1) - 1, so those are [max(lo, hi - m), min(hi, lo + m)]. A
        guess outside [lo, hi] spends the turn and keeps every number: it wins where they fit m."""
        if self.won:
            return 1
        t = TURNS - self.turns
        if t <= 0:
            return 0
        m = 2 ** (t - 1) - 1
        inside = max(0, min(self.hi, self.lo + m) - max(self.lo, self.hi - m) + 1)
        left = self.hi - self.lo + 1  # the numbers still possible
        return inside + (HI - LO + 1 - left if left <= m else 0)

    def score(self, final):
        return 1.0 if self.won else 0.0

    def state(self):  # GiGPO's step groups: the numbers still possible, the turns taken
        return self.lo, self.hi, self.turns


def splits(n_train=20000):
    """train: n_train games, secrets 1..100 in turn (each row's demonstration drawn on its own);
    val and test: every secret once. The prompt never shows the secret, so no split leaks."""
    every = [(PROMPT, str(s)) for s in range(LO, HI + 1)]
    return {"train": [every[i % len(every)] for i in range(n_train)], "val": every, "test": every}


def demo(prompt, answer, rng):
    """A random consistent player's game -> (its guesses, no final answer: the game ends it)."""
    secret, lo, hi, guesses = int(answer), LO, HI, []
    while len(guesses) < TURNS:
        guess = rng.randint(lo, hi)
        guesses.append(str(guess))
        if guess == secret:
            break
        lo, hi = (guess + 1, hi) if guess < secret else (lo, guess - 1)
    return guesses, None
