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

from . import data, kernels
from . import reference as ref
from .kernels import ceil_div, launch, launch_1d

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
    compare: dict = dataclasses.field(default_factory=dict)  # name -> fn(got, want) -> error, if not default


# Largest relative error (rel_err) a kernel may have against the float64 reference: fp32 kernels land near
# 1e-6 to 1e-5; plain TF32 ones (conv2's _tf32 products, 10-bit mantissas) near 3e-4 (design.md).
FP32_TOL, TF32_TOL = 1e-4, 1e-3


@dataclasses.dataclass
class Case:
    name: str  # kernel name (with version suffix) and which layer's geometry
    make: Callable[[np.random.Generator, Dims], Prepared]
    tol: float = FP32_TOL


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


def _block_input(rng, d: Dims, layer: int, scale: float, shift: float):
    """(x, x on the device) for conv block `layer`: block 1 reads images as bytes, and x is what the
    network sees (data.normalize); block 2 reads conv2's float32 output (random here)."""
    N, C_in, K, S = _geometry(d, layer)
    if layer == 1:
        images = rng.integers(0, 256, (N, 1, S, S), dtype=np.uint8)
        return data.normalize(images), _dev(images, np.uint8)
    x = _f32(rng, (N, K, S, S), scale, shift)
    return x, _dev(x)


def _bytes(*arrays) -> float:
    return float(sum(a.nbytes for a in arrays))


# ---- conv2d ---------------------------------------------------------------------------------------


def _weight_quads(wd, C, K, tf32):
    """conv2's weights staged for both fast products by conv2d_stage_weights_fast or _tf32 (once, as the step
    does once per step; the timings of the products leave it out)."""
    import cupy
    fq = cupy.full((kernels.conv_weight_quads(C, K, tf32), 4), np.nan, cupy.float32)
    gq = cupy.full((kernels.conv_weight_quads(K, C, tf32), 4), np.nan, cupy.float32)
    kernels.stage_conv_weights(wd, C, K, fq, gq, tf32)
    return fq, gq


