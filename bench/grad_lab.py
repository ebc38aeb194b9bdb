"""
The gradient lab: how close does each policy-gradient loss's update come to the exact gradient?

With the `exact` verifier and the char tokenizer exactly one response earns reward 1, the gold answer
y*(x) followed by EOS, so the expected reward of the sampling policy pi_T (temperature T) is
    J(theta) = mean over prompts x of pi_T(y* | x)
and grad J is one teacher-forced forward and backward over the gold answers: exact, no estimator.
For every policy-gradient loss the lab draws K rollout batches (P prompts x G samples, P*G fixed,
at the same theta, with rl.py's collect, dynamic sampling as the loss runs it) and takes each batch's
update direction g_k = -grad loss at ratio 1 (rl.py's advantages, the loss of losses.ALGOS). It
reports the cosine of the mean direction with grad J, the same corrected for finite K, the mean
per-batch cosine (what one step gets) and the relative variance E|g_k - g_bar|^2 / |g_bar|^2, each
with a jackknife standard error over batches; then sweeps G at fixed P*G. Cosines use the policy's
parameters (not PPO's value head). Batch k uses the same prompts and samples for every loss.

    python bench/grad_lab.py                      # default SFT checkpoint: ~9 min on 2 CPU cores
    python bench/grad_lab.py --ckpt=out/rl-ppo/ckpt.pt --ref_ckpt=out/sft-mul/ckpt.pt

Writes out_dir/grad_lab.md and, with matplotlib, grad_lab.png.
"""
import os
import sys
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import losses as L  # noqa: E402
import rl  # noqa: E402
from nanorl.config import UserError, print_config, run_cli  # noqa: E402
from nanorl.rows import pack  # noqa: E402
from nanorl.rows import encode_prompts, gold_rows  # noqa: E402
from model import logprobs, seeded  # noqa: E402
from tokenizer import CharTokenizer  # noqa: E402
from verify import overlong_penalty  # noqa: E402


@dataclass
class Config:
    ckpt: str = "out/sft-mul/ckpt.pt"
    ref_ckpt: str = ""  # the KL terms' reference; "" = ckpt itself (then beta's gradient is 0)
    prompts: int = 256  # train prompts (a seeded choice): J and grad J average over them
    samples: int = 1024  # P x G rows per rollout batch
    group_size: int = 16
    batches: int = 32  # K
    losses: str = ""  # comma-separated policy-gradient losses; "" = all
    group_sizes: str = "2,4,8,16,64"  # the sweep, at P x G = samples
    sweep_losses: str = "grpo"  # measured without dynamic sampling, beside REINFORCE
    temperature: float = 1.0
    max_new_tokens: int = 8
    seed: int = 1337
    threads: int = 0
    out_dir: str = "out/grad_lab"


def policy_params(model):
    """The parameters grad J lives in: all but the scalar (value) head."""
    return [p for n, p in model.named_parameters() if not n.startswith("score_head")]


def flat(grads, params):
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def exact_objective(model, tok, problems, reverse, temperature=1.0):
    """(J, grad J (D,)): J = mean over problems of pi_T(gold answer + EOS | prompt), teacher-forced."""
    ids, offsets, mask = pack(gold_rows(tok, problems, reverse), tok.pad_id, left=True)  # (N, P+L), (N,), (N, L)
    J = logprobs(model, ids, offsets, mask, temperature)[0].sum(1).exp().mean()  # 0 off the mask
    params = policy_params(model)
    return J.item(), flat(torch.autograd.grad(J, params), params)


