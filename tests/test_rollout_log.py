"""The rollout log and replay (nanorl/rollout_log.py) and the terminal viewer (nanorl/view.py): the log's
fields against the Rollout and the advantages the update took, exactly; a row's tokens and roles rebuild
its sequence; replay gives the logged run's weights bit for bit (GRPO, PPO, the game); a corrupt or
partial file is one line naming it; a run killed while writing leaves whole files only."""
import json
import os

import pytest
import torch

import rl
from nanorl import rollout_log, view
from nanorl.config import UserError
from test_envs import TINY_RL as GAME_RL
from test_reliability import rows
from test_rl import TINY_RL, varied_reward  # noqa: F401 (a fixture)

EVERY = dict(log_rollouts=-1, log_every=1)


def logged(out, step):
    """A step's records and its .pt."""
    folder = out / "rollouts"
    recs = [json.loads(line) for line in open(folder / f"step_{step:06d}.jsonl")]
    return recs, torch.load(folder / f"step_{step:06d}.pt", weights_only=True)


@pytest.mark.parametrize("staleness", [0, 1])
def test_the_log_holds_the_rollout_and_the_advantages_the_update_took(guess_ckpt, tmp_path, monkeypatch, staleness):  # noqa: F811
    """The game (turn rewards, the environment's tokens), PPO (token advantages), fresh and one step stale
    (mu, the sampler's, is then not pi_old, the trainer's): every field of every token equals the Rollout's
    tensors and prepare's advantages; tokens and roles rebuild the sequence; the stats are the sampling
    stats of the rollout trained on, logged at the step that sampled it."""
    taken, real = [], rl.advantage_stage

    def advantage_stage(cfg, algo, hp, teacher):  # what each step's advantage stage gave
        stage = real(cfg, algo, hp, teacher)

        def advantages(cfg, algo, run, batch):
            adv, inputs = stage(cfg, algo, run, batch)
            taken.append((run.state.step + 1, adv.clone(), batch.ref_logp))  # (step, adv, ref_lp)
            return adv, inputs
        return advantages
    monkeypatch.setattr(rl, "advantage_stage", advantage_stage)
    rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=guess_ckpt, loss="ppo", **{**GAME_RL, "max_iters": 3},
                      staleness=staleness, **EVERY))
    from nanorl.evaluate import load_policy
    _, task = load_policy(guess_ckpt, False, torch.device("cpu"), {"process_reward": True})
    sampling = {r["step"]: r for r in rows(tmp_path / "metrics.jsonl") if "rl/n_groups" in r}
    assert len(taken) == 3 - staleness
    for step, adv, ref_lp in taken:
        recs, pt = logged(tmp_path, step)
        b, stats = pt["ranks"][0]["batch"], pt["ranks"][0]["stats"]
        assert "rl/n_groups" in stats and "rl/loss" not in stats  # sampling's only, not the update's
        assert {k: v for k, v in stats.items() if not k.startswith("perf/")} == \
            {k: v for k, v in sampling[step - staleness].items() if k.startswith("rl/") and k in stats}
        N, L = b["mask"].shape
        P = b["ids"].size(1) - L
        assert pt["whole"] and len(recs) == N and [r["row"] for r in recs] == list(range(N))
        assert (b["mu"] != b["old_logp"]).any() == bool(staleness)
        for r, rec in enumerate(recs):
            n = int(b["length"][r])
            assert rec["group"] == r // 4 and rec["step"] == step and rec["version"] == step - 1 - staleness
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


