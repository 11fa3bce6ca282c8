"""The kernel cases: every kernel against the float64 reference, as data. tests/test_gpu_kernels.py runs
them and dev/bench_kernels.py times them.

Every case launches through mnist_cuda.ops (the only code that knows grids, blocks and arguments), builds
fresh random inputs for given dimensions, poisons its outputs (NaN, or 255 for argmax) so that an
unwritten element fails, and returns a Prepared:
    run()      launches the kernel(s) on the current stream,
    outputs    {name: device array} to compare after run(),
    expected   {name: float64 / integer host array} from mnist_cuda.reference,
    work       (flops, bytes): the floor's two numbers, for the benchmark.

Run as a module, it lists the cases by op family (python -m mnist_cuda.kernel_cases [--family F]); no GPU
needed.

A case's name is the kernel it checks (several joined by "+"), with conv2's precision in angle brackets
as in the kernel's template instantiation ("conv2_forward_fast<tf32>") and the layer whose geometry it
takes in square brackets. Case.ops names the op families the case covers; OPS groups the cases by them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import numpy as np

from . import cuda, data
from . import reference as ref
from .cuda import ceil_div
from .ops import bn_relu_pool, head, linear_splitk, naive
from .ops import conv1_bn_relu_pool as conv1
from .ops import conv2_implicit_gemm as conv2
from .ops.common import NO_POSITION
from .ops.sgd_zero_grad import sgd_momentum_zero_grad, sgd_zero_grad
from .ops.splitk_reduce import splitk_reduce

EPS, MOMENTUM = ref.BN_EPS, ref.BN_MOMENTUM
# The op families, one per file of kernels/naive/. A fast case belongs to every family whose naive
# kernels its kernels replace (each kernels/fast/ file's header names them: "the fast form of naive/...").
FAMILIES = ("normalize", "conv2d", "batchnorm", "relu", "maxpool", "linear", "cross_entropy", "sgd", "shift")
BLOCK1_OPS = ("normalize", "conv2d", "batchnorm", "relu", "maxpool")  # conv1_bn_relu_pool.cu
BLOCK2_OPS = ("batchnorm", "relu", "maxpool")  # bn_relu_pool.cu


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
# 1e-6 to 1e-5; plain TF32 ones (conv2's <tf32> products, 10-bit mantissas) near 3e-4; bf16 ones (conv2's
# and fc1's <bf16> products, 7-bit stored mantissas) near 3e-3 (docs/design.md).
FP32_TOL, TF32_TOL, BF16_TOL = 1e-4, 1e-3, 1e-2
# The paired input gradient (near 2e-6) is held closer: its second set of accumulators is moved one column
# over by lane shuffles, and in a float64 model of it one lane's column taken wrong moves the result by ~6e-5,
# which FP32_TOL would pass.
PAIRED_TOL = 1e-5


@dataclasses.dataclass
class Case:
    name: str  # the kernel(s), conv2's precision, and which layer's geometry
    make: Callable[[np.random.Generator, Dims], Prepared]
    tol: float = FP32_TOL
    ops: tuple[str, ...] = ()  # the op families (FAMILIES) this case covers
    sm90a: bool = False  # its kernels exist only compiled for sm_90a (a Hopper GPU): see runnable()


def runnable(case: Case) -> bool:
    """Whether the case's kernels can run here (GPU present): an sm_90a-only case needs a Hopper GPU with
    the kernels compiled for it (mnist_cuda.cuda.arch_specific)."""
    return not case.sm90a or cuda.arch_specific()


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _exact(got, want) -> float:
    return 0.0 if np.array_equal(got, want) else float("inf")


def _same_bits(got, want) -> float:
    """Exact, bit for bit (bf16 pairs read as float32 can be NaN patterns)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    return (
        0.0 if got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)) else float("inf")
    )


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


def _tol(version: str) -> float:
    return {"tf32": TF32_TOL, "bf16": BF16_TOL}.get(version, FP32_TOL)


def _check_precision(precision: str):
    if precision not in conv2.KERNEL_PRECISION:
        raise ValueError(f"unknown precision {precision!r}; choose from {tuple(conv2.KERNEL_PRECISION)}")


# ---- conv2d ---------------------------------------------------------------------------------------


