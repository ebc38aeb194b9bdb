"""
The guess-the-number table (README): a checkpoint plays every secret, 8 games each at temperature 1
(the distribution RL trains) and once greedily, and the environment's own record of each game is
read back: wins within 7 turns, turns when won, invalid and inconsistent guesses, the first guess.

    python bench/guess.py --ckpt=out/sft-guess/ckpt.pt          # (a)
    python bench/guess.py --ckpt=out/rl-guess/ckpt.pt --traces=4
    python bench/guess.py --limit                                # (d) binary search, exactly
    python bench/guess.py --ckpt=out/sft-guess/ckpt.pt --what_if=44,69:80:84,85  # moves forced

Greedy, it also lists the losing states: each state [lo, hi] with t turns left whose move loses a
winnable game (the policy's modal move; envs/guess.py's oracle), with that move. --what_if plays
on greedily from one state (the guesses so far and a secret that reaches it) over every secret
of its interval, with the policy's own move and then with each given move forced.

A guess is consistent when the numbers it could be are still possible (every game's feedback so far).
"""
import os
import sys
from collections import Counter

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from envs import guess  # noqa: E402
from model import generate, responses  # noqa: E402
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from nanorl.episodes import play_turns  # noqa: E402
from nanorl.evaluate import Task  # noqa: E402
from nanorl.rows import encode_prompts  # noqa: E402


def play(ckpt_path, G=8, temperature=1.0, seed=0):
    """Every test secret G times -> (the games' Env objects, their decoded responses, the losing
    states: each (state, move) that lost a winnable game, sorted)."""
    ckpt = load_checkpoint(ckpt_path)
    model, tok = model_from_checkpoint(ckpt, ckpt_path)
    task = Task.of(ckpt, ckpt_path, tok)
    episodes = task.episodes(task.test, G)
    out = generate(model.eval(), encode_prompts(tok, [p for p, _ in task.test], task.reverse),
                   ckpt["config"]["max_new_tokens"], tok.eos_id, tok.pad_id, G=G,
                   temperature=temperature, generator=torch.Generator().manual_seed(seed),
                   episodes=episodes)
    lost = sorted({(v.state, v.action) for v in episodes.visits if v.lost},
                  key=lambda sa: (sa[0], str(sa[1])))  # an action None: a special token
    return episodes.envs, [tok.decode(r) for r in responses(out)], lost


def table_row(games):
    """Win within 7, mean turns when won, invalid and consistent shares of the guesses, the
    most common first guesses."""
    won = [g for g in games if g.won]
    guesses = sum(g.turns for g in games)
    valid = guesses - sum(g.invalid for g in games)
    first = Counter(g.guesses[0] for g in games if g.guesses)
    binary = sum(g.won and is_binary_search(g.secret, g.guesses) for g in games) / len(games)
    return {"win": len(won) / len(games), "turns_won": sum(g.turns for g in won) / max(1, len(won)),
            "invalid": sum(g.invalid for g in games) / max(1, guesses),
            "consistent": 1 - sum(g.inconsistent for g in games) / max(1, valid),
            "binary": binary, "first": first.most_common(5)}


def is_binary_search(secret, guesses):
    """Every guess the middle of the numbers still possible (either middle of an even count)."""
    lo, hi = guess.LO, guess.HI
    for g in guesses:
        if g is None or g not in ((lo + hi) // 2, (lo + hi + 1) // 2):
            return False
        lo, hi = (g + 1, hi) if g < secret else (lo, g - 1)
    return True


def binary_search(secret):
    """The limit: turns to find the secret by always guessing the middle."""
    lo, hi = guess.LO, guess.HI
    for turn in range(1, 100):
        g = (lo + hi) // 2
        if g == secret:
            return turn
        lo, hi = (g + 1, hi) if g < secret else (lo, g - 1)


def what_if(ckpt_path, history, secret, moves):
    """From the state that the guesses `history` reach with `secret` ([lo, hi], t turns left),
    the greedy policy's wins over every secret of [lo, hi] (each answers history alike), its own
    move first, then each of `moves` forced -> [(move or None, wins, games)]: what a move is
    worth under the policy's play after it."""
    ckpt = load_checkpoint(ckpt_path)
    model, tok = model_from_checkpoint(ckpt, ckpt_path)
    task, env = Task.of(ckpt, ckpt_path, tok), guess.Env(str(secret))
    for g in history:
        env.step(str(g))
    secrets, out = [str(s) for s in range(env.lo, env.hi + 1)], []
    prompt = encode_prompts(tok, [guess.PROMPT], task.reverse)[0]
    for move in [None] + moves:
        turns = [str(g) for g in history + ([move] if move is not None else [])]
        episodes, prompts = task.episodes([(guess.PROMPT, s) for s in secrets], 1), []
        for r, s in enumerate(secrets):  # each row's environment replayed to the turns
            ids, act, _ = play_turns(guess, (guess.PROMPT, s), turns, tok, task.reverse)
            episodes.retake(r, ids, act)
            prompts.append(prompt + ids)  # one length: the observations are one token each
        generate(model.eval(), prompts, ckpt["config"]["max_new_tokens"] - len(ids), tok.eos_id,
                 tok.pad_id, G=1, temperature=0.0, episodes=episodes)
        out.append((move, sum(e.won for e in episodes.envs), len(secrets)))
    return out


def main(argv):
    args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in argv)
    if "limit" in args:
        turns = [binary_search(s) for s in range(guess.LO, guess.HI + 1)]
        print(f"binary search: win {sum(t <= guess.TURNS for t in turns) / len(turns):.3f}, "
              f"turns when won {sum(turns) / len(turns):.2f}, invalid 0, first guess 50")
        return
    ckpt = args.get("ckpt", "out/sft-guess/ckpt.pt")
    if "what_if" in args:  # --what_if=44,69:80:84,85,86 (history : a secret : the moves to force)
        history, secret, moves = args["what_if"].split(":")
        for move, wins, n in what_if(ckpt, [int(g) for g in history.split(",")], int(secret),
                                     [int(m) for m in moves.split(",")]):
            print(f"{'the policy' if move is None else move}: wins {wins} of {n}")
        return
    for name, G, temperature in (("temperature 1, 8 games a secret", 8, 1.0), ("greedy", 1, 0.0)):
        games, texts, lost = play(ckpt, G, temperature)
        r = table_row(games)
        print(f"{name}: win within 7 {r['win']:.3f}, turns when won {r['turns_won']:.2f}, "
              f"invalid {r['invalid']:.3f}, consistent {r['consistent']:.3f}, "
              f"binary search {r['binary']:.3f}, "
              f"first guesses {r['first']}")
        if G == 1:
            print(f"  losing states: {len(lost)}" + "".join(
                f"\n    [{lo}, {hi}] with {guess.TURNS - t} turns left: guesses {a}"
                for (lo, hi, t), a in lost))
        if G > 1:
            for text, g in list(zip(texts, games))[:int(args.get("traces", 0)) * G:G]:
                print(f"  secret {g.secret:3d}: {guess.PROMPT}{text}")


if __name__ == "__main__":
    main(sys.argv[1:])
