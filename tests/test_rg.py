"""reasoning-gym tasks (nanorl/rg.py): disjoint, deduplicated splits of a real generator; its own
score_answer as the reward, partial credit included, on the answer in the generator's format;
one-line errors; a tiny run end to end, with the char and a BPE tokenizer."""
import json
import os
import re
import runpy
import sys

import pytest
import torch

import losses as L
import rl
import sft
from data.tasks import DataError
from nanorl import rg
from nanorl.evaluate import Task
from tests.test_rl import TINY_SFT, make_run
from tests.test_tools import fake_generate
from tokenizer import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAIN = dict(min_terms=2, max_terms=3, max_digits=2)


def test_splits_are_disjoint_and_deduplicated_on_a_real_generator():
    """reasoning-gym draws item i from seed + i: seeds 1 and 2 give the same items shifted by
    one. The splits here share no question, and none repeats within a split."""
    import reasoning_gym
    one, two = (reasoning_gym.create_dataset("chain_sum", size=400, seed=s, **CHAIN) for s in (1, 2))
    assert sum(two[i]["question"] == one[i + 1]["question"] for i in range(399)) == 399  # the pitfall
    splits, _ = rg.splits("chain_sum", CHAIN)
    questions = {k: [q for q, _ in v] for k, v in splits.items()}
    assert all(len(set(q)) == len(q) for q in questions.values())
    train = set(questions["train"])
    assert not train & set(questions["val"]) and not train & set(questions["test"])
    assert not set(questions["val"]) & set(questions["test"])
    assert [len(questions[k]) for k in ("val", "test")] == [500, 1000] and 15000 < len(train) < 21000
    assert questions["test"][0].startswith("State the final answer to the following arithmetic problem: ")


def test_one_line_errors_name_the_valid_ones(monkeypatch):
    with pytest.raises(DataError, match=r"unknown reasoning-gym task 'chain_summ'; valid: .*basic_arithmetic, .*chain_sum"):
        rg.splits("chain_summ", {})
    with pytest.raises(DataError, match=r"rg:chain_sum has no config key 'max_term'; valid: min_terms, max_terms, "
                                        r"min_digits, max_digits, allow_negation$"):
        rg.splits("chain_sum", {"max_term": 3})
    with pytest.raises(DataError, match=r"rg:chain_sum config .*AssertionError"):
        rg.splits("chain_sum", {"min_terms": 4, "max_terms": 2})
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)
    with pytest.raises(DataError, match=r"task rg:chain_sum needs reasoning-gym: pip install -r requirements-rg.txt"):
        rg.splits("chain_sum", {})


def test_a_config_too_narrow_for_every_split_is_refused_at_load(tmp_path):
    """2 one-digit terms give 200 questions, none of whose keys hashes to val: one line, not a
    ZeroDivisionError at the first val eval."""
    narrow = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    with pytest.raises(DataError, match=re.escape(
            f"rg:chain_sum config {narrow} gives 200 distinct problems: 184 train, 0 val, 16 test; "
            "every split needs at least one: widen the config")):
        sft.main(sft.Config(task="rg:chain_sum", rg=narrow, block_size=80, out_dir=str(tmp_path)))


def chain_task(reverse):
    """A test problem whose answer reads differently reversed (the digit order must be turned back)."""
    splits, scorer = rg.splits("chain_sum", CHAIN)
    alphabet = sorted(set("".join(q + a for s in splits.values() for q, a in s)))
    problem = next((q, a) for q, a in splits["test"] if a != a[::-1])
    return Task(CharTokenizer("".join(alphabet)), "rg:chain_sum", reverse, "exact", 0, [problem],
                rg=CHAIN, scorer=scorer)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_generators_score_is_the_reward_partial_credit_included(monkeypatch, reverse):
    """chain_sum's score_answer gives 1 to the answer, partial credit to a longer string that holds
    it; the model's digit order is turned back first; accuracy counts only the 1s."""
    task = chain_task(reverse)
    (q, a), = task.train
    answers = [a, a + "=", "9" + a, "w"]  # right; holds it (partial credit); wrong; garbage
    rows = [[(t[::-1] if reverse else t, 0)] for t in answers]  # as the model writes them
    cfg = rl.Config(loss="grpo", group_size=4, max_new_tokens=8, overlong_window=0)
    monkeypatch.setattr(rl, "generate", fake_generate(rows, task.tok))
    b = rl.rollout(cfg, L.ALGOS["grpo"], make_run(cfg, None, task), [0], None, 4, 1.0)
    want = [task.scorer(q, t) for t in answers]
    assert b.score.tolist() == pytest.approx(want) and want[0] == 1.0 and 0 < want[1] < 1
    assert rl.rollout_metrics(b)["rl/accuracy"] == 0.25