def split_tf32(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 v as the kernels split it (gemm.cuh): big = v with its low 13 mantissa bits cleared, small =
    v - big (exact in float32)."""
    v = np.asarray(v, np.float32)
    big = (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return big, v - big


def round_tf32(v: np.ndarray) -> np.ndarray:
    """float32 v rounded to the nearest TF32, ties away from zero (PTX cvt.rna.tf32.f32; finite v)."""
    bits = np.asarray(v, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def weight_quads(w: np.ndarray, flipped: bool, tf32: bool = False) -> np.ndarray:
    """What conv2d_stage_weights_fast writes for one product, from w [K, C, 3, 3] (conv2d.cu): float4s
    [tile][chunk][tap][quad][row] holding channels chunk*8 + quad*4 + 0..3 of output channel tile*32 + row % 32,
    their big TF32 parts in rows 0-31 and small parts in rows 32-63. conv2d_stage_weights_tf32: output
    channel tile*64 + row, rounded to the nearest TF32."""
    wt = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1] if flipped else w  # [out, in, 3, 3], taps flipped
    c_out, c_in = wt.shape[:2]
    tile = kernels.conv_tile_channels(tf32)
    tiles, chunks = ceil_div(c_out, tile), ceil_div(c_in, kernels.CONV_CHUNK)
    padded = np.zeros((tiles * tile, chunks * kernels.CONV_CHUNK, 9), np.float32)
    padded[:c_out, :c_in] = wt.reshape(c_out, c_in, 9)
    # [tile, row, chunk, quad, i, tap] -> [tile, chunk, tap, quad, row, i]
    v = padded.reshape(tiles, tile, chunks, 2, 4, 9).transpose(0, 2, 5, 3, 1, 4)
    if tf32:
        return round_tf32(v).reshape(-1, 4)
    big, small = split_tf32(v)
    return np.concatenate([big, small], axis=4).reshape(-1, 4)


def conv_stage_weights_case(version="fast"):
    def make(rng, d):
        tf32 = version == "tf32"
        N, C, K, S = _geometry(d, 2)
        w = _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        fq = _poison((kernels.conv_weight_quads(C, K, tf32), 4))
        gq = _poison((kernels.conv_weight_quads(K, C, tf32), 4))
        wd = _dev(w)
        run = lambda: kernels.stage_conv_weights(wd, C, K, fq, gq, tf32)
        exact = lambda got, want: 0.0 if np.array_equal(got, want) else float("inf")  # bit for bit
        return Prepared(run, {"forward_quads": fq, "input_grad_quads": gq},
                        {"forward_quads": weight_quads(w, False, tf32), "input_grad_quads": weight_quads(w, True, tf32)},
                        (0.0, _bytes(w, fq, gq)), compare={"forward_quads": exact, "input_grad_quads": exact})
    return Case(f"conv2d_stage_weights_{version}[conv2]", make)


def conv_forward_case(layer, version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        xd, wd, y = _dev(x), _dev(w), _poison((N, K, S, S))
        args = (xd, wd, y, I32(N), I32(C), I32(K), I32(S), I32(S))
        if version == "naive":
            run = lambda: launch_1d("conv2d_forward_naive", y.size, *args)
        else:
            tf32 = version == "tf32"
            forward_quads, _ = _weight_quads(wd, C, K, tf32)
            run = lambda: kernels.launch_conv_image_tile("forward", tf32, N, K, xd, forward_quads, y, *args[3:])
        return Prepared(run, {"y": y}, {"y": ref.conv2d_forward(x.astype(np.float64), w)},
                        (2.0 * y.size * C * 9, _bytes(x, w, y)))
    return Case(f"conv2d_forward_{version}[conv{layer}]", make, _tol(version))


def _tol(version: str) -> float:
    return TF32_TOL if version == "tf32" else FP32_TOL


def conv_backward_input_case(version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        dyd, wd, dx = _dev(dy), _dev(w), _poison((N, C, S, S))
        args = (dyd, wd, dx, I32(N), I32(C), I32(K), I32(S), I32(S))
        if version == "naive":
            run = lambda: launch_1d("conv2d_backward_input_naive", dx.size, *args)
        else:
            tf32 = version == "tf32"
            _, input_grad_quads = _weight_quads(wd, C, K, tf32)
            run = lambda: kernels.launch_conv_image_tile("backward_input", tf32, N, C, dyd, input_grad_quads, dx,
                                                         *args[3:])
        want, _ = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dx": dx}, {"dx": want}, (2.0 * dx.size * K * 9, _bytes(dy, w, dx)))
    return Case(f"conv2d_backward_input_{version}[conv2]", make, _tol(version))


def conv_backward_weight_case(layer, version="naive"):
    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        xd, dyd, dw = _dev(x), _dev(dy), _poison((K, C, 3, 3))
        if version == "naive":
            run = lambda: launch_1d("conv2d_backward_weight_naive", dw.size, xd, dyd, dw,
                                    I32(N), I32(C), I32(K), I32(S), I32(S))
        else:
            partial = _poison(kernels.sm_count() * dw.size)

            def run():
                parts = kernels.launch_conv_weight_grad(N, C, K, xd, dyd, partial, version == "tf32")
                kernels.splitk_reduce(partial, parts, dw)
        _, want = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dw": dw}, {"dw": want}, (2.0 * dw.size * N * S * S, _bytes(x, dy, dw)))
    return Case(f"conv2d_backward_weight_{version}[conv{layer}]", make, _tol(version))


# ---- batchnorm ------------------------------------------------------------------------------------


def bn_stats_case(layer):
    def make(rng, d):
        N, _, K, S = _geometry(d, layer)
        x = _f32(rng, (N, K, S, S), 2.0, 0.5)
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        xd, mean, invstd, rmd, rvd = _dev(x), _poison(K), _poison(K), _dev(rm), _dev(rv)
        run = lambda: launch("batchnorm_stats_naive", K, 256, xd, mean, invstd, rmd, rvd,
                             I32(N), I32(K), I32(S * S), EPS, MOMENTUM)
        _, (_, want_invstd, want_mean, var) = ref.batchnorm_forward_train(x.astype(np.float64), np.ones(K), np.zeros(K))
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
        _, cache = ref.batchnorm_forward_train(x.astype(np.float64), gamma, np.zeros(K))
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


def normalize_case():
    """normalize_images (and normalize_pixel, which the fast conv1 kernels use): bit for bit what
    data.normalize computes on the host, for all 256 byte values and a batch of random images."""
    def make(rng, d):
        images = rng.integers(0, 256, (d.batch, 1, 28, 28), dtype=np.uint8)
        images.flat[:256] = np.arange(256)
        out = _poison(images.shape)
        xd = _dev(images, np.uint8)
        run = lambda: launch_1d("normalize_images", images.size, xd, out, I32(images.size))
        host = data.normalize(images)
        return Prepared(run, {"x": out}, {"x": host}, (2.0 * images.size, images.nbytes * 5),
                        compare={"x": lambda got, want: 0.0 if np.array_equal(got, want) else float("inf")})
    return Case("normalize_images", make)


def sgd_case():
    def make(rng, d):
        n = sum(int(np.prod(s)) for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g = _f32(rng, n), _f32(rng, n)
        pd, gd = _dev(p), _dev(g)
        run = lambda: launch_1d("sgd_update", n, pd, gd, F32(0.05), I32(n))
        return Prepared(run, {"params": pd}, {"params": p.astype(np.float64) - np.float32(0.05) * g.astype(np.float64)},
                        (2.0 * n, 3 * _bytes(p)))
    return Case("sgd_update", make)


# ---- fast-version kernels -----------------------------------------------------------------------------


def argmax_near_ties(windows):
    """A comparison for a fused kernel's argmax: it computes the pooled values itself in float32, so a
    window whose two largest values are within rounding may pick either. Accept a different choice only
    where its reference value is within 1e-5 of the window's maximum."""
    def compare(got, want):
        got, want = got.reshape(want.shape).astype(np.int64), want.astype(np.int64)
        if np.array_equal(got, want):
            return 0.0
        if got.min() < 0 or got.max() > 3:
            return float("inf")
        picked = np.take_along_axis(windows, got[..., None], -1)[..., 0]
        best = windows.max(axis=-1)
        ok = (got == want) | (np.abs(best - picked) <= 1e-5 * np.maximum(1.0, np.abs(best)))
        return 0.0 if ok.all() else float("inf")
    return compare


def _pool_reference(z):
    """relu then maxpool of float64 z: (pooled, argmax, windows)."""
    r = ref.relu_forward(z)
    pooled, argmax = ref.maxpool_forward(r)
    return pooled, argmax, ref._pool_windows(r)


def _bn_batch_stats(a):
    mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
    return mean, var, 1 / np.sqrt(var + ref.BN_EPS)


def image_moments(x) -> np.ndarray:
    """What conv1_image_moments_fast computes: the sums S_t of the zero-padded images shifted by tap t over
    the 28x28 outputs of the batch x [N,1,28,28], then G_tu = sum X_t X_u for t <= u, row by row."""
    xp = np.pad(np.asarray(x, np.float64)[:, 0], ((0, 0), (1, 1), (1, 1)))
    shifted = np.stack([xp[:, i:i + 28, j:j + 28].ravel() for i in range(3) for j in range(3)])
    gram = shifted @ shifted.T
    return np.concatenate([shifted.sum(axis=1)] + [gram[t, t:] for t in range(9)])


def conv1_moments_case():
    """conv1_image_moments_fast: the batch's image moments (conv1's BatchNorm statistics come from them)."""
    def make(rng, d):
        N = d.batch
        x, xd = _block_input(rng, d, 1, 1.0, 0.0)
        parts, per_part = kernels.conv1_moments_parts(N)
        moment_partial, counter = _poison((parts, kernels.CONV1_MOMENTS), np.float64), _dev(np.zeros(1), np.uint32)
        moments = _poison(kernels.CONV1_MOMENTS, np.float64)
        run = lambda: launch("conv1_image_moments_fast", parts, kernels.CONV1_THREADS, xd, I32(N), I32(per_part),
                             moment_partial, counter, moments)
        return Prepared(run, {"moments": moments, "counter": counter}, {"moments": image_moments(x), "counter": [0]},
                        (2.0 * 4 * kernels.CONV1_MOMENTS * N * 196, _bytes(xd)))  # 4 outputs per window, in double
    return Case("conv1_image_moments_fast", make)


def bn_stats_fast_case():
    """batchnorm_stats_fast (BN2's statistics over conv2's output)."""
    def make(rng, d):
        N, C_in, K, S = _geometry(d, 2)
        x, xd = _block_input(rng, d, 2, 2.0, 0.5)
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        mean, var, invstd = _bn_batch_stats(x.astype(np.float64))
        want_rm, want_rv = ref.batchnorm_running_update(rm.astype(np.float64), rv.astype(np.float64), mean, var,
                                                        N * S * S)
        parts, per_part = kernels.parts_of(N)
        partial, counter = _poison(parts * K * 2), _dev(np.zeros(K), np.uint32)  # a counter per channel group
        outs = {k: _poison(K) for k in ("mean", "invstd")}
        rmd, rvd = _dev(rm), _dev(rv)
        run = lambda: launch("batchnorm_stats_fast", (parts, ceil_div(K, 8)), 256, xd, I32(N), I32(K), I32(S * S),
                             I32(per_part), partial, counter, EPS, MOMENTUM, outs["mean"], outs["invstd"], rmd, rvd)
        return Prepared(run, {**outs, "running_mean": rmd, "running_var": rvd, "counter": counter},
                        {"mean": mean, "invstd": invstd, "running_mean": want_rm, "running_var": want_rv,
                         "counter": np.zeros(K)}, (3.0 * x.size, 2 * _bytes(x)))
    return Case("batchnorm_stats_fast[bn2]", make)


def bn_relu_pool_fast_case(layer, train=False):
    """conv1_bn_relu_pool_fast (layer 1) or batchnorm_relu_maxpool_fast: pooled = maxpool(relu(bn(a))) with
    given statistics; for layer 1 in training (train=True) with the batch's own, from its image moments
    (the kernel also saves them and updates the running statistics)."""
    def make(rng, d):
        N, C_in, K, S = _geometry(d, layer)
        (x, xd), w = _block_input(rng, d, layer, 1.0, 0.0), _f32(rng, (K, C_in, 3, 3), 1 / 3)
        mean, invstd, gamma, beta = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5, _f32(rng, K), _f32(rng, K, 0.5)
        a = ref.conv2d_forward(x.astype(np.float64), w) if layer == 1 else x.astype(np.float64)
        outs, expected, stats = {}, {}, [_dev(v) for v in (mean, invstd, gamma, beta)]
        if train:
            rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
            mean, var, invstd = _bn_batch_stats(a)
            want_rm, want_rv = ref.batchnorm_running_update(rm.astype(np.float64), rv.astype(np.float64), mean, var,
                                                            N * S * S)
            outs.update(mean=_poison(K), invstd=_poison(K), running_mean=_dev(rm), running_var=_dev(rv))
            stats[:2] = outs["mean"], outs["invstd"]  # written by the kernel
            expected.update(mean=mean, invstd=invstd, running_mean=want_rm, running_var=want_rv)
        bn = [v.astype(np.float64)[:, None, None] for v in (mean, invstd, gamma, beta)]
        pooled, argmax, windows = _pool_reference((a - bn[0]) * bn[1] * bn[2] + bn[3])
        outs["pooled"], outs["argmax"] = _poison(pooled.shape), _poison(pooled.shape, np.uint8)
        expected.update(pooled=pooled, argmax=argmax)
        y, am = outs["pooled"], outs["argmax"]
        if layer == 1:
            wd, moments = _dev(w), _dev(image_moments(x), np.float64)
            running = (outs["running_mean"], outs["running_var"]) if train else (stats[0], stats[1])  # (unused in eval)
            run = lambda: launch("conv1_bn_relu_pool_fast", (N, ceil_div(K, kernels.CONV1_CHANNELS)),
                                 kernels.CONV1_THREADS, xd, wd, I32(train), moments, EPS, MOMENTUM, stats[0], stats[1],
                                 *running, stats[2], stats[3], I32(N), I32(K), y, am)
            work = (2.0 * a.size * 9, _bytes(xd) + pooled.nbytes / 2)
        else:
            run = lambda: launch_1d("batchnorm_relu_maxpool_fast", y.size, xd, *stats, I32(N), I32(K), I32(S), y, am)
            work = (3.0 * x.size, _bytes(x) + pooled.nbytes / 2 + argmax.nbytes)
        return Prepared(run, outs, expected, work, compare={"argmax": argmax_near_ties(windows)})
    mode = "[train]" if train else ""
    return Case(f"{'conv1_bn_relu_pool' if layer == 1 else 'batchnorm_relu_maxpool'}_fast[block{layer}]{mode}", make)


def block_backward_fast_case(layer):
    """The BN backward of a block from its pooled gradient: layer 1 runs conv1_backward_fast (-> dgamma,
    dbeta, dw; from the batch's image moments); layer 2 runs batchnorm_backward_reduce_fast +
    batchnorm_backward_apply_fast (-> dgamma, dbeta, dx)."""
    def make(rng, d):
        N, C_in, K, S = _geometry(d, layer)
        (x, xd), w = _block_input(rng, d, layer, 1.5, 0.3), _f32(rng, (K, C_in, 3, 3), 1 / 3)
        gamma, beta = _f32(rng, K), _f32(rng, K, 0.5)
        a = ref.conv2d_forward(x.astype(np.float64), w) if layer == 1 else x.astype(np.float64)
        z, cache = ref.batchnorm_forward_train(a, gamma.astype(np.float64), beta.astype(np.float64))
        r = ref.relu_forward(z)
        pooled, argmax = ref.maxpool_forward(r)
        d_pooled = _f32(rng, pooled.shape)
        dz = ref.relu_backward(ref.maxpool_backward(d_pooled.astype(np.float64), argmax, r.shape), r)
        da, dgamma, dbeta = ref.batchnorm_backward(dz, gamma.astype(np.float64), cache)
        mean, invstd = cache[2].astype(np.float32), cache[1].astype(np.float32)
        parts, per_part = kernels.parts_of(N)
        partial = _poison(parts * K * kernels.CONV1_GRAD_SUMS)
        counters = _dev(np.zeros((2, K)), np.uint32)  # per kernel and group
        dg, db = _poison(K), _poison(K)
        common = [_dev(v) for v in (mean, invstd)]
        pooled_in = (_dev(d_pooled), _dev(pooled), _dev(argmax, np.uint8))
        wd, gd = _dev(w), _dev(gamma)
        if layer == 1:
            dw = _poison(w.shape)

            moments = _dev(image_moments(x), np.float64)
            grid, per_part = kernels.conv1_backward_grid(N, K)
            run = lambda: launch("conv1_backward_fast", grid, kernels.CONV1_THREADS, xd, wd, *common, gd, moments,
                                 *pooled_in, I32(N), I32(K), I32(per_part), partial, counters[0], dg, db, dw)
            _, want_dw = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), da)
            return Prepared(run, {"dgamma": dg, "dbeta": db, "dw": dw, "counters": counters},
                            {"dgamma": dgamma, "dbeta": dbeta, "dw": want_dw, "counters": np.zeros((2, K))},
                            (2.0 * pooled.size * kernels.CONV1_GRAD_SUMS, _bytes(xd) + 3 * pooled.nbytes))
        dx = _poison(x.shape)

        def run():
            launch("batchnorm_backward_reduce_fast", (parts, ceil_div(K, 8)), 256, xd, *common, *pooled_in,
                   I32(N), I32(K), I32(S), I32(per_part), partial, counters[0], dg, db)
            launch_1d("batchnorm_backward_apply_fast", pooled.size, xd, *common, gd, dg, db, *pooled_in,
                      I32(N), I32(K), I32(S), dx)
        return Prepared(run, {"dgamma": dg, "dbeta": db, "dx": dx, "counters": counters},
                        {"dgamma": dgamma, "dbeta": dbeta, "dx": da, "counters": np.zeros((2, K))},
                        (8.0 * x.size, 2 * _bytes(x) + 3 * pooled.nbytes))
    return Case(f"block{layer}_bn_backward_fast", make)


