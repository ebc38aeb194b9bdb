"""The rollout viewer's page in a real browser (Debian's headless chromium; .ci/run installs it): the
rows and groups a person sees, the colours by role and advantage, and a hovered token's values."""
import os
import re
import shutil
import subprocess

import pytest

from nanorl import view

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium (apt-get install -y chromium)")


def tok(text, role, adv, mu=-0.1, old=-0.1, ref=None, turn_reward=0.0):
    return dict(text=text, role=role, adv=adv, mu=mu, old=old, ref=ref, turn_reward=turn_reward)


def record(step, group, row, reward, tokens, prompt="1-100:"):
    return dict(step=step, version=step - 1, group=group, row=row, prompt=prompt, response="".join(t["text"] for t in tokens),
                score=reward, reward=reward, turns=1, truncated=False, tokens=tokens)


LOG = {3: [record(3, 0, 0, 1.0, [tok("5", "policy", 0.7), tok("0", "policy", 0.7), tok("|", "policy", 0.7),
                                 tok("=", "env", 0.7)]),
           record(3, 0, 1, 0.0, [tok("9", "policy", -0.7, mu=-4.0, old=-2.5), tok("|", "policy", -0.7),
                                 tok("<", "env", -0.7)]),
           record(3, 1, 2, 0.5, [tok("4", "policy", 0.0)], prompt="1-50:")],
       8: [record(8, 0, 0, 1.0, [tok("5", "policy", 0.2), tok("0", "policy", 0.2)])]}


def browse(tmp_path, fragment="", shot=None):
    page = tmp_path / "rollouts.html"
    page.write_text(view.page(LOG, "test run"))
    args = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,600"]
    args += [f"--screenshot={shot}"] if shot else ["--dump-dom"]
    r = subprocess.run(args + [f"file://{page}{fragment}"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_page_shows_the_step_its_groups_rows_and_colours(tmp_path):
    dom = browse(tmp_path)
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


def test_hovering_a_token_shows_its_log_probs_ratio_and_advantage(tmp_path):
    dom = browse(tmp_path, "#hover=1,0")
    tip = re.search(r'<div id="tip" style="([^"]*)">([^<]*)</div>', dom)
    assert "display: block" in tip.group(1)
    assert tip.group(2).split("\n") == ['"9" (policy)', "mu -4.000  pi_old -2.500  ref -",
                                        "ratio pi_old/mu 4.482", "advantage -0.700  turn reward 0.000"]


def test_a_screenshot_is_a_picture(tmp_path):
    shot = tmp_path / "shot.png"
    browse(tmp_path, "#hover=1,0", shot=shot)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