def rollout_batch(model, task, cfg, G, k, dyn):
    """Batch k at group size G: cfg.samples // G prompts (of task.train) in a fresh seeded order, G
    samples each; with dyn, rl.py's dynamic sampling (all-equal groups dropped, refilled). The same k
    gives the same first round with and without dyn. None if no group has signal."""
    rc = rl.Config(group_size=G, prompts_per_step=cfg.samples // G, overlong_window=0, dynamic_sampling=dyn,
                   temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    run = rl.Run(model, model, None, None, task, rl.PromptSampler(len(task.train), ("lab", cfg.seed, G, k), False), {},
                 prompt_ids=encode_prompts(task.tok, [p for p, _ in task.train], task.reverse))
    return rl.collect(rc, L.ALGOS["grpo"], run, seeded("cpu", "lab", cfg.seed, G, k))[0]


def directions(model, ref, batch, specs, cfg, G):
    """{spec name: -grad of its loss (D,)} on one rollout batch, at ratio 1 (on-policy), and the
    mean reward each loss saw. spec: (name, loss, hp, dyn); one forward, a backward per spec."""
    T, params, mask = cfg.temperature, policy_params(model), batch.mask  # mask (N, L)
    rc = rl.Config(group_size=G, temperature=T)
    lp, head, _ = logprobs(model, batch.ids, batch.offsets, mask, T, scalar=True)  # with grad
    values = L.prefix_value(head, lp)  # (N, L) PPO's V
    ref_logp = None
    if any(s[2].get("beta") for s in specs):  # theta = ref: the policy's own log-probs, no forward
        ref_logp = lp.detach() if ref is model else logprobs(ref, batch.ids, batch.offsets, mask, T, max_rows=256)[0]
    old_values = torch.where(mask.bool(), values.detach(), 0.0)  # (N, L) PPO's V_old
    out, reward = {}, {}
    for name, loss, hp, _ in specs:
        b, row = replace(batch, values=old_values), L.ALGOS[loss]
        if row.overlong:  # DAPO's overlong shaping joins its reward
            pen = [overlong_penalty(int(n), cfg.max_new_tokens, row.overlong) for n in batch.length]
            b.reward = batch.score + torch.tensor(pen)
        b.ref_logp = ref_logp
        adv, extra = rl.advantages_of(row, hp)(replace(rc, loss=loss), row, SimpleNamespace(hp=hp, ranks=rl.OneProcess()), b)
        kw = dict(values=values) if "values" in row.needs else {}
        obj, _ = L.algo_loss(row, hp, lp, batch.mu, adv, mask, ref_logp, **extra, **kw)
        out[name] = flat(torch.autograd.grad(-obj, params, retain_graph=True, allow_unused=True), params)
        reward[name] = b.reward.mean().item()
    return out, reward


def summarize(gram, dots, norm):
    """Statistics of K directions from their Gram matrix (K, K) and their dot products with grad J
    (K,) of norm `norm`: cos(g_bar, grad J); cos_inf, the same with |g_bar|^2 replaced by its
    unbiased estimate of |E g|^2 (the mean over pairs j != k of g_j . g_k), so an estimator unbiased
    in direction scores 1 at any K; the mean per-batch cosine; rel_var = E|g_k - g_bar|^2 / |g_bar|^2."""
    K = len(dots)
    sq = gram.sum() / K ** 2  # |g_bar|^2
    pairs = (gram.sum() - gram.diag().sum()) / (K * (K - 1))
    var = (gram.diag().mean() - sq) * K / (K - 1)
    return {"cos_mean": dots.mean() / (norm * sq.sqrt()), "cos_inf": dots.mean() / (norm * pairs.sqrt()),
            "cos_batch": (dots / (norm * gram.diag().sqrt())).mean(), "rel_var": var / sq}


def jackknife(gram, dots, norm):
    """{stat: (value, its K leave-one-out values)} of summarize."""
    K, full = len(dots), summarize(gram, dots, norm)
    keeps = (torch.arange(K) != i for i in range(K))  # leave batch i out
    drops = [summarize(gram[keep][:, keep], dots[keep], norm) for keep in keeps]
    return {s: (v, torch.stack([d[s] for d in drops])) for s, v in full.items()}


def with_se(value, drops):
    """(value, jackknife standard error) from the leave-one-out values (K,)."""
    K = len(drops)
    return value.item(), ((K - 1) / K * ((drops - drops.mean()) ** 2).sum()).sqrt().item()


def measure(model, ref, task, cfg, specs, G, grad_j):
    """{spec name: {stat: (value, SE)}, "reward", "K", and "d_" + stat: the paired difference to
    REINFORCE on the same batches (dynamic sampling or not, as the spec)} over cfg.batches batches."""
    vecs, rewards = {s[0]: [] for s in specs}, {s[0]: [] for s in specs}
    for k in range(cfg.batches):
        for dyn in sorted({s[3] for s in specs}):
            batch = rollout_batch(model, task, cfg, G, k, dyn)
            mine = [s for s in specs if s[3] == dyn]
            d, r = directions(model, ref, batch, mine, cfg, G) if batch is not None else ({}, {})
            for name in d:
                vecs[name].append(d[name])
                rewards[name].append(r[name])
    jk = {}
    for name, vs in vecs.items():
        V = torch.stack(vs).double()  # (K, D)
        jk[name] = jackknife(V @ V.T, V @ grad_j.double(), grad_j.double().norm())
    out = {}
    for name, dyn in ((s[0], s[3]) for s in specs):
        out[name] = {**{s: with_se(*v) for s, v in jk[name].items()}, "K": len(vecs[name]),
                     "reward": sum(rewards[name]) / len(rewards[name])}
        base_name = "reinforce" if dyn else "reinforce, no dyn"
        base = jk.get(base_name)
        if base is not None and len(vecs[name]) == len(vecs[base_name]):
            out[name].update({"d_" + s: with_se(v - base[s][0], d - base[s][1])
                              for s, (v, d) in jk[name].items()})
    return out


def specs_of(names, sweep_names, ref_differs, max_new_tokens):
    """(name, loss, hp, dynamic sampling) rows: every loss at its defaults (as rl.py runs it, with
    dynamic sampling); the sweep's losses without it (every batch then holds exactly P x G samples;
    REINFORCE is unbiased in direction there by construction); and, when the reference differs from
    the policy, the beta > 0 losses again at beta = 0 (at theta = ref their KL has zero gradient)."""
    specs = []
    for n in names:
        hp = L.resolve_hparams(n, **({"max_new_tokens": max_new_tokens} if n == "dr_grpo" else {}))
        specs.append((n, n, hp, True))
        if hp.get("beta") and ref_differs:
            specs.append((f"{n}, beta 0", n, {**hp, "beta": 0.0}, True))
    specs += [(f"{n}, no dyn", n, L.resolve_hparams(n), False) for n in ["reinforce", *sweep_names]]
    return list({s[0]: s for s in specs}.values())  # reinforce once


def cell(s, sign=""):
    return f"{s[0]:{sign}.3f} ± {s[1]:.3f}" if s else "—"


def plot(main, sweep, path):
    """grad_lab.png: per-batch cosine of each loss, and against G; False without matplotlib."""
    try:
        import matplotlib.figure
    except ImportError:
        return False
    fig = matplotlib.figure.Figure(figsize=(12, 4.5), layout="tight")
    a, b = fig.subplots(1, 2)
    names = list(main)
    a.errorbar([main[n]["cos_batch"][0] for n in names], range(len(names)), fmt="o",
               xerr=[main[n]["cos_batch"][1] for n in names])
    a.set(yticks=range(len(names)), yticklabels=names, xlabel="mean per-batch cosine with grad J")
    for loss in {n for _, n in sweep}:
        Gs = sorted(G for G, n in sweep if n == loss)
        b.errorbar(Gs, [sweep[G, loss]["cos_batch"][0] for G in Gs], fmt=".-", label=loss,
                   yerr=[sweep[G, loss]["cos_batch"][1] for G in Gs])
    b.set(xscale="log", xlabel="group size G (P x G fixed)", ylabel="mean per-batch cosine")
    b.legend()
    fig.savefig(path, dpi=72)
    return True


def main(cfg):
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    pg = [n for n, a in L.ALGOS.items() if a.family == "pg" and "teacher" not in a.needs]  # opd, gkd follow a teacher, not J
    names = [n.strip() for n in cfg.losses.split(",") if n.strip()] or pg
    sweep_names = [n.strip() for n in cfg.sweep_losses.split(",") if n.strip()]
    Gs = [int(g) for g in cfg.group_sizes.split(",") if g.strip()]
    bad = [n for n in names + sweep_names if n not in pg]
    if bad:
        raise UserError(f"unknown policy-gradient loss {bad[0]!r}; valid: {', '.join(pg)}")
    if min(Gs + [cfg.group_size]) < 2 or any(cfg.samples % G for G in Gs + [cfg.group_size]):
        raise UserError(f"group sizes must be >= 2 and divide samples={cfg.samples}")
    if cfg.batches < 3 or cfg.prompts < 1:
        raise UserError("batches must be >= 3 (a jackknife needs them) and prompts >= 1")
    dev = torch.device("cpu")
    model, task = rl.load_policy(cfg.ckpt, True, dev)  # a value head for ppo
    tok, vname = task.tok, task.verifier_name
    if vname != "exact" or not isinstance(tok, CharTokenizer):
        raise UserError(f"{cfg.ckpt}: the gradient lab needs the exact verifier and the char tokenizer "
                        f"(then J is the probability of one sequence); it has verifier {vname!r} and a "
                        f"{type(tok).__name__}")
    ref = model
    if cfg.ref_ckpt:
        ref = rl.load_policy(cfg.ref_ckpt, True, dev)[0].requires_grad_(False)
    print_config(cfg)
    pick = torch.randperm(len(task.train), generator=seeded("cpu", "lab_prompts", cfg.seed))[:cfg.prompts]
    task.train = problems = [task.train[i] for i in pick.tolist()]
    J, grad_j = exact_objective(model, tok, problems, task.reverse, cfg.temperature)
    print(f"J = {J:.4f}, |grad J| = {grad_j.norm():.4f} over {len(problems)} train prompts", flush=True)
    t0, specs = time.time(), specs_of(names, sweep_names, bool(cfg.ref_ckpt), cfg.max_new_tokens)
    main_rows = measure(model, ref, task, cfg, specs, cfg.group_size, grad_j)
    print(f"main table: {time.time() - t0:.0f}s", flush=True)
    sweep = {}
    for G in Gs:
        mine = [s for s in specs if not s[3]]
        rows = main_rows if G == cfg.group_size else measure(model, ref, task, cfg, mine, G, grad_j)
        sweep.update({(G, s[0]): rows[s[0]] for s in mine})
        print(f"G={G}: {time.time() - t0:.0f}s", flush=True)
    write(cfg, J, grad_j, main_rows, sweep, time.time() - t0)
    return {"J": J, "main": main_rows, "sweep": sweep}


def write(cfg, J, grad_j, main_rows, sweep, seconds):
    """grad_lab.md (the two tables) and grad_lab.png in out_dir."""
    os.makedirs(cfg.out_dir, exist_ok=True)
    mc = main_rows["reinforce, no dyn"]["reward"]
    md = ["# Gradient lab", "", " ".join(["    python bench/grad_lab.py", *sys.argv[1:]]), "",
          f"- checkpoint {cfg.ckpt}, reference {cfg.ref_ckpt or 'the same'}; {cfg.prompts} train prompts, "
          f"K = {cfg.batches} batches of P x G = {cfg.samples} samples, temperature {cfg.temperature}; "
          f"{seconds:.0f} s",
          f"- exact J = {J:.4f} (Monte-Carlo: the mean reward of the batches without dynamic sampling, "
          f"{mc:.4f}); "
          f"|grad J| = {grad_j.norm():.4f}",
          "- ± a jackknife standard error over batches; Δ: the paired difference to REINFORCE on the same "
          "batches (the same samples; with dynamic sampling or without, as the row)", "",
          f"## Every loss at G = {cfg.group_size}", "",
          "| loss | reward | cos(g_bar, grad J) | cos_inf | Δ cos_inf | per-batch cos | Δ per-batch cos "
          "| rel. variance |", "|---" * 8 + "|"]
    md += [f"| {n} | {r['reward']:.3f} | {cell(r['cos_mean'])} | {cell(r['cos_inf'])} | "
           f"{cell(r.get('d_cos_inf'), '+')} | {cell(r['cos_batch'])} | {cell(r.get('d_cos_batch'), '+')} | "
           f"{cell(r['rel_var'])} |" for n, r in main_rows.items()]
    md += ["", f"## Group size at P x G = {cfg.samples}, without dynamic sampling", "",
           "| G | P | loss | per-batch cos | Δ per-batch cos | cos_inf | rel. variance |", "|---" * 7 + "|"]
    md += [f"| {G} | {cfg.samples // G} | {n} | {cell(r['cos_batch'])} | {cell(r.get('d_cos_batch'), '+')} | "
           f"{cell(r['cos_inf'])} | {cell(r['rel_var'])} |" for (G, n), r in sweep.items()]
    drew = plot(main_rows, sweep, os.path.join(cfg.out_dir, "grad_lab.png"))
    md += ["", "![per-batch cosines](grad_lab.png)" if drew else "(no plot: matplotlib is not installed)"]
    path = os.path.join(cfg.out_dir, "grad_lab.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(path + ".tmp", path)
    print("\n".join(md[4:]) + f"\nwrote {path}", flush=True)


if __name__ == "__main__":
    run_cli(main, Config)
