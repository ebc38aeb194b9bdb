"""The pg rows of losses.ALGOS by name, as the tests (and the guide's test) call them:
LOSSES[name](logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **kw), kw any
of the row's hyperparameters (the rest: its defaults) and the objective's inputs."""
from functools import partial

from losses import ALGOS, algo_loss, resolve_hparams

INPUTS = ("values", "old_values", "value_targets", "entropy", "cov_mask", "group_correct",
          "group_size", "logits", "teacher_logits")  # tensors an objective takes, not knobs


def loss(name, logp, old_logp, adv, mask, ref_logp=None, n_tokens=None, n_seqs=None, **kw):
    """ALGOS[name]'s loss (algo_loss), unknown keys refused."""
    algo = ALGOS[name]
    hp = resolve_hparams(name, **{k: kw.pop(k) for k in list(kw) if k in algo.defaults})
    bad = [k for k in kw if k not in INPUTS]
    if bad:
        raise ValueError(f"loss {name!r} has no hyperparameter {bad[0]!r}; "
                         f"it takes {', '.join(algo.defaults) or 'none'}")
    return algo_loss(algo, hp, logp, old_logp, adv, mask, ref_logp, n_tokens, n_seqs, **kw)


LOSSES = {n: partial(loss, n) for n, a in ALGOS.items() if a.family == "pg"}
