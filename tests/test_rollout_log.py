"""The rollout log and replay (nanorl/rollout_log.py) and the terminal viewer (nanorl/view.py): the log's
fields against the Rollout and the advantages the update took, exactly; a row's tokens and roles rebuild
its sequence; replay gives the logged run's weights bit for bit (GRPO, PPO, the game); a corrupt or
partial file is one line naming it; a run killed while writing leaves whole files only."""
import json

import pytest
import torch

import rl
from nanorl import rollout_log, view
from nanorl.config import UserError
from test_envs import TINY_RL as GAME_RL, guess_ckpt  # noqa: F401
from test_reliability import rows
from test_rl import TINY_RL, sft_ckpt, varied_reward  # noqa: F401

EVERY = dict(log_rollouts=-1, log_every=1)


def logged(out, step):
    """A step's records and its .pt."""
    folder = out / "rollouts"
    recs = [json.loads(line) for line in open(folder / f"step_{step:06d}.jsonl")]
    return recs, torch.load(folder / f"step_{step:06d}.pt", weights_only=True)


def test_the_log_holds_the_rollout_and_the_advantages_the_update_took(guess_ckpt, tmp_path, monkeypatch):  # noqa: F811
    """The game (turn rewards, the environment's tokens), PPO (token advantages): every field of every
    token equals the Rollout's tensors and prepare's advantages; tokens and roles rebuild the sequence."""
    taken, real = [], rl.prepare

    def prepare(cfg, algo, run, batch):
        out = real(cfg, algo, run, batch)
        taken.append((out[1].clone(), out[0]))  # (adv, ref_lp)
        return out
    monkeypatch.setattr(rl, "prepare", prepare)
    rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=guess_ckpt, loss="ppo", **{**GAME_RL, "max_iters": 2},
                            **EVERY))
    from nanorl.evaluate import load_policy
    _, task = load_policy(guess_ckpt, False, torch.device("cpu"), {"process_reward": True})
    for step, (adv, ref_lp) in enumerate(taken, 1):
        recs, pt = logged(tmp_path, step)
        b = pt["batch"]
        N, L = b["mask"].shape
        P = b["ids"].size(1) - L
        assert pt["whole"] and len(recs) == N and [r["row"] for r in recs] == list(range(N))
        for r, rec in enumerate(recs):
            n = int(b["length"][r])
            assert rec["group"] == r // 4 and rec["step"] == step and rec["version"] == step - 1
            assert rec["score"] == b["score"][r].item() and rec["reward"] == b["reward"][r].item()
            assert rec["turns"] == int(b["turns"][r]) and rec["truncated"] == (not bool(b["finished"][r]))
            ids = b["ids"][r].tolist()
            assert "".join(t["text"] for t in rec["tokens"]) == rec["response"] == task.tok.decode(ids[P:P + n])
            assert rec["prompt"] == task.tok.decode(ids[int(b["offsets"][r]):P])
            assert [t["role"] == "policy" for t in rec["tokens"]] == b["mask"][r, :n].bool().tolist()
            assert [t["mu"] for t in rec["tokens"]] == b["mu"][r, :n].tolist()
            assert [t["old"] for t in rec["tokens"]] == b["old_logp"][r, :n].tolist()
            assert [t["adv"] for t in rec["tokens"]] == adv[r, :n].tolist()
            assert [t["turn_reward"] for t in rec["tokens"]] == b["turn_rewards"][r, :n].tolist()
            assert [t["ref"] for t in rec["tokens"]] == ref_lp[r, :n].tolist()  # PPO's KL: beta 0.05
        assert any(t["role"] == "env" for rec in recs for t in rec["tokens"])


def test_by_default_two_groups_every_log_every_steps(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=sft_ckpt, **{**TINY_RL, "max_iters": 4}, log_every=2,
                      dynamic_sampling=False))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == \
        ["step_000002.jsonl", "step_000002.pt", "step_000004.jsonl", "step_000004.pt"]
    recs, pt = logged(tmp_path, 4)
    assert len(recs) == 2 * 4 and not pt["whole"] and len(pt["batch"]["ids"]) == 8  # of 4 groups of 4


@pytest.mark.parametrize("loss", ["grpo", "ppo", "game"])
def test_replay_gives_the_logged_runs_weights(loss, request, tmp_path, monkeypatch):
    """20 steps logged whole, then trained again from the log without sampling: the same weights and
    metrics (a step whose groups were all dropped has no file and no update in either)."""
    if loss == "game":
        cfg = dict(GAME_RL, sft_ckpt=request.getfixturevalue("guess_ckpt"), loss="grpo")
    else:
        request.getfixturevalue("varied_reward")
        cfg = dict(TINY_RL, sft_ckpt=request.getfixturevalue("sft_ckpt"), loss=loss)
    cfg = dict(cfg, max_iters=20, eval_interval=10, eval_samples=0)
    first = rl.main(rl.Config(out_dir=str(tmp_path / "run"), **cfg, **EVERY))["model"].state_dict()
    steps = len(list((tmp_path / "run" / "rollouts").glob("*.pt")))
    assert 5 <= steps <= 20
    monkeypatch.setattr(rl, "generate", None)  # replay samples nothing
    again = rl.main(rl.Config(out_dir=str(tmp_path / "replay"), replay=str(tmp_path / "run" / "rollouts"),
                              **cfg))["model"].state_dict()
    assert all(torch.equal(first[n], again[n]) for n in first)
    train = [[r for r in rows(tmp_path / name / "metrics.jsonl") if "rl/loss" in r] for name in ("run", "replay")]
    assert train[0] == train[1] and len(train[0]) == steps