def _weight_quads(wd, C, K, precision, forward="forward", input_grad="backward_input"):
    """conv2's weights staged for both fast products by conv2_stage_weights_fast (once, as the step does
    once per step; the timings of the products leave it out), the forward's for `forward`, the input
    gradient's for `input_grad`."""
    import cupy

    fq = cupy.full((conv2.weight_quads(C, K, precision, forward), 4), np.nan, cupy.float32)
    gq = cupy.full((conv2.weight_quads(K, C, precision, input_grad), 4), np.nan, cupy.float32)
    conv2.stage_weights(wd, C, K, fq, gq, precision, forward, input_grad)
    return fq, gq


def split_tf32(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 v as the kernels split it (tensor_core.cuh): big = v with its low 13 mantissa bits cleared,
    small = v - big (exact in float32)."""
    v = np.asarray(v, np.float32)
    big = (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return big, v - big


def round_tf32(v: np.ndarray) -> np.ndarray:
    """float32 v rounded to the nearest TF32, ties away from zero (PTX cvt.rna.tf32.f32; finite v)."""
    bits = np.asarray(v, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def round_bf16_bits(v: np.ndarray) -> np.ndarray:
    """The bf16 bits (uint16) of float32 v rounded to the nearest, ties to even (PTX cvt.rn.bf16x2.f32;
    finite v)."""
    bits = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def weight_quads(w: np.ndarray, product: str, precision: str = "fp32") -> np.ndarray:
    """What conv2_stage_weights_fast writes for one product, from w [K, C, 3, 3]
    (fast/conv2_implicit_gemm.cu): the forward's (`product` "forward" or "forward_stacked") or the input
    gradient's (flipped; `product` "backward_input" or "backward_input_paired"). Float4s
    [tile][chunk][tap][quad][row] holding channels chunk*8 + quad*4 + 0..3 of an output channel of the tile.
    In fp32 the rows hold the big TF32 parts of the tile's channels, then their small parts: 64 channels (128
    rows) for "forward", 32 (64 rows) for "forward_stacked" and "backward_input". "backward_input_paired" lays
    out a kernel row's three taps together, [tile][chunk][kernel row][quad][192 rows]: runs of 32 rows holding
    the small parts of column 0, the big parts of columns 0 and 1, the small parts of column 1, the big and
    small parts of column 2. With tf32: output channel tile*64 + row, rounded to the nearest TF32. With bf16:
    quads of 8 bf16 values (channels chunk*16 + quad*8 + 0..7, as float32 bit patterns, 4 per quad) of output
    channel tile*64 + row."""
    flipped = product.startswith("backward_input")
    wt = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1] if flipped else w  # [out, in, 3, 3], taps flipped
    c_out, c_in = wt.shape[:2]
    tile, chunk = conv2.tile_channels(product, precision), conv2.chunk_channels(precision)
    tiles, chunks = ceil_div(c_out, tile), ceil_div(c_in, chunk)
    padded = np.zeros((tiles * tile, chunks * chunk, 9), np.float32)
    padded[:c_out, :c_in] = wt.reshape(c_out, c_in, 9)
    # [tile, row, chunk, quad, i, tap] -> [tile, chunk, tap, quad, row, i]
    v = padded.reshape(tiles, tile, chunks, 2, chunk // 2, 9).transpose(0, 2, 5, 3, 1, 4)
    if precision == "bf16":
        return np.ascontiguousarray(round_bf16_bits(v)).view(np.float32).reshape(-1, 4)
    if precision == "tf32":
        return round_tf32(v).reshape(-1, 4)
    big, small = split_tf32(v)
    if product != "backward_input_paired":
        return np.concatenate([big, small], axis=4).reshape(-1, 4)
    big, small = (a.reshape(tiles, chunks, 3, 3, 2, tile, 4) for a in (big, small))  # taps as (row, column)
    runs = (small[:, :, :, 0], big[:, :, :, 0], big[:, :, :, 1], small[:, :, :, 1], big[:, :, :, 2], small[:, :, :, 2])
    return np.concatenate(runs, axis=4).reshape(-1, 4)


def conv_stage_weights_case(precision="fp32", forward="forward", input_grad="backward_input"):
    """conv2_stage_weights_fast, the forward's weights for `forward` ("forward", or "forward_stacked" in fp32) and
    the input gradient's for `input_grad` ("backward_input", or "backward_input_paired" in fp32)."""
    _check_precision(precision)

    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        w = _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        fq = _poison((conv2.weight_quads(C, K, precision, forward), 4))
        gq = _poison((conv2.weight_quads(K, C, precision, input_grad), 4))
        wd = _dev(w)
        run = lambda: conv2.stage_weights(wd, C, K, fq, gq, precision, forward, input_grad)
        return Prepared(
            run,
            {"forward_quads": fq, "input_grad_quads": gq},
            {
                "forward_quads": weight_quads(w, forward, precision),
                "input_grad_quads": weight_quads(w, input_grad, precision),
            },
            (0.0, _bytes(w, fq, gq)),
            compare={"forward_quads": _same_bits, "input_grad_quads": _same_bits},
        )

    suffix = (" stacked forward" if forward == "forward_stacked" else "") + (
        " paired input gradient" if input_grad == "backward_input_paired" else ""
    )
    return Case(f"conv2_stage_weights_fast<{precision}>[conv2]{suffix}", make, ops=("conv2d",))


