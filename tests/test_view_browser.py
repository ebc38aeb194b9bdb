"""The rollout viewer (nanorl/view.py) as a person meets it: the page in a real browser (Debian's
headless chromium; .ci/run installs it) and the terminal's lines. The rows and groups, the colours by
role and advantage, a hovered token's values, the model's digit order beside the normal one, and a run
whose prompts are hostile text (markup, `__proto__`, terminal escapes): shown as text, every group drawn."""
import html
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import rl
import sft
from nanorl import view
from test_rl import ROOT, TINY_SFT

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium (apt-get install -y chromium)")
PWN = "<img src=x onerror=\"document.title='pwned'\">"
HOSTILE = ["</script>", "<!--<script>", PWN, "__proto__", "a\u2028b", "\x1b]0;pwned\x07", "\x1b[2J"]
RAW = set("\x1b\x07\r\u2028\u2029")  # what a terminal acts on, or a line end it may draw as one


def tok(text, role, adv, mu=-0.1, old=-0.1, ref=None, turn_reward=0.0):
    return dict(text=text, role=role, adv=adv, mu=mu, old=old, ref=ref, turn_reward=turn_reward)


def record(step, group, row, reward, tokens, prompt="1-100:", **normal):
    """A log record; normal: reversed, prompt_normal and response_normal, which older logs lack."""
    return dict(step=step, version=step - 1, group=group, row=row, prompt=prompt,
                response="".join(t["text"] for t in tokens), score=reward, reward=reward, turns=1, truncated=False,
                tokens=tokens, **normal)


LOG = {3: [record(3, 0, 0, 1.0, [tok("5", "policy", 0.7), tok("0", "policy", 0.7), tok("|", "policy", 0.7),
                                 tok("=", "env", 0.7)]),
           record(3, 0, 1, 0.0, [tok("9", "policy", -0.7, mu=-4.0, old=-2.5), tok("|", "policy", -0.7),
                                 tok("<", "env", -0.7)]),
           record(3, 1, 2, 0.5, [tok("4", "policy", 0.0)], prompt="1-50:")],
       8: [record(8, 0, 0, 1.0, [tok("5", "policy", 0.2), tok("0", "policy", 0.2)])]}
# "9*54=" as the model reads it (digits reversed): 486 written 684 is right; a group of a log from before the keys
REVERSED = {5: [record(5, 0, 0, 1.0, [tok("6", "policy", 0.5), tok("8", "policy", 0.5), tok("4", "policy", 0.5)],
                       prompt="9*45=", reversed=True, prompt_normal="9*54=", response_normal="486"),
                record(5, 0, 1, 0.0, [tok("6", "policy", -0.5), tok("0", "policy", -0.5), tok("4", "policy", -0.5)],
                       prompt="9*45=", reversed=True, prompt_normal="9*54=", response_normal="406"),
                record(5, 1, 2, 0.0, [tok("7", "policy", 0.0)], prompt="1-50:")]}


def write_page(tmp_path, log, title="test run"):
    page = tmp_path / "rollouts.html"
    page.write_text(view.page(log, title))
    return page


