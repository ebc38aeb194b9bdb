"""Real async RL, opened by --async_rollouts: a sampler process makes rollouts while the trainer
updates, with policy versions, pacing and (--inflight) weight updates in flight.

    python rl.py --loss=grpo --staleness=1 --async_rollouts=true --decoupled=true
    python rl.py --loss=grpo --staleness=2 --async_rollouts=true --inflight=true --rollout_is=tis

(Stale tokens want a correction: without one, one step of staleness collapses the guess game;
bench/README.md.)

The trainer (rl.py's process) and a sampler (spawned here, one per torchrun rank) each hold the
policy. The weights after step s are version s; at step s, with k = --staleness >= 1:

    trainer:  update on rollout s-k, queued  | publish version s | take rollout s, queue it
    sampler:  [ rollout s, sampled by version s-1 ...............]  wait for version s

Pacing: rollout s waits for version s-1 rather than sampling ahead with an older one, so each
token trained on is at most k versions old and no rollout is thrown away for its age. The
sampler runs rl.py's own rollout code (environments, tools, the reward model, dynamic sampling
and refills) with the simulated --staleness=k's weights, generator and prompt sampler at every
rollout, so the two give bit-identical weights where the update draws no random number
(minibatches=1, not Clip-/KL-Cov: the async update draws from a fresh generator).
--inflight: before each decode step the sampler loads the newest version published and keeps
its KV cache, so a row's later tokens carry a newer version (Rollout.version, each token's)
and mu is what the sampler computed: the new weights over keys and values the old ones wrote
(docs/guides.md#async-rl). pi_old is the trainer's (offpolicy.recompute), so --rollout_is and
--decoupled weigh each token by its own mu. A resume re-samples the rollout in flight.

Both pipes carry torch.save's bytes, so either process may die mid-message and the other reads
its end. The sampler says when it is set up (--async_timeout then times each rollout, not its
start), and ignores SIGINT and SIGTERM: the trainer finishes its step, saves and stops it.
"""
import contextlib
import io
import itertools
import os
import queue
import signal
import threading
import time
import weakref
from dataclasses import asdict

import torch
import torch.multiprocessing as mp

import losses
from model import generate, seeded
from nanorl import rows
from nanorl.config import UserError
from nanorl.ddp import all_reduce, mean_over_ranks


def check(cfg):
    """--async_rollouts and --inflight against the run: one line where they do not fit (an algorithm
    without an importance ratio is refused by --staleness, which async needs)."""
    if not cfg.async_rollouts:
        raise UserError("--inflight updates the async sampler's weights: it needs "
                        "--async_rollouts=true")
    if cfg.staleness < 1:
        raise UserError("--async_rollouts needs --staleness >= 1: the versions a rollout may lag "
                        "its update (1 overlaps sampling with the whole update)")
    if cfg.async_timeout <= 0:
        raise UserError(f"async_timeout must be > 0, got {cfg.async_timeout}")