def test_replay_misuse_and_damaged_files_are_one_line(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, max_iters=2, dynamic_sampling=False)
    rl.main(rl.Config(out_dir=str(tmp_path / "run"), **cfg, **EVERY))
    logs = tmp_path / "run" / "rollouts"
    with pytest.raises(UserError, match="--replay trains a policy-gradient row .* --staleness=0"):
        rl.main(rl.Config(out_dir=str(tmp_path / "a"), replay=str(logs), staleness=1, **cfg))
    with pytest.raises(UserError, match="ends at step 2; set --max_iters=2"):
        rl.main(rl.Config(out_dir=str(tmp_path / "b"), replay=str(logs), **{**cfg, "max_iters": 3}))
    (logs / "step_000002.pt").write_bytes((logs / "step_000002.pt").read_bytes()[:100])
    with pytest.raises(UserError, match=r"step_000002.pt: not a whole rollout log file"):
        rl.main(rl.Config(out_dir=str(tmp_path / "c"), replay=str(logs), **cfg))
    rl.main(rl.Config(out_dir=str(tmp_path / "part"), **cfg, log_every=1))  # 2 groups of 2: not whole
    with pytest.raises(UserError, match="holds some groups of the step, not all"):
        rl.main(rl.Config(out_dir=str(tmp_path / "d"), replay=str(tmp_path / "part" / "rollouts"), **cfg))
    (logs / "step_000001.jsonl").write_text('{"step": 1, "gro')
    with pytest.raises(SystemExit, match=r"step_000001.jsonl: not a whole rollout log"):
        view.main([str(tmp_path / "run")])


def test_a_run_killed_while_writing_leaves_whole_files(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    """The second step's write dies half-way: step 1's files load, step 2 left only a .tmp."""
    real = json.dumps

    def dying(obj, *a, **k):
        if isinstance(obj, dict) and obj.get("step") == 2 and obj.get("row") == 3:
            raise KeyboardInterrupt
        return real(obj, *a, **k)
    monkeypatch.setattr(rollout_log.json, "dumps", dying)
    with pytest.raises(KeyboardInterrupt):
        rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=sft_ckpt, **{**TINY_RL, "max_iters": 3},
                          dynamic_sampling=False, **EVERY))
    names = sorted(p.name for p in (tmp_path / "rollouts").iterdir())
    assert names == ["step_000001.jsonl", "step_000001.pt", "step_000002.jsonl.tmp"]
    recs, pt = logged(tmp_path, 1)
    assert len(recs) == 16 and pt["whole"]


def test_the_viewer_colours_by_role_and_advantage_and_marks_surprises(capsys):
    tok = lambda text, role, adv, mu=-0.1, old=-0.1: dict(text=text, role=role, adv=adv, mu=mu, old=old)  # noqa: E731
    rec = dict(step=3, version=2, group=0, row=0, prompt="1-100:", reward=0.5, score=1.0, turns=2, truncated=False,
               tokens=[tok("5", "policy", 0.7), tok("0", "policy", -0.2, mu=-4.0), tok("|", "policy", 0.0),
                       tok("<", "env", 0.7)])
    view.show([rec], color=True)
    out = capsys.readouterr().out
    assert "step 3 (version 2) group 0: '1-100:'  rewards 0.50" in out
    assert f"{view.GREEN}5{view.END}{view.RED}{view.UNDER}0{view.END}|{view.END}{view.DIM}<{view.END}" in out
    assert "surprising '0': mu -4.00 pi_old -0.10 adv -0.200" in out and out.count("surprising") == 1
    view.show([rec], color=False)
    assert "| 50|[<]" in capsys.readouterr().out


def test_with_wandb_the_sample_is_a_table_offline(sft_ckpt, tmp_path, monkeypatch, varied_reward):  # noqa: F811
    """--wandb=true: the logged rows are also a wandb Table, "rollouts" (offline mode)."""
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                 "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(k, v)
    rl.main(rl.Config(out_dir=str(tmp_path / "run"), sft_ckpt=sft_ckpt, wandb=True, log_every=2,
                      dynamic_sampling=False, **TINY_RL))
    tables = list((tmp_path / "run" / "wandb").glob("offline-run-*/files/media/table/rollouts_*.table.json"))
    assert len(tables) == 1
    t = json.loads(tables[0].read_text())
    assert t["columns"][:5] == ["step", "version", "group", "prompt", "response"] and len(t["data"]) == 2 * 4
    recs, _ = logged(tmp_path / "run", 2)
    assert [row[4] for row in t["data"]] == [r["response"] for r in recs]


def test_the_page_embeds_the_log_verbatim_and_marks_surprises_by_the_terminals_rule():
    """Text in the log that reads like the page's placeholders or closes its script stays as it is;
    each token's surprise flag is view.surprising's."""
    toks = [dict(text="</script>", role="policy", adv=0.5, mu=-4.0, old=-4.0),
            dict(text="DATA", role="policy", adv=0.5, mu=-0.1, old=-2.0),
            dict(text="TITLE", role="env", adv=0.5, mu=0.0, old=0.0)]
    rec = dict(step=1, version=0, group=0, row=0, prompt="TITLE DATA SMU", reward=1.0, score=1.0, turns=None,
               truncated=False, tokens=toks)
    html = view.page({1: [rec]}, "a run's TITLE")
    line = next(x for x in html.split("\n") if x.startswith("const LOG = "))
    logged = json.loads(line[len("const LOG = "):-1])
    assert logged == {"1": [{**rec, "tokens": [{**t, "surprise": s} for t, s in zip(toks, (True, True, False))]}]}
    assert "</script>" not in line and "<title>nanorl rollouts: a run&#x27;s TITLE</title>" in html