def browse(page, fragment="", shot=None):
    """page (a file) in headless chromium -> its DOM once the script has run (or a screenshot to shot)."""
    args = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,600"]
    args += [f"--screenshot={shot}"] if shot else ["--dump-dom"]
    r = subprocess.run(args + [f"file://{page}{fragment}"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HOME": str(page.parent)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def elements(dom):
    """The DOM before the page's script: what was drawn, without the log the script holds as data."""
    return dom[:dom.index("<script>")]


@needs_browser
def test_the_page_shows_the_step_its_groups_rows_and_colours(tmp_path):
    dom = browse(write_page(tmp_path, LOG))
    assert re.findall(r'<option value="(\d+)"', dom) == ["3", "8"]  # steps to pick, the first shown
    assert dom.count('class="group"') == 2 and dom.count('class="row"') == 3
    assert "group 0: 1-100:" in dom and "rewards 1.00 0.00" in dom
    got = set()
    for attrs, text in re.findall(r'<span ([^>]*data-i[^>]*)>([^<]*)</span>', dom):
        cls, style = re.search(r'class="t ([^"]*)"', attrs), re.search(r'style="([^"]*)"', attrs)
        got.add((text, cls.group(1), style.group(1) if style else ""))
    assert ("5", "policy pos", "background: rgba(40, 160, 60, 0.8);") in got  # |adv| 0.7: 0.15 + 0.7 capped
    assert ("9", "policy neg surprise", "background: rgba(210, 50, 50, 0.8);") in got  # mu < log 0.05
    assert ("=", "env", "") in got and ("4", "policy", "") in got  # the environment's; advantage 0
    moves = re.search(r'<table id="moves">(.*?)</table>', dom).group(1)
    assert re.search(r"<td>1-100:</td><td>0.50</td><td>1.00</td>", moves)  # the group's mean, step by step
    assert re.search(r"<td>1-50:</td><td>0.50</td><td></td>", moves)


@needs_browser
def test_hovering_a_token_shows_its_log_probs_ratio_and_advantage(tmp_path):
    dom = browse(write_page(tmp_path, LOG), "#hover=1,0")
    tip = re.search(r'<div id="tip" style="([^"]*)">([^<]*)</div>', dom)
    assert "display: block" in tip.group(1)
    assert tip.group(2).split("\n") == ['"9" (policy)', "mu -4.000  pi_old -2.500  ref -",
                                        "ratio pi_old/mu 4.482", "advantage -0.700  turn reward 0.000"]


@needs_browser
def test_a_hovered_token_of_markup_shows_as_text_and_runs_nothing(tmp_path):
    """The tip is text: a token `<img src=x onerror=...>` reads as itself and never becomes an element."""
    dom = browse(write_page(tmp_path, {1: [record(1, 0, 0, 1.0, [tok(PWN, "policy", 0.5)])]}), "#hover=0,0")
    assert "<img" not in elements(dom) and "<title>nanorl rollouts: test run</title>" in dom  # title unchanged
    tip = re.search(r'<div id="tip" style="[^"]*">([^<]*)</div>', dom).group(1)
    assert tip.split("\n")[0] == html.escape(json.dumps(PWN), quote=False) + " (policy)"


@needs_browser
def test_a_screenshot_is_a_picture(tmp_path):
    shot = tmp_path / "shot.png"
    browse(write_page(tmp_path, LOG), "#hover=1,0", shot=shot)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@pytest.mark.parametrize("mu, old, role, surprising", [
    (-3.1, -3.1, "policy", True),  # mu below log 0.05 = -3.0
    (-2.9, -2.9, "policy", False),
    (-0.5, -1.6, "policy", True),  # pi_old / mu = e^-1.1, beyond e either way
    (-1.6, -0.5, "policy", True),
    (-1.5, -0.6, "policy", False),  # e^0.9
    (-4.0, -1.0, "env", False),  # the environment's tokens are no one's sample
])
def test_a_token_is_surprising_where_mu_is_below_5_percent_or_pi_old_over_mu_beyond_e(mu, old, role, surprising):
    assert view.surprising(tok("7", role, 0.5, mu=mu, old=old)) == surprising


def test_the_terminal_shows_control_characters_as_escapes(capsys):
    """ESC, BEL, CR, U+2028 in a prompt or a token print as \\x1b, \\x07, \\r, \\u2028 (a newline as \\n);
    the colours are the viewer's own."""
    toks = [tok("\x1b]0;pwned\x07", "policy", 0.5), tok("\x1b[2J", "env", 0.0), tok("a\r\n\u2028", "policy", -0.5)]
    rec = record(3, 0, 0, 1.0, toks, prompt="\x1b[2J=")
    view.show([rec], color=False)
    assert capsys.readouterr().out.splitlines() == [
        r"step 3 (version 2) group 0: '\x1b[2J='  rewards 1.00",
        r"  reward +1.000 score 1.00 turns 1 | \x1b]0;pwned\x07[\x1b[2J]a\r\n\u2028"]
    view.show([rec], color=True)
    painted = [view.GREEN, r"\x1b]0;pwned\x07", view.END, view.DIM, r"\x1b[2J", view.END,
               view.RED, r"a\r\n\u2028", view.END]
    assert capsys.readouterr().out.splitlines()[1] == "  reward +1.000 score 1.00 turns 1 | " + "".join(painted)


def test_the_terminal_gives_the_normal_digit_order_of_a_reversed_task(capsys):
    """One note a step that digits are the model's order, then each prompt and response also as a person
    reads it; a group of a log written before the keys reads as not reversed."""
    view.show(REVERSED[5], color=False)
    assert capsys.readouterr().out.splitlines() == [
        "step 5: digits least-significant first, as the model reads and writes them; in brackets as a person "
        "reads them",
        "step 5 (version 4) group 0: '9*45=' ('9*54=')  rewards 1.00 0.00",
        "  reward +1.000 score 1.00 turns 1 | 684 ('486')",
        "  reward +0.000 score 0.00 turns 1 | 604 ('406')",
        "step 5 (version 4) group 1: '1-50:'  rewards 0.00",
        "  reward +0.000 score 0.00 turns 1 | 7"]
    view.show(LOG[3], color=False)
    assert "least-significant" not in capsys.readouterr().out


@needs_browser
def test_the_page_gives_the_normal_digit_order_of_a_reversed_task(tmp_path):
    dom = browse(write_page(tmp_path, REVERSED))
    assert re.search(r'<div id="digits" class="meta">digits least-significant first, as the model reads and '
                     r"writes them; in brackets as a person reads them</div>", dom)  # not hidden
    assert "<b>group 0: 9*45= (9*54=)</b>" in dom and "<b>group 1: 1-50:</b>" in dom
    assert re.findall(r'<span class="meta"> \((\d+)\)</span>', dom) == ["486", "406"]
    assert "<td>9*45= (9*54=)</td><td>0.50</td>" in dom  # the table of mean rewards names it both ways
    assert '<div id="digits" class="meta" hidden="">' in browse(write_page(tmp_path, LOG))  # no reversed step


def test_a_reader_that_has_gone_ends_the_viewer_quietly(tmp_path):
    """`python -m nanorl.view OUT | head`: the reader closes the pipe; no traceback, exit 1 (Python's docs)."""
    (tmp_path / "rollouts").mkdir()
    for step, recs in LOG.items():
        (tmp_path / "rollouts" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first line
    r = subprocess.run([sys.executable, "-m", "nanorl.view", str(tmp_path)], stdout=write_end, stderr=subprocess.PIPE,
                       cwd=ROOT, text=True, timeout=600)
    os.close(write_end)
    assert (r.returncode, r.stderr) == (1, "")


# ---------------------------------------------------------------- a run whose prompts are hostile text


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A JSONL task whose prompts are HOSTILE, a tiny SFT on it and two RL steps that log every group:
    the log as a run writes it (the untrained model's tokens come from the same characters)."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "task").mkdir()
    for split in ("train", "val", "test"):
        (root / "task" / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n"
                                                              for p in HOSTILE))
    sft.main(sft.Config(task=str(root / "task"), reverse=False, verifier="text", out_dir=str(root / "sft"),
                        block_size=64, **{**TINY_SFT, "max_iters": 2, "eval_interval": 2}))
    rl.main(rl.Config(sft_ckpt=str(root / "sft" / "ckpt.pt"), out_dir=str(root / "rl"), max_iters=2, eval_interval=2,
                      prompts_per_step=len(HOSTILE), group_size=2, max_new_tokens=4, eval_samples=0, threads=1,
                      dynamic_sampling=False, log_rollouts=-1, log_every=1))  # every prompt at every step
    return root / "rl"


@needs_browser
def test_hostile_prompts_reach_the_page_as_text_and_every_group_is_drawn(hostile_run, tmp_path):
    page = tmp_path / "hostile.html"
    r = subprocess.run([sys.executable, "-m", "nanorl.view", str(hostile_run), f"--html={page}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "2 steps" in r.stdout, r.stderr
    dom = browse(page)
    recs = view.read(hostile_run / "rollouts" / "step_000001.jsonl")
    assert sorted(r["prompt"] for r in recs) == sorted(HOSTILE * 2)  # each prompt a group of 2
    assert dom.count('class="group"') == len(HOSTILE) and dom.count('class="row"') == len(recs)
    for r in recs:
        assert f"<b>group {r['group']}: {html.escape(r['prompt'], quote=False)}</b>" in dom
        row = re.search(rf'<div class="row" data-row="{r["row"]}">(.*?)</div>', dom, re.S).group(1)
        texts = re.findall(r'<span [^>]*data-i=[^>]*>([^<]*)</span>', row)
        assert texts == [html.escape(t["text"], quote=False) for t in r["tokens"]]
    moves = re.search(r'<table id="moves">(.*?)</table>', dom, re.S).group(1)
    prompts = re.findall(r"<tr><td>(.*?)</td><td>[\d.]+</td><td>[\d.]+</td></tr>", moves, re.S)
    assert sorted(prompts) == sorted(html.escape(p, quote=False) for p in HOSTILE)  # both steps, each prompt
    assert f"<title>nanorl rollouts: {html.escape(str(hostile_run))}</title>" in dom
    assert "<img" not in elements(dom)


def test_hostile_prompts_reach_the_terminal_as_text(hostile_run, capsys):
    r = subprocess.run([sys.executable, "-m", "nanorl.view", str(hostile_run), "--no_color"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count(" group ") == 2 * len(HOSTILE), r.stderr
    assert all(repr(p) in r.stdout for p in HOSTILE) and not RAW & set(r.stdout)  # '\x1b]0;pwned\x07'
    view.show(view.read(hostile_run / "rollouts" / "step_000001.jsonl"), color=True)
    coloured = capsys.readouterr().out
    for code in (view.DIM, view.GREEN, view.RED, view.UNDER, view.END):
        coloured = coloured.replace(code, "")
    assert coloured.count(" group ") == len(HOSTILE) and not RAW & set(coloured)
