"""Read a run's rollout log (nanorl/rollout_log.py): in the terminal, or as one static page.

    python -m nanorl.view out/rl-grpo                  # every logged step
    python -m nanorl.view out/rl-grpo --step=25 --no_color
    python -m nanorl.view out/rl-grpo --html=rollouts.html

A step's groups with their rewards; each row's response token by token, coloured by who wrote it
(the environment's tokens dim) and the policy's by the sign of their advantage (green +, red -);
a surprising token (mu below log 0.05, or |log pi_old - log mu| above 1) is underlined (and, in
the terminal, listed under its row). The page (no server, no network: its data, style and script
are inside it) has a step to pick, the step's groups side by side, each token's log-probs, ratio
pi_old / mu and advantage on hover, and a column of each prompt's mean group reward at every
logged step. A URL ending #hover=ROW,TOKEN opens with that token hovered.

Where the task reverses digits (sft.py's --reverse: the model reads and writes numbers
least-significant digit first, 486 as 684), the prompt and tokens stay in the model's order, each
prompt and response follows in brackets as a person reads it, and a note a step says so.

The log's text is shown as text, whatever it holds. The terminal prints control characters as
escapes (ESC as \\x1b, U+2028 as \\u2028, a newline as \\n): a prompt cannot set the title or
clear the screen. The page writes the log only as text, escapes its script's data so that no
prompt (`</script>`, `<!--<script>`) ends or hides the script, and keys its tables by prompt
without a prototype (a prompt `__proto__` is one more row). Piped into `head`, the viewer stops
quietly when the reader has gone.
"""
import argparse
import glob
import html
import json
import math
import os
import sys

DIM, GREEN, RED, UNDER, END = "\033[2m", "\033[32m", "\033[31m", "\033[4m", "\033[0m"
SURPRISE_MU, SURPRISE_GAP = math.log(0.05), 1.0
DIGITS = ("digits least-significant first, as the model reads and writes them; in brackets as a "
          "person reads them")  # said once a step, where the task reverses them


def surprising(tok):
    gap = abs(tok["old"] - tok["mu"])
    return tok["role"] == "policy" and (tok["mu"] < SURPRISE_MU or gap > SURPRISE_GAP)


def printable(text):
    """Text from the log as the terminal prints it: a newline as \\n and every other character a
    terminal could act on (ESC, BEL, CR, U+2028, ...) as its Python escape (\\x1b, \\u2028), so
    a run's prompts and tokens never set the window's title, move the cursor or clear the screen."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def paint(tok, color):
    """One token as the terminal shows it: its text printable(), then the viewer's own colours."""
    text = printable(tok["text"])
    if not color:
        return f"[{text}]" if tok["role"] == "env" else text
    adv = tok["adv"]
    style = DIM if tok["role"] == "env" else GREEN if adv > 0 else RED if adv < 0 else ""
    return style + (UNDER if surprising(tok) else "") + text + END


def read(file):
    """A step's JSONL -> its records, or one line naming the file."""
    try:
        with open(file) as f:
            return [json.loads(line) for line in f]
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: {file}: not a whole rollout log ({type(e).__name__})") from None


def show(records, color=True):
    """A step's records, group by group. Every line from the log passes printable() (its prompts
    already as repr), so only the viewer's colours reach the terminal."""
    groups = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    if any(r.get("reversed") for r in records):  # a log written before the key: not reversed
        print(printable(f"step {records[0]['step']}: {DIGITS}"))
    for g, rows in groups.items():
        rewards = " ".join(f"{r['reward']:.2f}" for r in rows)
        first = rows[0]
        normal = f" ({first['prompt_normal']!r})" if first.get("reversed") else ""
        print(printable(f"step {first['step']} (version {first['version']}) group {g}: "
                    f"{first['prompt']!r}{normal}  rewards {rewards}"))
        for r in rows:
            turns = "" if r["turns"] is None else f" turns {r['turns']}"
            cut = " truncated" if r["truncated"] else ""
            head = printable(f"  reward {r['reward']:+.3f} score {r['score']:.2f}{turns}{cut} | ")
            line = "".join(paint(t, color) for t in r["tokens"])
            if r.get("reversed"):
                line += printable(f" ({r['response_normal']!r})")
            print(head + line)
            for t in (t for t in r["tokens"] if surprising(t)):
                print(printable(f"      surprising {t['text']!r}: mu {t['mu']:.2f} "
                            f"pi_old {t['old']:.2f} adv {t['adv']:+.3f}"))


