"""The naive kernels' cases of the families but conv2d and sgd (conv2d.py and sgd.py hold those): batchnorm,
relu, maxpool, linear, the loss and normalize."""

from __future__ import annotations

import numpy as np

from .. import data
from .. import reference as ref
from ..ops import naive
from .common import EPS, MOMENTUM, Case, Prepared, _bytes, _dev, _exact, _f32, _geometry, _linear_geometry, _poison

# ---- batchnorm ------------------------------------------------------------------------------------


def bn_stats_case(layer):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x = _f32(rng, (N, K, S, S), 2.0, 0.5)
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        xd, mean, invstd, rmd, rvd = _dev(x), _poison(K), _poison(K), _dev(rm), _dev(rv)
        run = lambda: naive.batchnorm_stats(xd, mean, invstd, rmd, rvd, N, K, S * S, EPS, MOMENTUM)
        _, (_, want_invstd, want_mean, var) = ref.batchnorm_forward_train(x.astype(np.float64), np.ones(K), np.zeros(K))
        want_rm, want_rv = ref.batchnorm_running_update(
            rm.astype(np.float64), rv.astype(np.float64), want_mean, var, N * S * S
        )
        # the running stats are updated in place, so run() must not be repeated without resetting
        return Prepared(
            run,
            {"mean": mean, "invstd": invstd, "running_mean": rmd, "running_var": rvd},
            {"mean": want_mean, "invstd": want_invstd, "running_mean": want_rm, "running_var": want_rv},
            (3.0 * x.size, 2 * _bytes(x)),
        )

    return Case(f"batchnorm_stats_naive[bn{layer}]", make, ops=("batchnorm",))