def test_a_tiny_rg_run_end_to_end(tmp_path):
    out = tmp_path / "sft"
    sft.main(sft.Config(task="rg:chain_sum", rg=CHAIN, block_size=96, out_dir=str(out),
                        **{**TINY_SFT, "max_iters": 10, "eval_interval": 10}))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["rg"] == CHAIN and ckpt["config"]["task"] == "rg:chain_sum"
    rl.main(rl.Config(sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "rl"), max_iters=1, eval_interval=1,
                      prompts_per_step=2, group_size=4, eval_samples=2, threads=1, dynamic_sampling=False))
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert "eval/mean_score" in rows[-1] and any("rl/reward_mean" in r for r in rows)
    from bench import compare  # every row from an rg: checkpoint (it has no data files)
    cmp = compare.main(compare.Config(losses="grpo", sft_ckpt=str(out / "ckpt.pt"), out_dir=str(tmp_path / "cmp"),
                                      max_iters=1, eval_interval=1, eval_samples=2, jobs=1,
                                      rl_args="--prompts_per_step=2 --group_size=4"))
    assert cmp["failed"] == [] and "rg:chain_sum test split" in (tmp_path / "cmp" / "compare.md").read_text()
    with pytest.raises(rl.UserError, match="takes no --verifier"):
        sft.main(sft.Config(task="rg:chain_sum", verifier="text", out_dir=str(tmp_path / "x")))
    with pytest.raises(rl.UserError, match="takes no --rg"):
        sft.main(sft.Config(rg=CHAIN, out_dir=str(tmp_path / "x")))


def test_an_rg_task_with_a_bpe_tokenizer(tmp_path, monkeypatch):
    from test_sft import toy_bpe
    out = tmp_path / "sft"
    sft.main(sft.Config(task="rg:chain_sum", rg=CHAIN, tokenizer=toy_bpe(monkeypatch), reverse=False,
                        block_size=96, max_new_tokens=6, out_dir=str(out),
                        **{**TINY_SFT, "max_iters": 2, "eval_interval": 2}))
    assert torch.load(out / "ckpt.pt", weights_only=True)["tokenizer"]["kind"] == "bpe"


def twins(question):
    """This test's own notion of one problem, whatever the order and the wording: its numbers and its
    operators, each sorted."""
    return tuple(sorted(re.findall(r"\d+", question))), tuple(sorted(re.findall(r" ([-+*/]) ", question)))


@pytest.mark.parametrize("name, config", [
    ("basic_arithmetic", runpy.run_path(f"{ROOT}/configs/rg_basic_arithmetic.py")["rg"]),
    ("chain_sum", runpy.run_path(f"{ROOT}/configs/rg_chain_sum.py")["rg"]),
    ("basic_arithmetic", {**runpy.run_path(f"{ROOT}/configs/rg_basic_arithmetic.py")["rg"], "format_style": "natural"})])
def test_no_held_out_question_is_a_train_question_in_another_order_or_wording(name, config):
    """'Calculate 28 + 46.' in test and 'Calculate 46 + 28.' (or 'What is 28 + 46?') in train: the
    split goes by the generator's own statement of the problem, so none is."""
    splits, _ = rg.splits(name, config)
    train = {twins(q) for q, _ in splits["train"]}
    held = [twins(q) for q, _ in splits["val"] + splits["test"]]
    assert not [t for t in held if t in train] and len(splits["test"]) > 500 and len(splits["val"]) > 250


@pytest.mark.parametrize("name", ["boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"])
def test_a_generator_without_gold_answers_is_refused_in_one_line(tmp_path, name):
    with pytest.raises(DataError, match=rf"^rg:{name} gives no gold answer \(its answer is None\): nothing to "
                                        r"imitate or score$"):
        sft.main(sft.Config(task=f"rg:{name}", out_dir=str(tmp_path)))