PAGE = r"""<!doctype html><html><head><meta charset="utf-8">
<title>nanorl rollouts: TITLE</title><style>
body{font:13px monospace;margin:12px;background:#fff;color:#222}#main{display:flex;gap:16px}
#groups{display:flex;gap:12px;flex:1;overflow-x:auto}
.group{border:1px solid #ccc;padding:6px;min-width:220px}
.row{margin:3px 0;white-space:pre-wrap}.meta{color:#666}.t{padding:0 1px}
.env{color:#999;font-style:italic}.surprise{text-decoration:underline wavy #c60}
#tip{position:fixed;display:none;background:#ffd;border:1px solid #aa8;padding:4px;white-space:pre}
#moves td{padding:1px 6px;border-bottom:1px solid #eee}#moves{border-collapse:collapse}
</style></head><body><h3>TITLE</h3>step <select id="step"></select>
<div id="digits" class="meta" hidden>DIGITS</div>
<div id="main"><div id="groups"></div><table id="moves"></table></div><div id="tip"></div><script>
const LOG = DATA;
const f = x => x === null || x === undefined ? "-" : x.toFixed(3);
// Tables keyed by the log's text have no prototype: in a plain {}, by["__proto__"] would be
// Object.prototype, and what went in there would show up in every object of the page
const table = () => Object.create(null);
// a prompt as the model reads it and, where its digits are reversed, as a person does
const prompt = r => r.reversed ? r.prompt + " (" + r.prompt_normal + ")" : r.prompt;
function draw(step) {
  const g = document.getElementById("groups"); g.innerHTML = "";
  const groups = table();
  document.getElementById("digits").hidden = !LOG[step].some(r => r.reversed);
  LOG[step].forEach(r => (groups[r.group] = groups[r.group] || []).push(r));
  Object.values(groups).forEach(rows => {
    const d = document.createElement("div"); d.className = "group";
    d.innerHTML = "<b></b><div class=meta></div>";
    d.querySelector("b").textContent = "group " + rows[0].group + ": " + prompt(rows[0]);
    d.querySelector(".meta").textContent =
      "rewards " + rows.map(r => r.reward.toFixed(2)).join(" ");
    rows.forEach(r => {
      const e = document.createElement("div"); e.className = "row"; e.dataset.row = r.row;
      e.innerHTML =
        "<span class=meta>" + r.reward.toFixed(2) + (r.truncated ? " cut" : "") + " | </span>";
      r.tokens.forEach((t, i) => {
        const s = document.createElement("span"); s.textContent = t.text; s.dataset.i = i;
        const a = Math.min(0.8, 0.15 + Math.abs(t.adv));
        const sign = t.role !== "policy" ? "" : t.adv > 0 ? " pos" : t.adv < 0 ? " neg" : "";
        s.className = "t " + t.role + sign + (t.surprise ? " surprise" : "");
        const rgb = t.adv > 0 ? "40,160,60" : "210,50,50";
        if (sign) s.style.background = "rgba(" + rgb + "," + a + ")";
        s.onmouseover = ev => tip(t, ev.clientX, ev.clientY); s.onmouseout = () => tip(null);
        e.appendChild(s);
      });
      if (r.reversed) {  // the response as a person reads it
        const n = document.createElement("span"); n.className = "meta";
        n.textContent = " (" + r.response_normal + ")"; e.appendChild(n);
      }
      d.appendChild(e);
    });
    g.appendChild(d);
  });
}
function tip(t, x, y) {
  const el = document.getElementById("tip");
  if (!t) { el.style.display = "none"; return; }
  el.textContent = JSON.stringify(t.text) + " (" + t.role + ")" +
    "\nmu " + f(t.mu) + "  pi_old " + f(t.old) + "  ref " + f(t.ref) +
    "\nratio pi_old/mu " + f(Math.exp(t.old - t.mu)) +
    "\nadvantage " + f(t.adv) + "  turn reward " + f(t.turn_reward) +
    (t.version === undefined ? "" : "\nversion " + t.version);
  el.style.left = (x + 12) + "px"; el.style.top = (y + 12) + "px"; el.style.display = "block";
}
function moves() {
  const steps = Object.keys(LOG), by = table();  // prompt -> step -> its rows' rewards
  steps.forEach(s => LOG[s].forEach(r => {
    const k = prompt(r), m = (by[k] = by[k] || table()); (m[s] = m[s] || []).push(r.reward); }));
  const mean = v => v ? (v.reduce((a, b) => a + b, 0) / v.length).toFixed(2) : "";
  const cells = (tag, f) => steps.map(s => `<${tag}>${f(s)}</${tag}>`).join("");
  let h = "<tr><th>prompt: mean group reward</th>" + cells("th", s => s) + "</tr>";
  Object.values(by).forEach(m => {
    h += "<tr><td></td>" + cells("td", s => mean(m[s])) + "</tr>";
  });
  const tab = document.getElementById("moves"); tab.innerHTML = h;
  Object.keys(by).forEach((p, i) => tab.rows[i + 1].cells[0].textContent = p);
}
const sel = document.getElementById("step");
Object.keys(LOG).forEach(s => sel.add(new Option("step " + s, s)));
sel.onchange = () => draw(sel.value); if (sel.options.length) draw(sel.value); moves();
const h = location.hash.match(/hover=(\d+),(\d+)/);
if (h) {
  const s = document.querySelector(`.row[data-row="${h[1]}"] .t[data-i="${h[2]}"]`);
  const r = s.getBoundingClientRect();
  s.dispatchEvent(new MouseEvent("mouseover", {clientX: r.x, clientY: r.y}));
}
</script></body></html>"""