def conv_forward_case(layer, version="naive", forward="forward"):
    """conv2d_forward_naive (layer 1 or 2), or conv2's fast forward `forward` ("forward": conv2_forward_fast, or
    "forward_stacked": conv2_forward_stacked_fast, fp32 only) at precision `version` (layer 2)."""
    if version != "naive":
        _check_precision(version)
        assert layer == 2, "the implicit-GEMM products are conv2's"

    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        xd, wd, y = _dev(x), _dev(w), _poison((N, K, S, S))
        if version == "naive":
            run = lambda: naive.conv2d_forward(xd, wd, y, N, C, K, S)
        else:
            forward_quads, _ = _weight_quads(wd, C, K, version, forward)
            run = lambda: conv2.forward(xd, forward_quads, y, N, C, K, version, forward)
        return Prepared(
            run, {"y": y}, {"y": ref.conv2d_forward(x.astype(np.float64), w)}, (2.0 * y.size * C * 9, _bytes(x, w, y))
        )

    name = (
        "conv2d_forward_naive"
        if version == "naive"
        else "conv2_forward_stacked_fast"
        if forward == "forward_stacked"
        else f"conv2_forward_fast<{version}>"
    )
    return Case(f"{name}[conv{layer}]", make, _tol(version), ops=("conv2d",))


def conv_backward_input_case(version="naive", product="backward_input"):
    """conv2d_backward_input_naive, or conv2's fast input gradient `product` ("backward_input":
    conv2_backward_input_fast, or "backward_input_paired": conv2_backward_input_paired_fast, fp32 only) at
    precision `version`."""
    if version != "naive":
        _check_precision(version)

    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        dyd, wd, dx = _dev(dy), _dev(w), _poison((N, C, S, S))
        if version == "naive":
            run = lambda: naive.conv2d_backward_input(dyd, wd, dx, N, C, K, S)
        else:
            _, input_grad_quads = _weight_quads(wd, C, K, version, input_grad=product)
            run = lambda: conv2.backward_input(dyd, input_grad_quads, dx, N, C, K, version, product)
        want, _ = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dx": dx}, {"dx": want}, (2.0 * dx.size * K * 9, _bytes(dy, w, dx)))

    name = (
        "conv2d_backward_input_naive"
        if version == "naive"
        else "conv2_backward_input_paired_fast"
        if product == "backward_input_paired"
        else f"conv2_backward_input_fast<{version}>"
    )
    return Case(
        f"{name}[conv2]", make, PAIRED_TOL if product == "backward_input_paired" else _tol(version), ops=("conv2d",)
    )


def conv_backward_weight_case(layer, version="naive"):
    """conv2d_backward_weight_naive, or conv2_backward_weight_fast's partial results summed by
    splitk_reduce_fast (layer 2), as the fast step runs them."""
    if version != "naive":
        _check_precision(version)
        assert layer == 2, "the implicit-GEMM products are conv2's"

    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        xd, dyd, dw = _dev(x), _dev(dy), _poison((K, C, 3, 3))
        if version == "naive":
            run = lambda: naive.conv2d_backward_weight(xd, dyd, dw, N, C, K, S)
        else:
            partial = _poison(conv2.weight_grad_partial_size(C, K))

            def run():
                parts = conv2.backward_weight(xd, dyd, partial, N, C, K, version)
                splitk_reduce(partial, parts, dw)

        _, want = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dw": dw}, {"dw": want}, (2.0 * dw.size * N * S * S, _bytes(x, dy, dw)))

    name = (
        "conv2d_backward_weight_naive"
        if version == "naive"
        else f"conv2_backward_weight_fast<{version}>+splitk_reduce_fast"
    )
    return Case(f"{name}[conv{layer}]", make, _tol(version), ops=("conv2d",))


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


# ---- linear, loss, sgd ---------------------------------------------------------------------------


def _linear_geometry(d: Dims, layer: str):
    return (d.batch, d.c2 * 49, d.hidden) if layer == "fc1" else (d.batch, d.hidden, 10)


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


