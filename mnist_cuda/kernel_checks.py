"""Every kernel against the float64 reference, as data: used by tests/ and scripts/bench_kernels.py.

A case builds fresh random inputs for given dimensions, poisons its outputs (NaN, or 255 for argmax)
so an unwritten element fails, and returns:
    run()      launches the kernel on the current stream,
    outputs    {name: device array} to compare after run(),
    expected   {name: float64 / integer host array} from mnist_cuda.reference,
    work       (flops, bytes): the floor's two numbers, for the benchmark.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from . import reference as ref
from .kernels import launch, launch_1d

I32, F32 = np.int32, np.float32
EPS, MOMENTUM = F32(ref.BN_EPS), F32(ref.BN_MOMENTUM)


@dataclasses.dataclass
class Dims:
    batch: int
    c1: int
    c2: int
    hidden: int

    def __str__(self):
        return f"N={self.batch},C={self.c1},{self.c2},H={self.hidden}"


@dataclasses.dataclass
class Prepared:
    run: Callable[[], None]
    outputs: dict
    expected: dict
    work: tuple[float, float]


@dataclasses.dataclass
class Case:
    name: str  # kernel name (with version suffix) and which layer's geometry
    make: Callable[[np.random.Generator, Dims], Prepared]


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _dev(a, dtype=np.float32):
    import cupy
    return cupy.asarray(np.ascontiguousarray(a, dtype=dtype))


def _poison(shape, dtype=np.float32):
    import cupy
    return cupy.full(shape, 255 if dtype == np.uint8 else np.nan, dtype=dtype)


def _f32(rng, shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def _geometry(d: Dims, layer: int):
    """(N, C_in, C_out, size) of conv block `layer`."""
    return (d.batch, 1, d.c1, 28) if layer == 1 else (d.batch, d.c1, d.c2, 14)


def _bytes(*arrays) -> float:
    return float(sum(a.nbytes for a in arrays))


# ---- conv2d ---------------------------------------------------------------------------------------


def conv_forward_case(layer, version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        xd, wd, y = _dev(x), _dev(w), _poison((N, K, S, S))
        run = lambda: launch_1d(f"conv2d_forward_{version}", y.size, xd, wd, y, I32(N), I32(C), I32(K), I32(S), I32(S))
        return Prepared(run, {"y": y}, {"y": ref.conv2d_forward(x.astype(np.float64), w)},
                        (2.0 * y.size * C * 9, _bytes(x, w, y)))
    return Case(f"conv2d_forward_{version}[conv{layer}]", make)


def conv_backward_input_case(version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        dyd, wd, dx = _dev(dy), _dev(w), _poison((N, C, S, S))
        run = lambda: launch_1d(f"conv2d_backward_input_{version}", dx.size, dyd, wd, dx,
                                I32(N), I32(C), I32(K), I32(S), I32(S))
        want, _ = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dx": dx}, {"dx": want}, (2.0 * dx.size * K * 9, _bytes(dy, w, dx)))
    return Case(f"conv2d_backward_input_{version}[conv2]", make)


def conv_backward_weight_case(layer, version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        xd, dyd, dw = _dev(x), _dev(dy), _poison((K, C, 3, 3))
        run = lambda: launch_1d(f"conv2d_backward_weight_{version}", dw.size, xd, dyd, dw,
                                I32(N), I32(C), I32(K), I32(S), I32(S))
        _, want = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dw": dw}, {"dw": want}, (2.0 * dw.size * N * S * S, _bytes(x, dy, dw)))
    return Case(f"conv2d_backward_weight_{version}[conv{layer}]", make)


# ---- batchnorm ------------------------------------------------------------------------------------


def bn_stats_case(layer):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x = _f32(rng, (N, K, S, S), 2.0, 0.5)
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        xd, mean, invstd, rmd, rvd = _dev(x), _poison(K), _poison(K), _dev(rm), _dev(rv)
        run = lambda: launch("batchnorm_stats_naive", K, 256, xd, mean, invstd, rmd, rvd,
                             I32(N), I32(K), I32(S * S), EPS, MOMENTUM)
        _, (_, want_invstd, want_mean, var) = ref.batchnorm_forward_train(x.astype(np.float64), 1.0, 0.0)
        want_rm, want_rv = ref.batchnorm_running_update(rm.astype(np.float64), rv.astype(np.float64),
                                                        want_mean, var, N * S * S)
        # the running stats are updated in place, so run() must not be repeated without resetting
        return Prepared(run, {"mean": mean, "invstd": invstd, "running_mean": rmd, "running_var": rvd},
                        {"mean": want_mean, "invstd": want_invstd, "running_mean": want_rm, "running_var": want_rv},
                        (3.0 * x.size, 2 * _bytes(x)))
    return Case(f"batchnorm_stats_naive[bn{layer}]", make)


def bn_apply_case(layer, eval_mode=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x, gamma, beta = _f32(rng, (N, K, S, S), 2.0, 0.5), _f32(rng, K), _f32(rng, K)
        mean, var = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        xd, y = _dev(x), _poison((N, K, S, S))
        x64 = x.astype(np.float64)
        if eval_mode:
            args = [_dev(a) for a in (mean, var, gamma, beta)]
            run = lambda: launch_1d("batchnorm_eval_naive", y.size, xd, *args, y, I32(N), I32(K), I32(S * S), EPS)
            want = ref.batchnorm_forward_eval(x64, gamma, beta, mean, var)
        else:
            invstd = (1 / np.sqrt(var.astype(np.float64) + ref.BN_EPS)).astype(np.float32)
            args = [_dev(a) for a in (mean, invstd, gamma, beta)]
            run = lambda: launch_1d("batchnorm_apply_naive", y.size, xd, *args, y, I32(N), I32(K), I32(S * S))
            want = ((x64 - mean[:, None, None]) * invstd[:, None, None] * gamma[:, None, None]
                    + beta[:, None, None])
        return Prepared(run, {"y": y}, {"y": want}, (4.0 * x.size, 2 * _bytes(x)))
    return Case(f"batchnorm_{'eval' if eval_mode else 'apply'}_naive[bn{layer}]", make)


def bn_backward_case(layer):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x, dy, gamma = _f32(rng, (N, K, S, S), 2.0, 0.5), _f32(rng, (N, K, S, S)), _f32(rng, K)
        _, cache = ref.batchnorm_forward_train(x.astype(np.float64), gamma, 0.0)
        mean, invstd = cache[2].astype(np.float32), cache[1].astype(np.float32)
        dx, dgamma, dbeta = _poison(x.shape), _poison(K), _poison(K)
        args = [_dev(a) for a in (dy, x, mean, invstd, gamma)]
        run = lambda: launch("batchnorm_backward_naive", K, 256, *args, dx, dgamma, dbeta,
                             I32(N), I32(K), I32(S * S))
        want = ref.batchnorm_backward(dy.astype(np.float64), gamma.astype(np.float64), cache)
        return Prepared(run, {"dx": dx, "dgamma": dgamma, "dbeta": dbeta},
                        dict(zip(("dx", "dgamma", "dbeta"), want)), (8.0 * x.size, 4 * _bytes(x)))
    return Case(f"batchnorm_backward_naive[bn{layer}]", make)


# ---- relu, pool ---------------------------------------------------------------------------------


def relu_case(backward=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, 1)
        x, dy = _f32(rng, (N, K, S, S)), _f32(rng, (N, K, S, S))
        out = _poison(x.shape)
        if backward:
            y = np.maximum(x, 0)
            args = (_dev(dy), _dev(y))
            run = lambda: launch_1d("relu_backward_naive", out.size, *args, out, I32(out.size))
            want = ref.relu_backward(dy.astype(np.float64), y)
        else:
            xd = _dev(x)
            run = lambda: launch_1d("relu_forward_naive", out.size, xd, out, I32(out.size))
            want = ref.relu_forward(x.astype(np.float64))
        return Prepared(run, {"out": out}, {"out": want}, (float(x.size), (3 if backward else 2) * _bytes(x)))
    return Case(f"relu_{'backward' if backward else 'forward'}_naive", make)


def pool_case(layer, backward=False):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x = _f32(rng, (N, K, S, S))
        y64, argmax = ref.maxpool_forward(x.astype(np.float64))
        if backward:
            dy = _f32(rng, y64.shape)
            dx = _poison(x.shape)
            args = (_dev(dy), _dev(argmax, np.uint8))
            run = lambda: launch_1d("maxpool2x2_backward_naive", dx.size, *args, dx, I32(N), I32(K), I32(S), I32(S))
            want = ref.maxpool_backward(dy.astype(np.float64), argmax, x.shape)
            return Prepared(run, {"dx": dx}, {"dx": want}, (0.0, _bytes(dy, x) + argmax.nbytes))
        y, am = _poison(y64.shape), _poison(y64.shape, np.uint8)
        xd = _dev(x)
        run = lambda: launch_1d("maxpool2x2_forward_naive", y.size, xd, y, am, I32(N), I32(K), I32(S), I32(S))
        return Prepared(run, {"y": y, "argmax": am}, {"y": y64, "argmax": argmax},
                        (3.0 * y.size, _bytes(x) + y64.nbytes / 2 + argmax.nbytes))
    return Case(f"maxpool2x2_{'backward' if backward else 'forward'}_naive[pool{layer}]", make)


# ---- linear, loss, sgd ---------------------------------------------------------------------------


def _linear_geometry(d: Dims, layer: str):
    return (d.batch, d.c2 * 49, d.hidden) if layer == "fc1" else (d.batch, d.hidden, 10)


def linear_case(layer, part):
    def make(rng, d):
        N, I, O = _linear_geometry(d, layer)
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        dims = (I32(N), I32(I), I32(O))
        if part == "forward":
            y = _poison((N, O))
            args = (_dev(x), _dev(w), _dev(b))
            run = lambda: launch_1d("linear_forward_naive", y.size, *args, y, *dims)
            return Prepared(run, {"y": y}, {"y": ref.linear_forward(x64, w64, b)}, (2.0 * N * I * O, _bytes(x, w, y)))
        dx_want, dw_want, db_want = ref.linear_backward(x64, w64, dy64)
        if part == "input":
            dx = _poison((N, I))
            args = (_dev(dy), _dev(w))
            run = lambda: launch_1d("linear_backward_input_naive", dx.size, *args, dx, *dims)
            return Prepared(run, {"dx": dx}, {"dx": dx_want}, (2.0 * N * I * O, _bytes(dy, w, dx)))
        dw, db = _poison((O, I)), _poison(O)
        args = (_dev(x), _dev(dy))
        run = lambda: launch_1d("linear_backward_params_naive", O * (I + 1), *args, dw, db, *dims)
        return Prepared(run, {"dw": dw, "db": db}, {"dw": dw_want, "db": db_want}, (2.0 * N * I * O, _bytes(x, dy, dw)))
    return Case(f"linear_{part}_naive[{layer}]", make)


def cross_entropy_case():
    def make(rng, d):
        import cupy
        N = d.batch
        logits, labels = _f32(rng, (N, 10), 3.0), rng.integers(0, 10, N).astype(np.int32)
        dlogits, loss = _poison((N, 10)), _poison(1)
        log, count = _poison(4), cupy.array([2], dtype=cupy.int32)  # appends at index 2
        args = (_dev(logits), _dev(labels, np.int32))
        run = lambda: launch("cross_entropy_forward_backward", 1, 256, *args, dlogits, loss, log, count,
                             I32(4), I32(N))
        want_loss, want_d = ref.nll_loss(logits.astype(np.float64), labels)
        return Prepared(run, {"loss": loss, "dlogits": dlogits, "logged": log[2:3], "count": count},
                        {"loss": [want_loss], "dlogits": want_d, "logged": [want_loss], "count": [3]},
                        (30.0 * N, _bytes(logits) * 2))
    return Case("cross_entropy_forward_backward", make)


def count_correct_case():
    def make(rng, d):
        import cupy
        N = d.batch
        logits, labels = _f32(rng, (N, 10)), rng.integers(0, 10, N).astype(np.int32)
        correct = cupy.array([5], dtype=cupy.int32)  # accumulates
        args = (_dev(logits), _dev(labels, np.int32))
        run = lambda: launch("count_correct", 1, 256, *args, correct, I32(N))
        want = 5 + int((logits.argmax(1) == labels).sum())
        return Prepared(run, {"correct": correct}, {"correct": [want]}, (10.0 * N, _bytes(logits)))
    return Case("count_correct", make)


def sgd_case():
    def make(rng, d):
        n = sum(int(np.prod(s)) for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g = _f32(rng, n), _f32(rng, n)
        pd, gd = _dev(p), _dev(g)
        run = lambda: launch_1d("sgd_update", n, pd, gd, F32(0.05), I32(n))
        return Prepared(run, {"params": pd}, {"params": p.astype(np.float64) - np.float32(0.05) * g.astype(np.float64)},
                        (2.0 * n, 3 * _bytes(p)))
    return Case("sgd_update", make)


def all_cases() -> list[Case]:
    cases = []
    for layer in (1, 2):
        cases += [conv_forward_case(layer), conv_backward_weight_case(layer), bn_stats_case(layer),
                  bn_apply_case(layer), bn_apply_case(layer, eval_mode=True), bn_backward_case(layer),
                  pool_case(layer), pool_case(layer, backward=True)]
    cases += [conv_backward_input_case(), relu_case(), relu_case(backward=True)]
    for layer in ("fc1", "fc2"):
        cases += [linear_case(layer, part) for part in ("forward", "input", "params")]
    cases += [cross_entropy_case(), count_correct_case(), sgd_case()]
    return cases


def check(prepared: Prepared) -> dict[str, float]:
    """Run once and return {output: relative error} (exact comparison for integer outputs)."""
    import cupy
    prepared.run()
    cupy.cuda.get_current_stream().synchronize()
    errors = {}
    for name, out in prepared.outputs.items():
        got, want = out.get(), np.asarray(prepared.expected[name])
        if got.dtype.kind in "iu":
            errors[name] = 0.0 if np.array_equal(got.ravel(), want.ravel()) else float("inf")
        else:
            errors[name] = rel_err(got, want)
    return errors