# The HTML parser reads the script before JavaScript does: "</script>" in the log would end it
# and "<!--<script>" would hide its real end. Written as \u escapes (the same strings to
# JavaScript), no text of the log can be markup; so are U+2028/9 (line ends to older JavaScript).
SCRIPT_SAFE = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}


def page(logs, title):
    """{step: records} -> one self-contained HTML page; each token marked surprising or not by
    surprising(), the terminal's rule. The log goes in last, so no text of it is read as a
    placeholder."""
    logs = {str(s): [{**r, "tokens": [{**t, "surprise": surprising(t)} for t in r["tokens"]]}
                     for r in recs] for s, recs in sorted(logs.items())}
    head, tail = PAGE.split("DATA", 1)
    data = json.dumps(logs).translate(SCRIPT_SAFE)
    head = head.replace("TITLE", html.escape(title)).replace("DIGITS", html.escape(DIGITS))
    return head + data + tail


def step_of(file):
    """out_dir/rollouts/step_000025.jsonl -> 25."""
    return int(os.path.basename(file)[5:11])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", help="a run's out_dir (or its rollouts/ folder)")
    p.add_argument("--step", type=int, default=0, help="only this step (0: every logged step)")
    p.add_argument("--no_color", action="store_true")
    p.add_argument("--html", default="", help="write the log as one static page to this file")
    a = p.parse_args(argv)
    folder = a.out_dir if os.path.basename(a.out_dir.rstrip("/")) == "rollouts" else \
        os.path.join(a.out_dir, "rollouts")
    if not os.path.isdir(a.out_dir):
        raise SystemExit(f"error: no folder {a.out_dir} (a run's out_dir)")
    files = sorted(glob.glob(os.path.join(folder, "step_*.jsonl")))
    if a.step:
        files = [f for f in files if f.endswith(f"step_{a.step:06d}.jsonl")]
    if not files:
        print(f"no step logged in {folder}" + (f" at step {a.step}" if a.step else "") +
              " (rl.py logs every --log_every steps, 25: a shorter run, none; --log_every=1 "
              "logs each)")
    if a.html:
        with open(a.html, "w") as f:
            f.write(page({step_of(f): read(f) for f in files}, a.out_dir))
        print(f"wrote {a.html}: {len(files)} steps")
        return
    for f in files:
        records = read(f)
        if not records:  # a log of every step holds the steps without an update too
            print(f"step {step_of(f)}: no update, no rows")
        show(records, color=not a.no_color and sys.stdout.isatty())


if __name__ == "__main__":
    try:
        main()
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not in the exit's own flush
    except BrokenPipeError:  # the Python docs' recipe (signal): stop quietly, output to nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