def test_by_default_two_groups_of_the_first_step_and_every_log_every_steps(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    """A debug run of 4 steps shows its rollouts: step 1's, then every log_every-th."""
    rl.main(rl.Config(out_dir=str(tmp_path), sft_ckpt=sft_ckpt, **{**TINY_RL, "max_iters": 4}, log_every=3,
                      dynamic_sampling=False))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == \
        ["step_000001.jsonl", "step_000001.pt", "step_000003.jsonl", "step_000003.pt"]
    recs, pt = logged(tmp_path, 3)
    assert len(recs) == 2 * 4 and not pt["whole"] and len(pt["ranks"][0]["batch"]["ids"]) == 8  # of 4 groups of 4


@pytest.mark.parametrize("loss", ["grpo", "ppo", "game", "stale"])
def test_replay_gives_the_logged_runs_weights(loss, request, tmp_path, monkeypatch):
    """20 steps logged whole, then trained again from the log without sampling: the same weights and
    metrics (a step whose groups were all dropped is logged without rows, and has no update in either).
    stale: a run one step stale, whose first step trains on nothing (its log without rows); replayed
    fresh, each step trains on what the stale run did, pi_old the trainer's as it recomputed it."""
    if loss == "game":
        cfg = dict(GAME_RL, sft_ckpt=request.getfixturevalue("guess_ckpt"), loss="grpo")
    else:
        request.getfixturevalue("varied_reward")
        cfg = dict(TINY_RL, sft_ckpt=request.getfixturevalue("sft_ckpt"), loss=loss.replace("stale", "grpo"))
    cfg, logged = dict(cfg, max_iters=20, eval_interval=10, eval_samples=0), dict(staleness=int(loss == "stale"))
    first = rl.main(rl.Config(out_dir=str(tmp_path / "run"), **cfg, **logged, **EVERY))["model"].state_dict()
    files = sorted((tmp_path / "run" / "rollouts").glob("*.pt"))
    updated = [torch.load(f, weights_only=True)["ranks"][0]["batch"] is not None for f in files]
    assert len(files) == 20 and 5 <= sum(updated) <= 20 and (not updated[0] or loss != "stale")
    monkeypatch.setattr(rl, "generate", None)  # replay samples nothing
    again = rl.main(rl.Config(out_dir=str(tmp_path / "replay"), replay=str(tmp_path / "run" / "rollouts"),
                              **cfg))["model"].state_dict()
    assert all(torch.equal(first[n], again[n]) for n in first)
    train = [[r for r in rows(tmp_path / name / "metrics.jsonl") if "rl/loss" in r] for name in ("run", "replay")]
    assert len(train[0]) == len(train[1]) == sum(updated) and (train[0] == train[1] or loss == "stale")


def test_replay_misuse_and_damaged_files_are_one_line(sft_ckpt, tmp_path, varied_reward):  # noqa: F811
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, max_iters=2, dynamic_sampling=False)
    rl.main(rl.Config(out_dir=str(tmp_path / "run"), **cfg, **EVERY))
    logs = tmp_path / "run" / "rollouts"
    with pytest.raises(UserError, match="--replay trains a policy-gradient algorithm .* --staleness=0"):
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
    """The second step's write dies half-way: step 1's files load, step 2 left only a .tmp.<pid>."""
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
    assert names == ["step_000001.jsonl", "step_000001.pt", f"step_000002.jsonl.tmp.{os.getpid()}"]
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
    assert len(tables) == 2  # steps 1 and 2
    data = {json.loads(t.read_text())["data"][0][0]: json.loads(t.read_text()) for t in tables}  # step: table
    assert sorted(data) == [1, 2]
    for step, t in data.items():
        assert t["columns"][:5] == ["step", "version", "group", "prompt", "response"] and len(t["data"]) == 2 * 4
        recs, _ = logged(tmp_path / "run", step)
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