def count_correct_case():
    def make(rng, d):
        import cupy

        N = d.batch
        logits, labels = _f32(rng, (N, 10)), rng.integers(0, 10, N).astype(np.int32)
        correct = cupy.array([5], dtype=cupy.int32)  # accumulates
        args = (_dev(logits), _dev(labels, np.int32))
        run = lambda: naive.count_correct(*args, correct, N)
        want = 5 + int((logits.argmax(1) == labels).sum())
        return Prepared(run, {"correct": correct}, {"correct": [want]}, (10.0 * N, _bytes(logits)))

    return Case("count_correct", make, ops=("cross_entropy",))


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


def blocked_positions(pooled, argmax):
    """A block's argmax as its fast kernels store it: NO_POSITION where the ReLU blocked the window."""
    return np.where(pooled > 0, argmax, NO_POSITION).astype(np.uint8)


def positions_near_ties(windows, peak):
    """argmax_near_ties for the fast kernels' argmax with NO_POSITION. peak: each window's largest value before the
    ReLU, in float64. A window may be marked blocked or not against the reference only where its peak is
    within 1e-5 of zero; a byte that is neither a position nor NO_POSITION fails."""

    def compare(got, want):
        got = got.reshape(want.shape)
        if np.any((got > 3) & (got != NO_POSITION)):
            return float("inf")
        blocked_got, blocked_want = got == NO_POSITION, want == NO_POSITION
        if np.any((blocked_got != blocked_want) & (np.abs(peak) > 1e-5)):
            return float("inf")
        both = ~blocked_got & ~blocked_want
        return argmax_near_ties(windows[both])(got[both], want[both])

    return compare


def values_at_positions(a_windows, z_windows, peak):
    """A comparison for batchnorm_relu_maxpool_fast's x_at, a's value at the window's chosen position: where
    the ReLU passed the window (peak above 1e-5), it must be exactly a's value at a position whose z is within
    1e-5 of the peak (argmax_near_ties' rule). Blocked windows are not compared: their position is never read."""

    def compare(got, want):
        got = got.reshape(peak.shape).astype(np.float64)
        passed = peak > 1e-5
        near = np.abs(z_windows - peak[..., None]) <= 1e-5 * np.maximum(1.0, np.abs(peak))[..., None]
        ok = ((a_windows == got[..., None]) & near).any(axis=-1)
        return 0.0 if ok[passed].all() else float("inf")

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
    shifted = np.stack([xp[:, i : i + 28, j : j + 28].ravel() for i in range(3) for j in range(3)])
    gram = shifted @ shifted.T
    return np.concatenate([shifted.sum(axis=1)] + [gram[t, t:] for t in range(9)])


def conv1_moments_case():
    """conv1_image_moments_fast: the batch's image moments (conv1's BatchNorm statistics come from them)."""

    def make(rng, d):
        N = d.batch
        x, xd = _block_input(rng, d, 1, 1.0, 0.0)
        parts, _ = conv1.moments_parts(N)
        moment_partial = _poison((parts, conv1.CONV1_MOMENTS), np.float64)
        counter = _dev(np.zeros(1), np.uint32)
        moments = _poison(conv1.CONV1_MOMENTS, np.float64)
        run = lambda: conv1.image_moments(xd, N, moment_partial, counter, moments)
        return Prepared(
            run,
            {"moments": moments, "counter": counter},
            {"moments": image_moments(x), "counter": [0]},
            (2.0 * 4 * conv1.CONV1_MOMENTS * N * 196, _bytes(xd)),
        )  # 4 outputs per window, in double

    return Case("conv1_image_moments_fast[block1]", make, ops=("normalize", "conv2d", "batchnorm"))


def bn_stats_fast_case():
    """batchnorm_stats_fast (BN2's statistics over conv2's output)."""

    def make(rng, d):
        N, C_in, K, S = _geometry(d, 2)
        x, xd = _block_input(rng, d, 2, 2.0, 0.5)
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        mean, var, invstd = _bn_batch_stats(x.astype(np.float64))
        want_rm, want_rv = ref.batchnorm_running_update(
            rm.astype(np.float64), rv.astype(np.float64), mean, var, N * S * S
        )
        partial = _poison(bn_relu_pool.partial_size(K))
        counter = _dev(np.zeros(K), np.uint32)  # at least one per channel group
        outs = {k: _poison(K) for k in ("mean", "invstd")}
        rmd, rvd = _dev(rm), _dev(rv)
        run = lambda: bn_relu_pool.stats(
            xd, N, K, S * S, partial, counter, EPS, MOMENTUM, outs["mean"], outs["invstd"], rmd, rvd
        )
        return Prepared(
            run,
            {**outs, "running_mean": rmd, "running_var": rvd, "counter": counter},
            {"mean": mean, "invstd": invstd, "running_mean": want_rm, "running_var": want_rv, "counter": np.zeros(K)},
            (3.0 * x.size, 2 * _bytes(x)),
        )

    return Case("batchnorm_stats_fast[bn2]", make, ops=("batchnorm",))


