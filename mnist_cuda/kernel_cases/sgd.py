"""The optimizer's cases: plain SGD (naive, and fused with zeroing the gradients) and SGD with momentum at a
one-cycle rate computed on the GPU, in both versions."""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..ops import both, naive
from ..ops.sgd_zero_grad import sgd_momentum_zero_grad, sgd_zero_grad
from .common import Case, Prepared, _bytes, _dev, _f32


def sgd_case():
    def make(rng, d):
        n = sum(int(np.prod(s)) for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g = _f32(rng, n), _f32(rng, n)
        pd, gd = _dev(p), _dev(g)
        run = lambda: naive.sgd(pd, gd, 0.05)
        return Prepared(
            run,
            {"params": pd},
            {"params": p.astype(np.float64) - np.float32(0.05) * g.astype(np.float64)},
            (2.0 * n, 3 * _bytes(p)),
        )

    return Case("sgd_naive", make, ops=("sgd",))


def sgd_fast_case():
    def make(rng, d):
        n = sum(-(-int(np.prod(s)) // 4) * 4 for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g = _f32(rng, n), _f32(rng, n)
        pd, gd = _dev(p), _dev(g)
        run = lambda: sgd_zero_grad(pd, gd, 0.05)
        return Prepared(
            run,
            {"params": pd, "grads": gd},
            {"params": p.astype(np.float64) - np.float32(0.05) * g.astype(np.float64), "grads": np.zeros(n)},
            (2.0 * n, 4 * _bytes(p)),
        )

    return Case("sgd_zero_grad_fast", make, ops=("sgd",))


def sgd_momentum_case(version: str, started: bool):
    """torch.optim.SGD's options at a one-cycle rate computed on the GPU from the step counter: the buffers'
    first step (buffer = direction, plain momentum) or a later one (dampening, Nesterov)."""
    from ..optim import Schedule

    momentum, dampening, weight_decay, nesterov = (0.9, 0.0, 5e-4, True) if started else (0.9, 0.25, 1e-3, False)
    schedule, lr, t = Schedule("onecycle", total=200, anneal="cos"), 0.1, 37

    def make(rng, d):
        import cupy

        n = sum(-(-int(np.prod(s)) // 4) * 4 for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g, b = _f32(rng, n), _f32(rng, n), _f32(rng, n)
        pd, gd, bd = _dev(p), _dev(g), _dev(b)
        state, lr_d, first_d = (
            cupy.array([t, int(started)], cupy.int32),
            cupy.zeros(1, cupy.float32),
            cupy.zeros(1, cupy.int32),
        )

        def run():
            state[0] = t  # (a replay by the benchmark takes the same step)
            both.sgd_schedule(state, lr_d, first_d, schedule.kernel_args(lr))
            update = naive.sgd_momentum if version == "naive" else sgd_momentum_zero_grad
            update(pd, gd, bd, lr_d, first_d, momentum, dampening, weight_decay, nesterov)

        rate = np.float64(np.float32(schedule.lr_at(lr, t)))
        p64, g64, b64 = (a.astype(np.float64) for a in (p, g, b))
        direction = g64 + weight_decay * p64
        buffer = momentum * b64 + (1 - dampening) * direction if started else direction
        step = direction + momentum * buffer if nesterov else buffer
        want = {"params": p64 - rate * step, "buffers": buffer}
        got = {"params": pd, "buffers": bd}
        if version == "fast":
            want["grads"], got["grads"] = np.zeros(n), gd
        return Prepared(run, got, want, (6.0 * n, 5 * _bytes(p)))

    kernel = "sgd_momentum_naive" if version == "naive" else "sgd_momentum_zero_grad_fast"
    return Case(f"sgd_schedule+{kernel}[{'later' if started else 'first'} step]", make, ops=("sgd", "sgd_schedule"))


def sgd_models_case():
    """Three models' updates in one launch, each with its own options and its own schedule's rate (both
    computed on the GPU in one launch each): plain SGD; momentum, Nesterov and weight decay at a later step of a
    one-cycle schedule; momentum with dampening at its buffers' first step of a cosine one."""
    from ..ops.sgd_zero_grad import initial_rates, model_hyperparameters, sgd_models_zero_grad
    from ..optim import Schedule, SGDOptions

    options = [
        SGDOptions(0.05),
        SGDOptions(0.1, 0.9, 0.0, True, 5e-4, Schedule("onecycle", total=200)),
        SGDOptions(0.02, 0.8, 0.25, False, 1e-3, Schedule("cosine", total=300)),
    ]
    steps, started = (0, 37, 90), (False, True, False)

    def make(rng, d):
        import cupy

        n = sum(-(-int(np.prod(s)) // 4) * 4 for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        K = len(options)
        p, g, b = _f32(rng, K * n), _f32(rng, K * n), _f32(rng, K * n)
        pd, gd, bd = _dev(p), _dev(g), _dev(b)
        state = cupy.array([[t, int(s)] for t, s in zip(steps, started)], cupy.int32)
        lr_d, first_d = cupy.asarray(initial_rates(options)), cupy.zeros(K, cupy.int32)
        hyper = {k: cupy.asarray(v) for k, v in model_hyperparameters(options).items()}
        rows = cupy.asarray(both.schedule_rows([None if o.plain else o.schedule.kernel_args(o.lr) for o in options]))

        def run():
            state[:, 0] = cupy.asarray(steps, cupy.int32)  # (a replay by the benchmark takes the same steps)
            both.sgd_schedule_models(state, lr_d, first_d, rows)
            sgd_models_zero_grad(pd, gd, bd, lr_d, first_d, **hyper, models=K)

        want_p, want_b = p.astype(np.float64), b.astype(np.float64)
        for m, o in enumerate(options):
            part = slice(m * n, (m + 1) * n)
            p64, g64, b64 = (a[part].astype(np.float64) for a in (p, g, b))
            rate = np.float64(np.float32(o.lr if o.plain else o.schedule.lr_at(o.lr, steps[m])))
            if o.plain:
                want_p[part] = p64 - rate * g64
                continue
            direction = g64 + o.weight_decay * p64
            buffer = o.momentum * b64 + (1 - o.dampening) * direction if started[m] else direction
            want_p[part] = p64 - rate * (direction + o.momentum * buffer if o.nesterov else buffer)
            want_b[part] = buffer
        want = {"params": want_p, "grads": np.zeros(K * n), "buffers": want_b}
        return Prepared(run, {"params": pd, "grads": gd, "buffers": bd}, want, (6.0 * K * n, 5 * _bytes(p)))

    return Case("sgd_schedule+sgd_models_zero_grad_fast[three models]", make, ops=("sgd", "sgd_schedule"))