def test_replay_refuses_a_log_that_does_not_fit_in_one_line(sft_ckpt, guess_ckpt, tmp_path, varied_reward):  # noqa: F811
    """Another group size (the rows regrouped), prompts per step, temperature (mu and pi_old of another
    policy), task, tokenizer, rank count or model shape, a log not of every step, and a row that reads a column its own sampling computes (CLIFF, ReMax,
    VinePPO, GiGPO on a GRPO log): one line each, naming it."""
    cfg = dict(TINY_RL, sft_ckpt=sft_ckpt, max_iters=2, eval_interval=100, eval_samples=0, dynamic_sampling=False)
    rl.main(rl.Config(out_dir=str(tmp_path / "run"), **cfg, **EVERY))
    logs = tmp_path / "run" / "rollouts"

    def replay(why, **kw):
        with pytest.raises(UserError, match=why):
            rl.main(rl.Config(**{**cfg, "out_dir": str(tmp_path / "again"), "replay": str(logs), **kw}))
    replay(r"step_000001.pt was logged with group_size 4; this run has 2", group_size=2)
    replay(r"was logged with prompts_per_step 4; this run has 8", prompts_per_step=8)
    replay(r"was logged with temperature 1.0; this run has 0.5", temperature=0.5)
    replay(r"was logged with task \{'task': 'mul'.*; this run has \{'task': 'env:guess'", sft_ckpt=guess_ckpt)
    first = torch.load(logs / "step_000001.pt", weights_only=True)
    for key, other in (("tokenizer", {"kind": "char", "chars": "0123"}), ("ranks", 2),
                       ("model", {**first["facts"]["model"], "n_embd": 64})):
        torch.save({**first, "facts": {**first["facts"], key: other}}, logs / "step_000001.pt")
        replay(f"was logged with {key} {other!r}".replace("{", r"\{").replace("}", r"\}"))
    torch.save(first, logs / "step_000001.pt")
    for loss, column in (("cliff", "first_wrong"), ("remax", "baseline"), ("vineppo", "values"), ("gigpo", "states")):
        replay(f"--replay: {loss} reads {column}, .* which its own sampling computes; .* is a grpo run's", loss=loss)
    rl.main(rl.Config(out_dir=str(tmp_path / "every2"), **{**cfg, "max_iters": 4}, log_rollouts=-1, log_every=2))
    replay("has no step 3: replay needs the log of every step", replay=str(tmp_path / "every2" / "rollouts"),
           max_iters=4)


def test_torchrun_logs_every_ranks_rows_and_replays_each_rank_its_own(sft_ckpt, tmp_path):  # noqa: F811
    """2 ranks, 8 prompts x 4 samples, no dynamic sampling: step 1's log holds all 32 rows, rank 0's then rank 1's,
    numbered over the ranks; a replay on 2 ranks trains each on its own rows, to the logged run's weights."""
    from test_ddp import torchrun2
    args = ["--loss=grpo", "--prompts_per_step=8", "--group_size=4", "--dynamic_sampling=false", "--max_iters=2",
            "--eval_samples=0", "--eval_interval=100", "--threads=1", f"--sft_ckpt={sft_ckpt}"]
    torchrun2([*args, f"--out_dir={tmp_path / 'run'}", "--log_rollouts=-1", "--log_every=1"], tmp_path / "run")
    recs, pt = logged(tmp_path / "run", 1)
    assert len(recs) == 32 and [r["row"] for r in recs] == list(range(32)) and pt["whole"]
    assert [r["rank"] for r in recs] == [0] * 16 + [1] * 16 and [r["group"] for r in recs] == [r // 4 for r in range(32)]
    assert [len(rank["batch"]["ids"]) for rank in pt["ranks"]] == [16, 16]
    assert not torch.equal(pt["ranks"][0]["batch"]["ids"], pt["ranks"][1]["batch"]["ids"])
    torchrun2([*args, f"--out_dir={tmp_path / 'replay'}", f"--replay={tmp_path / 'run' / 'rollouts'}"],
              tmp_path / "replay")
    first, again = (torch.load(tmp_path / name / "ckpt.pt", weights_only=True)["model"] for name in ("run", "replay"))
    assert all(torch.equal(first[n], again[n]) for n in first)
    start = torch.load(sft_ckpt, weights_only=True)["model"]
    assert any(not torch.equal(first[n], start[n]) for n in start)  # it trained