def bn_eval_stats_fast_case():
    """batchnorm_eval_stats_fast: for evaluation, the statistics the fused forwards normalise with become
    the running ones (mean = running_mean, invstd = 1/sqrt(running_var + eps))."""

    def make(rng, d):
        K = d.c2
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        mean, invstd = _poison(K), _poison(K)
        rmd, rvd = _dev(rm), _dev(rv)
        run = lambda: bn_relu_pool.eval_stats(rmd, rvd, EPS, K, mean, invstd)
        return Prepared(
            run,
            {"mean": mean, "invstd": invstd},
            {"mean": rm, "invstd": 1 / np.sqrt(rv.astype(np.float64) + ref.BN_EPS)},
            (2.0 * K, 4 * _bytes(rm)),
        )

    return Case("batchnorm_eval_stats_fast[bn2]", make, ops=("batchnorm",))


def bn_relu_pool_fast_case(layer, train=False, per_block=None):
    """conv1_bn_relu_pool_fast (layer 1, per_block channels per block) or batchnorm_relu_maxpool_fast:
    pooled = maxpool(relu(bn(a))) with given statistics; for layer 1 in training (train=True) with the
    batch's own, from its image moments (the kernel also saves them and updates the running statistics)."""

    def make(rng, d):
        N, C_in, K, S = _geometry(d, layer)
        (x, xd), w = _block_input(rng, d, layer, 1.0, 0.0), _f32(rng, (K, C_in, 3, 3), 1 / 3)
        mean, invstd, gamma, beta = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5, _f32(rng, K), _f32(rng, K, 0.5)
        a = ref.conv2d_forward(x.astype(np.float64), w) if layer == 1 else x.astype(np.float64)
        outs, expected, stats = {}, {}, [_dev(v) for v in (mean, invstd, gamma, beta)]
        if train:
            rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
            mean, var, invstd = _bn_batch_stats(a)
            want_rm, want_rv = ref.batchnorm_running_update(
                rm.astype(np.float64), rv.astype(np.float64), mean, var, N * S * S
            )
            outs.update(mean=_poison(K), invstd=_poison(K), running_mean=_dev(rm), running_var=_dev(rv))
            stats[:2] = outs["mean"], outs["invstd"]  # written by the kernel
            expected.update(mean=mean, invstd=invstd, running_mean=want_rm, running_var=want_rv)
        bn = [v.astype(np.float64)[:, None, None] for v in (mean, invstd, gamma, beta)]
        z = (a - bn[0]) * bn[1] * bn[2] + bn[3]
        pooled, argmax, windows = _pool_reference(z)
        # both blocks mark the windows the ReLU blocked
        peak = ref._pool_windows(z).max(axis=-1)
        argmax, compare = blocked_positions(pooled, argmax), positions_near_ties(windows, peak)
        outs["pooled"], outs["argmax"] = _poison(pooled.shape), _poison(pooled.shape, np.uint8)
        expected.update(pooled=pooled, argmax=argmax)
        y, am = outs["pooled"], outs["argmax"]
        if layer == 1:
            wd, moments = _dev(w), _dev(image_moments(x), np.float64)
            running = (outs["running_mean"], outs["running_var"]) if train else (stats[0], stats[1])  # (unused in eval)
            run = lambda: conv1.forward(
                xd,
                wd,
                train,
                moments,
                EPS,
                MOMENTUM,
                stats[0],
                stats[1],
                *running,
                stats[2],
                stats[3],
                N,
                K,
                y,
                am,
                per_block=per_block,
            )
            work = (2.0 * a.size * 9, _bytes(xd) + pooled.nbytes / 2)
            return Prepared(run, outs, expected, work, compare={"argmax": compare})
        a_windows = ref._pool_windows(x.astype(np.float64))
        outs["x_at"] = _poison(pooled.shape)
        expected["x_at"] = np.take_along_axis(a_windows, argmax.astype(np.int64)[..., None] % 4, -1)[..., 0]
        run = lambda: bn_relu_pool.forward(xd, *stats, N, K, S, y, am, outs["x_at"])
        work = (3.0 * x.size, _bytes(x) + pooled.nbytes + argmax.nbytes)
        return Prepared(
            run,
            outs,
            expected,
            work,
            compare={"argmax": compare, "x_at": values_at_positions(a_windows, ref._pool_windows(z), peak)},
        )

    mode = "[train]" if train else "[eval]"
    if layer == 1:
        return Case(f"conv1_bn_relu_pool_fast<{per_block}>[block1]{mode}", make, ops=BLOCK1_OPS)
    assert not train, "block 2's statistics come from batchnorm_stats_fast"
    return Case("batchnorm_relu_maxpool_fast[block2]", make, ops=BLOCK2_OPS)


