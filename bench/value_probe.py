"""
How much of PPO's return variance can a value head on the SFT trunk explain? (Not a test: a probe.)

    python bench/value_probe.py [--ckpt=out/sft-mul/ckpt.pt] [--prompts=1024] [--threads=0]

Samples G = 16 answers for each of `prompts` train prompts from the SFT policy (temperature 1, up to 8
new tokens), takes the trunk's final hidden state at every response position (what PPO's value head
reads) and the sequence's verifier reward as every position's return (gamma 1, no KL). Prints the
explained variance of: each prompt's mean return (a critic that knew each problem's difficulty), a
ridge-regression linear head, the same head times pi(y_<t | x), the policy's probability of the
tokens it sampled before each position (rl.py's PPO value), a 2-layer MLP head on the features, and a separate critic (a copy of
the whole SFT model with a zero-initialised head, every weight trained on the value loss, lr 3e-4, 300
steps of 64 prompts x 16 answers), each fitted on 3/4 of the prompts and reported on them and on the
other 1/4. About 2 minutes on 2 CPU cores.
"""
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanorl.evaluate import Task, score_samples  # noqa: E402
from nanorl.rows import encode_prompts  # noqa: E402
from losses import prefix_prob  # noqa: E402
from model import token_logps  # noqa: E402
from nanorl.evaluate import explained_variance  # noqa: E402
from nanorl.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from model import generate, response_forward  # noqa: E402
from model import adamw  # noqa: E402

args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
ckpt_path, n, G = args.get("ckpt", "out/sft-mul/ckpt.pt"), int(args.get("prompts", 1024)), 16
if int(args.get("threads", 0)):
    torch.set_num_threads(int(args["threads"]))
torch.manual_seed(0)
ckpt = load_checkpoint(ckpt_path)
model, tok = model_from_checkpoint(ckpt, ckpt_path, scalar_head=True)
model.eval()
task = Task.of(ckpt, ckpt_path, tok)
reverse = task.reverse
feats = {}
model.score_head.register_forward_hook(lambda mod, inp, out: feats.update(x=inp[0]))  # the head's input
train = task.train
gen = torch.Generator().manual_seed(1)
picked = [train[i] for i in torch.randperm(len(train), generator=gen)[:n].tolist()]
X, Y, pid, path, batches = [], [], [], [], []
with torch.no_grad():
    for c in range(0, n, 64):
        chunk = picked[c:c + 64]
        out = generate(model, encode_prompts(tok, [p for p, _ in chunk], reverse), 8, tok.eos_id, tok.pad_id, G=G,
                       temperature=1.0, generator=gen)
        R = torch.tensor([r for r, _ in score_samples(task, out, [p for p in chunk for _ in range(G)])])  # (N,)
        P = out["prompt_len"]
        m = out["response_mask"][:, P:].bool()  # (N, L)
        logits = response_forward(model, out["ids"], out["offsets"], P, m, return_scalar=True)[0]  # (N, L, V)
        path.append(prefix_prob(token_logps(logits, out["ids"][:, P:], m))[m].double())  # pi(y_<t | x)
        batches.append((out["ids"], out["offsets"], P, m, R.float()))
        X.append(feats["x"][:, P - 1:-1][m])  # (tokens, C) the state before each response token
        Y.append(R[:, None].expand_as(m)[m].double())
        pid.append((torch.arange(len(chunk)) + c).repeat_interleave(G)[:, None].expand_as(m)[m])
X, Y, pid, path = torch.cat(X).double(), torch.cat(Y), torch.cat(pid), torch.cat(path)
fit, held = pid < n * 3 // 4, pid >= n * 3 // 4


def ev(pred, s):
    return explained_variance(pred[s], Y[s], torch.ones_like(Y[s])).item()


mean = torch.zeros(n, dtype=torch.double).index_add_(0, pid, Y) / torch.bincount(pid, minlength=n).double()
print(f"{len(Y)} response tokens, accuracy {Y.mean():.3f}")
print(f"each prompt's mean return (a critic that knows the difficulty): {ev(mean[pid], slice(None)):.3f}")
for name, Z, bias in (("linear head", X, torch.ones_like(path)),
                      ("linear head x pi(y_<t | x), rl.py's PPO value", X * path[:, None], path)):  # bias: the head's, times pi
    Zb = torch.cat([Z, bias[:, None]], 1)
    w = torch.linalg.solve(Zb[fit].T @ Zb[fit] + 0.1 * torch.eye(Zb.shape[1], dtype=torch.double), Zb[fit].T @ Y[fit])
    print(f"{name} (ridge): fitted prompts {ev(Zb @ w, fit):.3f}, unseen prompts {ev(Zb @ w, held):.3f}")
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 256), torch.nn.GELU(), torch.nn.Linear(256, 1)).double()
opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
rows = fit.nonzero().squeeze(1)
for it in range(1, 2001):
    b = rows[torch.randint(len(rows), (512,))]
    loss = ((mlp(X[b]).squeeze(1) - Y[b]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 500 == 0:
        with torch.no_grad():
            pred = mlp(X).squeeze(1)
        print(f"MLP head, {it} steps: fitted prompts {ev(pred, fit):.3f}, unseen prompts {ev(pred, held):.3f}")

critic = model_from_checkpoint(ckpt, ckpt_path, scalar_head=True)[0]
torch.nn.init.zeros_(critic.score_head.weight)
opt = adamw(critic, 3e-4, 0.0)
fit_b, held_b = batches[:len(batches) * 3 // 4], batches[len(batches) * 3 // 4:]


def critic_ev(part):
    ys, ps = [], []
    with torch.no_grad():
        for ids, offsets, P, m, R in part:
            ys.append(R[:, None].expand_as(m)[m])
            ps.append(response_forward(critic, ids, offsets, P, m, return_scalar=True)[1][m])
    y = torch.cat(ys)
    return explained_variance(torch.cat(ps), y, torch.ones_like(y)).item()


for it in range(1, 301):
    ids, offsets, P, m, R = fit_b[torch.randint(len(fit_b), (1,), generator=gen).item()]
    v = response_forward(critic, ids, offsets, P, m, return_scalar=True)[1]  # (N, L)
    loss = ((v - R[:, None]) ** 2)[m].mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 100 == 0:
        print(f"separate critic, {it} steps: fitted prompts {critic_ev(fit_b):.3f}, unseen prompts {critic_ev(held_b):.3f}")