def linear_fast_case(part):
    """fc1's products on the tiled core: forward (+ bias + ReLU via splitk_reduce), input gradient (in 64- or
    32-wide tiles) and weight gradient (split-K where the batch is long enough)."""
    def make(rng, d):
        N, I, O = _linear_geometry(d, "fc1")
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        xd, wd, bd, dyd = _dev(x), _dev(w), _dev(b), _dev(dy)
        if part == "forward":
            y = _poison((N, O))
            splits, k_per_split = kernels.split_k(I, ceil_div(O, 64) * ceil_div(N, 64))
            partial = _poison(splits * N * O)

            def run():
                launch("linear_forward_fast", (ceil_div(O, 64), ceil_div(N, 64), splits), 256, xd, wd, partial,
                       I32(N), I32(I), I32(O), I32(k_per_split))
                kernels.splitk_reduce(partial, splits, y, bias=bd, relu=True)
            return Prepared(run, {"y": y}, {"y": ref.relu_forward(ref.linear_forward(x64, w64, b))},
                            (2.0 * N * I * O, _bytes(x, w, y)))
        dx_want, dw_want, _ = ref.linear_backward(x64, w64, dy64)
        if part.startswith("input"):  # input (64-wide tiles), input_narrow (32-wide)
            dx, width = _poison((N, I)), 32 if part == "input_narrow" else 64
            kernel = "linear_backward_input_narrow_fast" if part == "input_narrow" else "linear_backward_input_fast"
            run = lambda: launch(kernel, (ceil_div(I, width), ceil_div(N, 64)), 256, dyd, wd, dx, I32(N), I32(I), I32(O))
            return Prepared(run, {"dx": dx}, {"dx": dx_want}, (2.0 * N * I * O, _bytes(dy, w, dx)))
        dw = _poison((O, I))
        splits, k_per_split = kernels.split_k(N, ceil_div(I, 64) * ceil_div(O, 64))
        partial = _poison(splits * O * I) if splits > 1 else dw

        def run():
            launch("linear_backward_weight_fast", (ceil_div(I, 64), ceil_div(O, 64), splits), 256, xd, dyd, partial,
                   I32(N), I32(I), I32(O), I32(k_per_split))
            if splits > 1:
                kernels.splitk_reduce(partial, splits, dw)
        return Prepared(run, {"dw": dw}, {"dw": dw_want}, (2.0 * N * I * O, _bytes(x, dy, dw)))
    return Case(f"linear_{part}_fast[fc1]", make)