class Pipeline:
    """The trainer's end of the pipeline, rl.py's step function when --async_rollouts is on."""

    def __init__(self, cfg, run, rank, world, setup, collect, step):
        check(cfg)
        self.step, self.timeout = step, cfg.async_timeout  # step: rl.py's, given each rollout
        threads = torch.get_num_threads()  # the sync run's, shared: the sampler takes half
        torch.set_num_threads(max(1, threads - threads // 2))
        dev = next(run.model.parameters()).device
        ctx = mp.get_context("spawn")  # a fresh interpreter: safe with CUDA and OpenMP
        weights, ours = ctx.Pipe(duplex=False)  # (the sampler's end, ours) each
        self.rollouts, rollouts = ctx.Pipe(duplex=False)
        state = {"sampler": run.prompts.state_dict(), "rm": run.rm and run.rm.state_dict()}
        self.proc = ctx.Process(target=serve, name=f"nanorl-sampler-{rank}", daemon=True, args=(
            asdict(cfg), type(cfg), run.hp, str(sampler_device(dev, rank, world)), rank, world,
            run.state.step + 1, state, max(1, threads // 2), setup, collect, weights, rollouts,
            os.getpid()))
        self.proc.start()
        weights.close(), rollouts.close()  # the sampler's ends: its death reads as EOF here
        self.weights = Sender(ours)
        weakref.finalize(self, stop, self.proc, self.weights)  # at any exit of the trainer
        self.publish(run, run.state.step)
        self.receive(run.state.step, "its start")  # set up: a slow start is not a hung rollout

    def __call__(self, cfg, algo, run, lr, gen):
        """Step s: update on rollout s-k while the sampler makes rollout s -> the stats."""
        t0, s = time.time(), run.state.step + 1
        full = len(run.queue) == cfg.staleness  # rollout s-k is queued: this step updates
        batch, sampled = run.queue.popleft() if full else (None, {})
        lag = version_lag(batch, s - 1) if full else {}
        stats = self.step(cfg, algo, run, lr, gen, (batch, sampled))
        self.publish(run, s)
        t1 = time.time()
        msg = self.receive(s)
        waited = time.time() - t1
        dev = next(run.model.parameters()).device
        run.queue.append((rows.from_dict(msg["batch"], dev), msg["stats"]))
        run.prompts.load_state_dict(msg["sampler"])  # as of rollout s: what a checkpoint holds
        if run.rm:
            run.rm.load_state_dict(msg["rm"])
        perf = {"perf/trainer_idle_frac": waited / (time.time() - t0),
                "perf/sampler_idle_frac": msg["idle_frac"]}
        return {**stats, **mean_over_ranks({**msg["stats"], **perf}), **lag}  # rollout s's

    def publish(self, run, version):
        """The policy's weights as version `version`, copied: the trainer goes on updating."""
        state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        self.weights.put((version, state))

    def receive(self, s, at=""):
        """Rollout s from the sampler -> its message (at its start, s is the step before its
        first rollout: the word that it is set up); one line if it died, failed or hung."""
        t, at = time.time(), at or f"rollout {s}"
        while not self.rollouts.poll(1.0):
            if time.time() - t > self.timeout and self.proc.is_alive():
                raise UserError(f"the async sampler sent nothing in {self.timeout:g} s "
                                f"(--async_timeout): hung at {at}")
        try:
            msg = recv(self.rollouts)
        except EOFError:  # it exited, or was killed mid-message
            self.proc.join(5)
            raise UserError(f"the async sampler died (exit code {self.proc.exitcode}) at "
                            f"{at}") from None
        if "error" in msg:
            raise UserError(f"the async sampler failed at {at}: {msg['error']}")
        assert msg["step"] == s, (msg["step"], s)  # rollouts come in order, one a step
        return msg


def version_lag(batch, version):
    """The versions the trained tokens lag the trainer's: their mean and max over every rank's
    (a rank whose batch is None has none; {} when no rank has any)."""
    lag = torch.zeros(0) if batch is None else \
        (version - batch.version)[batch.mask.bool()].double()  # (tokens,)
    n, total = all_reduce([float(len(lag)), float(lag.sum())]).tolist()
    worst = all_reduce(float(lag.max()) if len(lag) else 0.0, "max").item()
    return {"rl/version_lag_mean": total / n, "rl/version_lag_max": worst} if n else {}


def sampler_device(dev, rank, world):
    """The trainer's device, or on CUDA a GPU of its own when there are enough for every rank."""
    if dev.type == "cuda" and torch.cuda.device_count() >= 2 * world:
        return torch.device("cuda", world + rank)
    return dev


def stop(proc, weights):
    """End the sampler: ask, then kill (it ignores SIGTERM); never leave it behind."""
    if proc.is_alive():
        weights.put(None)
        proc.join(2)
    if proc.is_alive():
        proc.kill()
        proc.join()


def send(conn, obj):
    """obj down a pipe as the bytes torch.save writes: no shared memory or file descriptor
    travels, so either end may die mid-message and the other reads EOF or a broken pipe, never
    a traceback from a thread serving a transfer (torch.multiprocessing's default)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    conn.send_bytes(buf.getbuffer())


class Sender(queue.Queue):
    """The trainer's end of the weights' pipe, written in order by a thread of its own: a
    version is sent while the sampler reads it, and the trainer goes on (a send blocks until the
    other end reads, which it may do only after sending its rollout)."""

    def __init__(self, conn):
        super().__init__()
        self.conn = conn
        threading.Thread(target=self.feed, name="nanorl-publish", daemon=True).start()

    def feed(self):
        while True:
            try:
                send(self.conn, self.get())
            except OSError:  # the sampler is gone: receive() says so
                return


def recv(conn):
    """The next object send() wrote, on the CPU; EOFError when the other end is gone, even
    mid-message."""
    try:
        data = conn.recv_bytes()
    except OSError:  # "got end of file during message"
        raise EOFError from None
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


class InFlight(torch.nn.Module):
    """The sampler's policy: model's forward, and before each one (with --inflight) the newest
    weights published; it records each forward's version, one a decode step (stamped)."""

    def __init__(self, model, source, inflight):
        super().__init__()
        self.model, self.config, self.lm_head = model, model.config, model.lm_head
        self.source, self.inflight, self.log = source, inflight, []

    def forward(self, *args, **kwargs):
        if self.inflight:
            self.source.poll()
        orphaned(self.source.parent)
        self.log.append(self.source.version)
        return self.model(*args, **kwargs)


def stamped(generate, policy):
    """The sampler's generate, each token stamped with the version of the forward that drew it."""
    def generate_stamped(*args, **kwargs):
        out = generate(*args, **kwargs)
        N, L = out["logps"].shape  # the call's last L forwards
        out["version"] = torch.tensor(policy.log[-L:], device=out["ids"].device).expand(N, -1)
        policy.log.clear()
        return out
    return generate_stamped


class Weights:
    """The sampler's end of the weights' pipe: loads versions into its model, in order."""

    def __init__(self, model, conn, parent):
        self.model, self.conn, self.parent, self.version = model, conn, parent, -1
        self.idle = 0.0  # seconds spent waiting: for a version, for the trainer to read

    def load(self, state):
        if state is None:  # the trainer says stop
            raise SystemExit(0)
        self.version, weights = state
        self.model.load_state_dict(weights)

    def wait_for(self, version):
        """Pacing: block until `version` (or, in flight, a newer one) is loaded."""
        t = time.time()
        while self.version < version:
            if self.conn.poll(1.0):
                self.load(recv(self.conn))
            orphaned(self.parent)
        self.idle += time.time() - t

    def poll(self):
        """In flight: load every version published so far, without waiting."""
        while self.conn.poll():
            self.load(recv(self.conn))


def orphaned(parent):
    """The trainer is gone (killed, even with -9): the sampler exits at once."""
    if os.getppid() != parent:
        os._exit(0)


def serve(cfg, cls, hp, dev, rank, world, first, state, threads, setup, collect, weights, out,
          parent):
    """The sampler process: rollout first, first + 1, ..., each sent to the trainer (`out`) with
    its stats and the prompt sampler's and reward model's state after it."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, timeout, a scheduler's cancel: the
        signal.signal(sig, signal.SIG_IGN)  # trainer finishes its step, saves and stops us
    torch.set_num_threads(threads)
    dev = torch.device(dev)
    try:
        # this rank's share of each step's prompts, as collect() takes it under torchrun
        cfg = cls(**{**cfg, "prompts_per_step": cfg["prompts_per_step"] // world})
        algo = losses.ALGOS[cfg.loss]
        cfg, run = setup(cfg, algo, hp, dev, rank, world)
        run.prompts.load_state_dict(state["sampler"])
        if run.rm:
            run.rm.load_state_dict(state["rm"])
        source = Weights(run.model, weights, parent)
        run.model = InFlight(run.model, source, cfg.inflight)
        collect.__globals__["generate"] = stamped(generate, run.model)  # rl.py's, this process's
        send(out, {"step": first - 1})  # set up: the trainer's timeout now times rollouts
        idle, t = source.idle, time.time()  # a rollout's span: from the last one's send
        for s in itertools.count(first):
            source.wait_for(s - 1)  # pacing: rollout s is version s-1's
            gen = seeded(dev, "rollout", cfg.seed, rank, s)
            with torch.autocast(dev.type, torch.bfloat16, enabled=cfg.bf16 or cfg.sampler_bf16):
                batch, stats = collect(cfg, algo, run, gen)
            idle_frac = (source.idle - idle) / (time.time() - t)
            idle, t = source.idle, time.time()
            send(out, {"step": s, "batch": rows.to_dict(batch), "stats": stats,
                       "idle_frac": idle_frac, "sampler": run.prompts.state_dict(),
                       "rm": run.rm and run.rm.state_dict()})
            source.idle += time.time() - t  # until the trainer read it: waiting too
    except (SystemExit, EOFError, BrokenPipeError):  # told to stop, or the trainer is gone
        return
    except BaseException as e:  # the trainer reports it in one line, if it is still there
        with contextlib.suppress(OSError):
            send(out, {"error": f"{type(e).__name__}: {e}".splitlines()[0]})