def block_backward_fast_case(layer, per_block=None):
    """The BN backward of a block from its pooled gradient: layer 1 runs conv1_backward_fast (-> dgamma,
    dbeta, dw; from the batch's image moments; per_block channels per block); layer 2 runs
    batchnorm_backward_reduce_fast + batchnorm_backward_apply_fast (-> dgamma, dbeta, dx)."""

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
        counters = _dev(np.zeros((2, K)), np.uint32)  # per kernel, at least one per channel group
        dg, db = _poison(K), _poison(K)
        common = [_dev(v) for v in (mean, invstd)]
        wd, gd = _dev(w), _dev(gamma)
        if layer == 1:
            dw = _poison(w.shape)
            partial = _poison(conv1.backward_partial_size(K))
            moments = _dev(image_moments(x), np.float64)
            pooled_in = (_dev(d_pooled), _dev(blocked_positions(pooled, argmax), np.uint8))  # no pooled values
            run = lambda: conv1.backward(
                xd, wd, *common, gd, moments, *pooled_in, N, K, partial, counters[0], dg, db, dw, per_block=per_block
            )
            _, want_dw = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), da)
            return Prepared(
                run,
                {"dgamma": dg, "dbeta": db, "dw": dw, "counters": counters},
                {"dgamma": dgamma, "dbeta": dbeta, "dw": want_dw, "counters": np.zeros((2, K))},
                (2.0 * pooled.size * conv1.CONV1_GRAD_SUMS, _bytes(xd) + 1.25 * pooled.nbytes),
            )
        dx = _poison(x.shape)
        partial = _poison(bn_relu_pool.partial_size(K))
        pooled_in = (_dev(d_pooled), _dev(blocked_positions(pooled, argmax), np.uint8))  # no pooled values
        # x at the argmax, as the forward stores it (float32 values picked, so exact)
        x_at = _dev(np.take_along_axis(ref._pool_windows(x), argmax.astype(np.int64)[..., None], -1)[..., 0])

        def run():
            bn_relu_pool.backward_reduce(x_at, *common, *pooled_in, N, K, S, partial, counters[0], dg, db)
            bn_relu_pool.backward_apply(xd, *common, gd, dg, db, *pooled_in, N, K, S, dx)

        # reads: x and the pooled gradient, argmax twice and x_at once (float64 pooled: 8 bytes a value)
        return Prepared(
            run,
            {"dgamma": dg, "dbeta": db, "dx": dx, "counters": counters},
            {"dgamma": dgamma, "dbeta": dbeta, "dx": da, "counters": np.zeros((2, K))},
            (8.0 * x.size, 2 * _bytes(x) + 1.75 * pooled.nbytes),
        )

    if layer == 1:
        return Case(f"conv1_backward_fast<{per_block}>[block1]", make, ops=BLOCK1_OPS)
    return Case("batchnorm_backward_reduce_fast+batchnorm_backward_apply_fast[block2]", make, ops=BLOCK2_OPS)