def head_fast_case():
    def make(rng, d):
        import cupy
        N, H = d.batch, d.hidden
        h = np.maximum(_f32(rng, (N, H)), 0)  # relu outputs: about half are 0
        w, b = _f32(rng, (10, H), 1 / np.sqrt(H)), _f32(rng, 10)
        labels = rng.integers(0, 10, N).astype(np.int32)
        h64 = h.astype(np.float64)
        logits = ref.linear_forward(h64, w.astype(np.float64), b)
        loss, dlogits = ref.nll_loss(logits, labels)
        dh, dw, db = ref.linear_backward(h64, w.astype(np.float64), dlogits)
        d_pre = ref.relu_backward(dh, h64)
        blocks = ceil_div(N, kernels.HEAD_SAMPLES)
        outs = {"logits": _poison((N, 10)), "d_pre": _poison((N, H)), "dw": _poison((10, H)), "db": _poison(10),
                "d_bias_fc1": _poison(H), "loss": _poison(1)}
        log, count = _poison(3), cupy.array([1], dtype=cupy.int32)
        partial = _poison(blocks * kernels.head_sums(H))
        args = (_dev(h), _dev(w), _dev(b), _dev(labels, np.int32))

        def run():
            launch("head_forward_backward_fast", blocks, kernels.HEAD_THREADS, *args, I32(N), I32(H), I32(1),
                   outs["logits"], outs["d_pre"], partial)
            launch_1d("head_sum_parts", kernels.head_sums(H), partial, I32(blocks), I32(N), I32(H), outs["dw"],
                      outs["db"], outs["d_bias_fc1"], outs["loss"], log, count, I32(3))
        return Prepared(run, {**outs, "logged": log[1:2], "count": count},
                        {"logits": logits, "d_pre": d_pre, "dw": dw, "db": db, "d_bias_fc1": d_pre.sum(0),
                         "loss": [loss], "logged": [loss], "count": [2]},
                        (8.0 * N * H * 10, _bytes(h) * 2))
    return Case("head_forward_backward_fast+head_sum_parts", make)