def bn_apply_case(layer, eval_mode=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x, gamma, beta = _f32(rng, (N, K, S, S), 2.0, 0.5), _f32(rng, K), _f32(rng, K)
        mean, var = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        xd, y = _dev(x), _poison((N, K, S, S))
        x64 = x.astype(np.float64)
        if eval_mode:
            args = [_dev(a) for a in (mean, var, gamma, beta)]
            run = lambda: naive.batchnorm_eval(xd, *args, y, N, K, S * S, EPS)
            want = ref.batchnorm_forward_eval(x64, gamma, beta, mean, var)
        else:
            invstd = (1 / np.sqrt(var.astype(np.float64) + ref.BN_EPS)).astype(np.float32)
            args = [_dev(a) for a in (mean, invstd, gamma, beta)]
            run = lambda: naive.batchnorm_apply(xd, *args, y, N, K, S * S)
            want = (x64 - mean[:, None, None]) * invstd[:, None, None] * gamma[:, None, None] + beta[:, None, None]
        return Prepared(run, {"y": y}, {"y": want}, (4.0 * x.size, 2 * _bytes(x)))

    return Case(f"batchnorm_{'eval' if eval_mode else 'apply'}_naive[bn{layer}]", make, ops=("batchnorm",))


def bn_backward_case(layer):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x, dy, gamma = _f32(rng, (N, K, S, S), 2.0, 0.5), _f32(rng, (N, K, S, S)), _f32(rng, K)
        _, cache = ref.batchnorm_forward_train(x.astype(np.float64), gamma, np.zeros(K))
        mean, invstd = cache[2].astype(np.float32), cache[1].astype(np.float32)
        dx, dgamma, dbeta = _poison(x.shape), _poison(K), _poison(K)
        args = [_dev(a) for a in (dy, x, mean, invstd, gamma)]
        run = lambda: naive.batchnorm_backward(*args, dx, dgamma, dbeta, N, K, S * S)
        want = ref.batchnorm_backward(dy.astype(np.float64), gamma.astype(np.float64), cache)
        return Prepared(
            run,
            {"dx": dx, "dgamma": dgamma, "dbeta": dbeta},
            dict(zip(("dx", "dgamma", "dbeta"), want)),
            (8.0 * x.size, 4 * _bytes(x)),
        )

    return Case(f"batchnorm_backward_naive[bn{layer}]", make, ops=("batchnorm",))


# ---- relu, pool ---------------------------------------------------------------------------------


def relu_case(backward=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, 1)
        x, dy = _f32(rng, (N, K, S, S)), _f32(rng, (N, K, S, S))
        out = _poison(x.shape)
        if backward:
            y = np.maximum(x, 0)
            args = (_dev(dy), _dev(y))
            run = lambda: naive.relu_backward(*args, out, out.size)
            want = ref.relu_backward(dy.astype(np.float64), y)
        else:
            xd = _dev(x)
            run = lambda: naive.relu_forward(xd, out, out.size)
            want = ref.relu_forward(x.astype(np.float64))
        return Prepared(run, {"out": out}, {"out": want}, (float(x.size), (3 if backward else 2) * _bytes(x)))

    return Case(f"relu_{'backward' if backward else 'forward'}_naive", make, ops=("relu",))


def pool_case(layer, backward=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x = _f32(rng, (N, K, S, S))
        y64, argmax = ref.maxpool_forward(x.astype(np.float64))
        if backward:
            dy = _f32(rng, y64.shape)
            dx = _poison(x.shape)
            args = (_dev(dy), _dev(argmax, np.uint8))
            run = lambda: naive.maxpool_backward(*args, dx, N, K, S)
            want = ref.maxpool_backward(dy.astype(np.float64), argmax, x.shape)
            return Prepared(run, {"dx": dx}, {"dx": want}, (0.0, _bytes(dy, x) + argmax.nbytes))
        y, am = _poison(y64.shape), _poison(y64.shape, np.uint8)
        xd = _dev(x)
        run = lambda: naive.maxpool_forward(xd, y, am, N, K, S)
        return Prepared(
            run,
            {"y": y, "argmax": am},
            {"y": y64, "argmax": argmax},
            (3.0 * y.size, _bytes(x) + y64.nbytes / 2 + argmax.nbytes),
        )

    return Case(f"maxpool2x2_{'backward' if backward else 'forward'}_naive[pool{layer}]", make, ops=("maxpool",))


# ---- linear, loss, normalize, shift --------------------------------------------------------------


def linear_case(layer, part):
    def make(rng, d):
        N, I, O = _linear_geometry(d, layer)
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        if part == "forward":
            y = _poison((N, O))
            args = (_dev(x), _dev(w), _dev(b))
            run = lambda: naive.linear_forward(*args, y, N, I, O)
            return Prepared(run, {"y": y}, {"y": ref.linear_forward(x64, w64, b)}, (2.0 * N * I * O, _bytes(x, w, y)))
        dx_want, dw_want, db_want = ref.linear_backward(x64, w64, dy64)
        if part == "backward_input":
            dx = _poison((N, I))
            args = (_dev(dy), _dev(w))
            run = lambda: naive.linear_backward_input(*args, dx, N, I, O)
            return Prepared(run, {"dx": dx}, {"dx": dx_want}, (2.0 * N * I * O, _bytes(dy, w, dx)))
        dw, db = _poison((O, I)), _poison(O)
        args = (_dev(x), _dev(dy))
        run = lambda: naive.linear_backward_params(*args, dw, db, N, I, O)
        return Prepared(run, {"dw": dw, "db": db}, {"dw": dw_want, "db": db_want}, (2.0 * N * I * O, _bytes(x, dy, dw)))

    assert part in ("forward", "backward_input", "backward_params"), part
    return Case(f"linear_{part}_naive[{layer}]", make, ops=("linear",))


def cross_entropy_case():
    def make(rng, d):
        import cupy

        N = d.batch
        logits, labels = _f32(rng, (N, 10), 3.0), rng.integers(0, 10, N).astype(np.int32)
        dlogits, loss = _poison((N, 10)), _poison(1)
        log, count = _poison(4), cupy.array([2], dtype=cupy.int32)  # appends at index 2 of a log of 4
        args = (_dev(logits), _dev(labels, np.int32))
        run = lambda: naive.cross_entropy(*args, dlogits, loss, log, count, N)
        want_loss, want_d = ref.nll_loss(logits.astype(np.float64), labels)
        return Prepared(
            run,
            {"loss": loss, "dlogits": dlogits, "logged": log[2:3], "count": count},
            {"loss": [want_loss], "dlogits": want_d, "logged": [want_loss], "count": [3]},
            (30.0 * N, _bytes(logits) * 2),
        )

    return Case("cross_entropy_naive", make, ops=("cross_entropy",))


def normalize_case():
    """normalize_naive (and normalize_pixel, common.cuh, which the fast conv1 kernels use): bit for bit
    what data.normalize computes on the host, for all 256 byte values and a batch of random images."""

    def make(rng, d):
        images = rng.integers(0, 256, (d.batch, 1, 28, 28), dtype=np.uint8)
        images.flat[:256] = np.arange(256)
        out = _poison(images.shape)
        xd = _dev(images, np.uint8)
        run = lambda: naive.normalize(xd, out, images.size)
        host = data.normalize(images)
        return Prepared(run, {"x": out}, {"x": host}, (2.0 * images.size, images.nbytes * 5), compare={"x": _exact})

    return Case("normalize_naive", make, ops=("normalize",))