def linear_fast_case(part, narrow=False, precision="fp32", form="tiled"):
    """fc1's products: forward (+ bias + ReLU in splitk_reduce_fast), input gradient and weight gradient, at
    precision "fp32" (3xTF32) or "bf16", in the tiled form (the input gradient in 64-wide tiles, or 32-wide
    with narrow; the weight gradient split-K where the batch is long enough) or, for the input gradient,
    the wgmma form (sm_90a)."""

    def make(rng, d):
        N, I, O = _linear_geometry(d, "fc1")
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        xd, wd, bd, dyd = _dev(x), _dev(w), _dev(b), _dev(dy)
        if part == "forward":
            y = _poison((N, O))
            partial = _poison(linear_splitk.forward_partial_size(N, I, O))
            run = lambda: linear_splitk.forward(xd, wd, bd, partial, y, N, I, O, precision)
            return Prepared(
                run,
                {"y": y},
                {"y": ref.relu_forward(ref.linear_forward(x64, w64, b))},
                (2.0 * N * I * O, _bytes(x, w, y)),
            )
        dx_want, dw_want, _ = ref.linear_backward(x64, w64, dy64)
        if part == "backward_input":
            dx = _poison((N, I))
            run = lambda: linear_splitk.backward_input(
                dyd, wd, dx, N, I, O, narrow=narrow, precision=precision, form=form
            )
            return Prepared(run, {"dx": dx}, {"dx": dx_want}, (2.0 * N * I * O, _bytes(dy, w, dx)))
        dw = _poison((O, I))
        partial = _poison(linear_splitk.weight_partial_size(N, I, O))
        run = lambda: linear_splitk.backward_weight(xd, dyd, dw, partial, N, I, O, precision)
        return Prepared(run, {"dw": dw}, {"dw": dw_want}, (2.0 * N * I * O, _bytes(x, dy, dw)))

    assert part in ("forward", "backward_input", "backward_weight") and form in linear_splitk.FORMS
    assert not narrow or (part, form) == ("backward_input", "tiled")
    assert form == "tiled" or part == "backward_input"
    assert precision in ("fp32", "bf16"), "fc1 runs in 3xTF32 or in bf16 (linear_splitk.KERNEL_PRECISION)"
    ops = ("linear", "relu") if part == "forward" else ("linear",)  # the forward's ReLU is in splitk_reduce
    p, wg = f"<{precision}>", "_wgmma" if form == "wgmma" else ""
    name = {
        "forward": f"linear_forward_fast{p}+splitk_reduce_fast",
        "backward_input": f"linear_backward_input_narrow_fast{p}" if narrow else f"linear_backward_input{wg}_fast{p}",
        "backward_weight": f"linear_backward_weight_fast{p}",
    }[part]
    return Case(f"{name}[fc1]", make, _tol(precision), ops=ops, sm90a=form == "wgmma")


def linear_fast_cases(precision: str) -> list[Case]:
    """Every form of fc1's three products at `precision`."""
    return [
        linear_fast_case("forward", precision=precision),
        linear_fast_case("backward_input", narrow=False, precision=precision),
        linear_fast_case("backward_input", narrow=True, precision=precision),
        linear_fast_case("backward_input", precision=precision, form="wgmma"),
        linear_fast_case("backward_weight", precision=precision),
    ]


def head_fast_case():
    """head_forward_backward_fast + head_sum_parts_fast: fc2, log_softmax, NLL and their backward down to
    fc1's pre-activation (fc1's ReLU mask applied)."""

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
        outs = {
            "logits": _poison((N, 10)),
            "d_pre": _poison((N, H)),
            "dw": _poison((10, H)),
            "db": _poison(10),
            "d_bias_fc1": _poison(H),
            "loss": _poison(1),
        }
        log, count = _poison(3), cupy.array([1], dtype=cupy.int32)  # appends at index 1 of a log of 3
        partial = _poison(head.partial_size(N, H))
        args = (_dev(h), _dev(w), _dev(b), _dev(labels, np.int32))

        def run():
            head.forward_backward(*args, N, H, True, outs["logits"], outs["d_pre"], partial)
            head.sum_parts(partial, N, H, outs["dw"], outs["db"], outs["d_bias_fc1"], outs["loss"], log, count)

        return Prepared(
            run,
            {**outs, "logged": log[1:2], "count": count},
            {
                "logits": logits,
                "d_pre": d_pre,
                "dw": dw,
                "db": db,
                "d_bias_fc1": d_pre.sum(0),
                "loss": [loss],
                "logged": [loss],
                "count": [2],
            },
            (8.0 * N * H * 10, _bytes(h) * 2),
        )

    return Case("head_forward_backward_fast+head_sum_parts_fast[fc2]", make, ops=("linear", "relu", "cross_entropy"))


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
    from .optim import Schedule

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
            naive.sgd_schedule(state, lr_d, first_d, schedule.kernel_args(lr))
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
    return Case(f"sgd_schedule+{kernel}[{'later' if started else 'first'} step]", make, ops=("sgd",))