def sgd_fast_case():
    def make(rng, d):
        n = sum(-(-int(np.prod(s)) // 4) * 4 for s in ref.param_shapes((d.c1, d.c2), d.hidden).values())
        p, g = _f32(rng, n), _f32(rng, n)
        pd, gd = _dev(p), _dev(g)
        run = lambda: launch_1d("sgd_update_zero_grad", n // 4, pd, gd, F32(0.05), I32(n // 4))
        return Prepared(run, {"params": pd, "grads": gd},
                        {"params": p.astype(np.float64) - np.float32(0.05) * g.astype(np.float64), "grads": np.zeros(n)},
                        (2.0 * n, 4 * _bytes(p)))
    return Case("sgd_update_zero_grad", make)


def fast_cases() -> list[Case]:
    return ([conv_stage_weights_case(v) for v in ("fast", "tf32")] + conv2_product_cases("fast")
            + conv2_product_cases("tf32")
            + [conv1_moments_case(), bn_stats_fast_case(), bn_relu_pool_fast_case(1, train=True)]
            + [bn_relu_pool_fast_case(layer) for layer in (1, 2)]
            + [block_backward_fast_case(layer) for layer in (1, 2)]
            + [linear_fast_case(part) for part in ("forward", "input", "input_narrow", "weight")]
            + [head_fast_case(), sgd_fast_case()])


def conv2_product_cases(version: str) -> list[Case]:
    """conv2's three products: version "fast" (3xTF32) or "tf32" (plain TF32, --tf32)."""
    return [conv_forward_case(2, version), conv_backward_input_case(version), conv_backward_weight_case(2, version)]


def naive_cases() -> list[Case]:
    cases = []
    for layer in (1, 2):
        cases += [conv_forward_case(layer), conv_backward_weight_case(layer), bn_stats_case(layer),
                  bn_apply_case(layer), bn_apply_case(layer, eval_mode=True), bn_backward_case(layer),
                  pool_case(layer), pool_case(layer, backward=True)]
    cases += [conv_backward_input_case(), relu_case(), relu_case(backward=True)]
    for layer in ("fc1", "fc2"):
        cases += [linear_case(layer, part) for part in ("forward", "input", "params")]
    cases += [normalize_case(), cross_entropy_case(), count_correct_case(), sgd_case()]
    return cases


def all_cases() -> list[Case]:
    return naive_cases() + fast_cases()


def check(prepared: Prepared) -> dict[str, float]:
    """Run once and return {output: relative error} (exact comparison for integer outputs)."""
    import cupy
    prepared.run()
    cupy.cuda.get_current_stream().synchronize()
    errors = {}
    for name, out in prepared.outputs.items():
        got, want = out.get(), np.asarray(prepared.expected[name])
        if name in prepared.compare:
            errors[name] = prepared.compare[name](got, want)
        elif got.dtype.kind in "iu":
            errors[name] = 0.0 if np.array_equal(got.ravel(), want.ravel()) else float("inf")
        else:
            errors[name] = rel_err(got, want)
    return errors