def shift_case():
    """shift_images_naive: every image moved by its own offset, exactly as numpy moves it."""

    def make(rng, d):
        n, size = d.batch, data.IMAGE_SIZE
        images = rng.integers(0, 256, (n, 1, size, size), dtype=np.uint8)
        offsets = rng.integers(-3, 4, (n, 2)).astype(np.int8)
        xd, od, out = _dev(images, np.uint8), _dev(offsets, np.int8), _poison((n, 1, size, size), np.uint8)
        run = lambda: naive.shift_images(xd, od, out, n)
        want = ref.shift_images(images, offsets)
        return Prepared(run, {"x": out}, {"x": want}, (0.0, 2.0 * images.nbytes), compare={"x": _exact})

    return Case("shift_images_naive", make, ops=("shift",))


# ---- the lists ------------------------------------------------------------------------------------


def conv2_product_cases(version: str) -> list[Case]:
    """conv2's three products at precision `version` (conv2_implicit_gemm.KERNEL_PRECISION): "fp32" (3xTF32),
    "tf32" (plain TF32, train --precision tf32) or "bf16" (train --precision bf16)."""
    stacked = [conv_forward_case(2, version, "forward_stacked")] if version == "fp32" else []
    paired = [conv_backward_input_case(version, "backward_input_paired")] if version == "fp32" else []
    return (
        [conv_forward_case(2, version)]
        + stacked
        + [conv_backward_input_case(version)]
        + paired
        + [conv_backward_weight_case(2, version)]
    )


def fast_cases() -> list[Case]:
    return (
        [conv_stage_weights_case(p) for p in conv2.KERNEL_PRECISION]
        + [conv_stage_weights_case("fp32", "forward_stacked")]
        + [conv_stage_weights_case("fp32", input_grad="backward_input_paired")]
        + [case for p in conv2.KERNEL_PRECISION for case in conv2_product_cases(p)]
        + [conv1_moments_case(), bn_stats_fast_case(), bn_eval_stats_fast_case()]
        + [
            bn_relu_pool_fast_case(1, train, per_block)
            for train in (True, False)
            for per_block in conv1.FORWARD_CHANNELS
        ]
        + [bn_relu_pool_fast_case(2)]
        + [block_backward_fast_case(1, per_block) for per_block in conv1.BACKWARD_CHANNELS]
        + [block_backward_fast_case(2)]
        + [case for p in ("fp32", "bf16") for case in linear_fast_cases(p)]
        + [head_fast_case(), sgd_fast_case()]
        + [sgd_momentum_case("fast", started) for started in (False, True)]
    )


def naive_cases() -> list[Case]:
    cases = []
    for layer in (1, 2):
        cases += [
            conv_forward_case(layer),
            conv_backward_weight_case(layer),
            bn_stats_case(layer),
            bn_apply_case(layer),
            bn_apply_case(layer, eval_mode=True),
            bn_backward_case(layer),
            pool_case(layer),
            pool_case(layer, backward=True),
        ]
    cases += [conv_backward_input_case(), relu_case(), relu_case(backward=True)]
    for layer in ("fc1", "fc2"):
        cases += [linear_case(layer, part) for part in ("forward", "backward_input", "backward_params")]
    cases += [normalize_case(), cross_entropy_case(), count_correct_case(), sgd_case()]
    cases += [sgd_momentum_case("naive", started) for started in (False, True)]
    cases += [shift_case()]
    return cases


def all_cases() -> list[Case]:
    return naive_cases() + fast_cases()


def _group(cases: list[Case]) -> dict[str, list[Case]]:
    return {family: [c for c in cases if family in c.ops] for family in FAMILIES}


# The cases by op family (FAMILIES, the files of kernels/naive/): each family's naive cases first, then
# every fast case whose kernels replace some of its work. A fused fast kernel replaces several ops and
# so is listed under each: conv1's kernels under normalize, conv2d, batchnorm, relu and maxpool (they
# read the bytes and normalise as they stage, and never store conv1's output); block 2's BatchNorm +
# ReLU + maxpool under those three; fc1's forward under linear and relu (its ReLU runs in
# splitk_reduce_fast); the head under linear (fc2), relu (fc1's ReLU backward) and cross_entropy.
OPS: dict[str, list[Case]] = _group(all_cases())


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


def main(argv=None) -> int:
    from .cli import Parser, prog_name

    p = Parser(
        prog=prog_name("mnist_cuda.kernel_cases"),
        description="List the kernel cases (every kernel against the float64 reference) by op family. "
        "tests/test_gpu_kernels.py runs them on a GPU; dev/bench_kernels.py times them.",
    )
    p.add_argument("--family", choices=FAMILIES, default=None, help="list this op family's cases only")
    args = p.parse_args(argv)
    for family, cases in OPS.items():
        if args.family in (None, family):
            print(f"{family}: " + ", ".join(c.name + (" (sm_90a)" if c.sm90a else "") for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
