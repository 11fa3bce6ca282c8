"""The launch contracts of kernels/fast/3_bn_relu_pool.cu: block 2's BatchNorm statistics, BatchNorm + ReLU +
maxpool fused, and their backward from the pooled gradient.

Every launch but eval_stats, stats_from_parts and stats_from_tiles steps `models` models at once (the grid's z): its
sizes are one model's (n is the per-model batch) and its buffers hold the models' parts one after another
([models][...]: activations [models][n][...], mean and invstd [models][channels], partial [models][partial_size],
counter [models][groups]); gamma, beta and their gradients are param_stride floats apart, the running statistics
running_stride.

conv2's output a and its gradient d_a, and block 2's pooled output and its gradient (fc1's input and its gradient), are
float32 arrays, or bf16 ones (common.BF16) in --precision bf16: the kernel is chosen by their dtype. Everything else is
float32."""

from __future__ import annotations

import numpy as np

from ..cuda import ceil_div
from .common import F32, I32, MAX_PARTS, STORED_TYPES, parts_of, source, stored_kernel, stored_kernels

BN_CHANNELS = 8  # channels per block of the reductions: a warp each
BN_THREADS = 32 * BN_CHANNELS
FROM_TILES_THREADS = 512  # stats_from_tiles: a block per channel
# forward's and backward_apply's staged forms: a block of STAGED_THREADS threads per STAGED_PLANES (image, channel)
# planes, each of at most STAGED_WINDOWS pooled windows (conv2's 14x14 output has 49), from STAGED_MIN_BATCH images of
# one model (by the op and the stored type; below it a thread per window: form_of)
STAGED_PLANES, STAGED_THREADS, STAGED_WINDOWS = 32, 256, 64
STAGED_OPS = ("forward", "backward_apply")
STAGED_MIN_BATCH = {"forward": {"float": 512, "bfloat16": 256}, "backward_apply": {"float": 2048, "bfloat16": 256}}
FORMS = ("windows", "staged")

_src = source(
    "fast/3_bn_relu_pool.cu",
    BN_CHANNELS=BN_CHANNELS,
    BN_THREADS=BN_THREADS,
    BN_TILES_THREADS=FROM_TILES_THREADS,
    BN_STAGED_PLANES=STAGED_PLANES,
    BN_STAGED_THREADS=STAGED_THREADS,
    BN_STAGED_WINDOWS=STAGED_WINDOWS,
)
_stats = stored_kernels(_src, "batchnorm_stats_fast")
_stats_from_parts = _src.kernel("batchnorm_stats_from_parts_fast")
_stats_from_tiles = _src.kernel("batchnorm_stats_from_tiles_fast")
FROM_PARTS_MAX = 32 * 16  # the parts stats_from_parts merges at most (BN_FROM_PARTS_PER_LANE a lane)
_eval_stats = _src.kernel("batchnorm_eval_stats_fast")
_forward = {
    "windows": stored_kernels(_src, "batchnorm_relu_maxpool_fast"),
    "staged": stored_kernels(_src, "batchnorm_relu_maxpool_staged_fast"),
}
_backward_reduce = stored_kernels(_src, "batchnorm_backward_reduce_fast")
_backward_apply = {
    "windows": stored_kernels(_src, "batchnorm_backward_apply_fast"),
    "staged": stored_kernels(_src, "batchnorm_backward_apply_staged_fast"),
}


def _grid(parts: int, channels: int, models: int) -> tuple:
    """The reductions' grid: a block per part and channel group, of each model (z); one model's as it was."""
    groups = ceil_div(channels, BN_CHANNELS)
    return (parts, groups) if models == 1 else (parts, groups, models)


def partial_size(channels: int) -> int:
    """Scratch of stats and backward_reduce (float32) for one model: a (channel, part) pair each."""
    return MAX_PARTS * channels * 2


def stats(
    a,
    n: int,
    channels: int,
    hw: int,
    partial,
    counter,
    eps: float,
    momentum: float,
    mean,
    invstd,
    running_mean,
    running_var,
    models: int = 1,
    running_stride: int = 0,
):
    """The batch's mean and 1/std of a [n, channels, hw], and the running statistics' update (in place).
    counter: one uint32 per group of BN_CHANNELS channels (and model), zero, left zero."""
    parts, per_part = parts_of(n)
    stored_kernel(_stats, "a", a).launch(
        _grid(parts, channels, models),
        BN_THREADS,
        a,
        I32(n),
        I32(channels),
        I32(hw),
        I32(per_part),
        partial,
        counter,
        F32(eps),
        F32(momentum),
        mean,
        invstd,
        running_mean,
        running_var,
        I32(running_stride),
        models=models,
    )


def stats_from_parts(
    partial,
    parts: int,
    tiles: int,
    tile_values: int,
    channels: int,
    eps: float,
    momentum: float,
    mean,
    invstd,
    running_mean,
    running_var,
):
    """stats' results (one model) from per-part (mean, M2) pairs partial [channels, parts, 2]: part b holds the
    values of tiles b, b + parts, .. of `tiles` tiles, tile_values values of each channel a tile (conv2's persistent
    forward leaves them: conv2_implicit_gemm.forward's moment_parts)."""
    if not 1 <= parts <= min(FROM_PARTS_MAX, tiles):
        raise ValueError(f"{parts} parts of {tiles} tiles; 1 to {FROM_PARTS_MAX} parts, none of them empty")
    _stats_from_parts.launch(
        (ceil_div(channels, BN_CHANNELS),),
        BN_THREADS,
        partial,
        I32(parts),
        I32(tiles),
        I32(tile_values),
        I32(channels),
        F32(eps),
        F32(momentum),
        mean,
        invstd,
        running_mean,
        running_var,
    )


def stats_from_tiles(
    partial,
    tiles: int,
    tile_values: int,
    channels: int,
    eps: float,
    momentum: float,
    mean,
    invstd,
    running_mean,
    running_var,
):
    """stats' results (one model) from per-tile (mean, M2) pairs partial [channels, tiles, 2], tile_values values of
    each channel a tile (conv2's fp32 forward leaves them a block per tile: conv2_implicit_gemm.forward's
    moment_parts)."""
    if tiles < 1 or tile_values < 1:
        raise ValueError(f"{tiles} tiles of {tile_values} values; at least one of each")
    if partial.size < channels * tiles * 2:
        raise ValueError(f"partial holds {partial.size} floats; {channels} x {tiles} pairs needed")
    _stats_from_tiles.launch(
        (channels,),
        FROM_TILES_THREADS,
        partial,
        I32(tiles),
        I32(tile_values),
        F32(eps),
        F32(momentum),
        mean,
        invstd,
        running_mean,
        running_var,
    )


def eval_stats(running_mean, running_var, eps: float, channels: int, mean, invstd):
    """For evaluation: mean, invstd from the running statistics, where the fused forwards read them."""
    _eval_stats.launch_1d(channels, running_mean, running_var, F32(eps), I32(channels), mean, invstd)


def forward(
    a,
    mean,
    invstd,
    gamma,
    beta,
    n: int,
    channels: int,
    size: int,
    pooled,
    argmax,
    a_at,
    models: int = 1,
    param_stride: int = 0,
    form: str | None = None,
):
    """pooled, argmax, a_at [n, channels, size/2, size/2] with pooled = maxpool(relu(bn(a))), a [n, channels,
    size, size]; argmax is the window position 0..3, or NO_POSITION where the ReLU blocked the window
    (pooled <= 0); a_at is a at the window's position (backward_reduce reads it). a, pooled and a_at are float32, or
    bf16 bits alike (in --precision bf16 conv2's output and fc1's input, pooled rounded to the nearest, a_at exact).
    form: one of FORMS (None: form_of's for one model's n), the same values either way."""
    form = _checked_form("forward", form, n, size, a.dtype)
    kernel = stored_kernel(_forward[form], "a, pooled and a_at", a, pooled, a_at)
    args = (a, mean, invstd, gamma, beta, I32(n), I32(channels), I32(size), pooled, argmax, a_at, I32(param_stride))
    _launch(kernel, form, n, channels, size, args, models)


def backward_reduce(
    a_at,
    mean,
    invstd,
    d_pooled,
    argmax,
    n: int,
    channels: int,
    size: int,
    partial,
    counter,
    dgamma,
    dbeta,
    models: int = 1,
    param_stride: int = 0,
):
    """dgamma and dbeta from the pooled gradient, forward's argmax (with NO_POSITION: the pooled values are
    not read) and a_at, forward's a at the argmax; size is a's. counter: one uint32 per channel group (and
    model), zero, left zero. d_pooled and a_at are float32, or bf16 bits alike (in --precision bf16 fc1's input
    gradient and conv2's output at the argmax)."""
    kernel = stored_kernel(_backward_reduce, "d_pooled and a_at", d_pooled, a_at)
    parts, per_part = parts_of(n)
    kernel.launch(
        _grid(parts, channels, models),
        BN_THREADS,
        a_at,
        mean,
        invstd,
        d_pooled,
        argmax,
        I32(n),
        I32(channels),
        I32(size),
        I32(per_part),
        partial,
        counter,
        dgamma,
        dbeta,
        I32(param_stride),
        models=models,
    )


def form_of(op: str, n: int, size: int, dtype) -> str:
    """The form of `op` (forward or backward_apply) for batches of n images of one model, size x size values a plane,
    with a (and the outputs) of `dtype` (float32 or BF16): "staged" from STAGED_MIN_BATCH[op] images, where a block's
    planes in 16-byte units pay for its chain of copy, barrier and write, if the staged form takes the size (even, at
    most STAGED_WINDOWS windows); else "windows", a thread per window (docs/performance.md measures both; counting
    every model's images of a many-model launch gains nothing)."""
    stored = STORED_TYPES.get(np.dtype(dtype))  # (another type: stored_kernel names the two)
    fits = size % 2 == 0 and (size // 2) ** 2 <= STAGED_WINDOWS
    return "staged" if stored and fits and n >= STAGED_MIN_BATCH[op][stored] else "windows"


def _checked_form(op: str, form: str | None, n: int, size: int, dtype) -> str:
    """form, or form_of's for n images of one model where it is None; a one-line error for a form that does not exist
    or cannot take the size."""
    form = form or form_of(op, n, size, dtype)
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; choose from {FORMS}")
    if form == "staged" and (size % 2 or (size // 2) ** 2 > STAGED_WINDOWS):
        raise ValueError(f"the staged form takes an even size of at most {STAGED_WINDOWS} windows; got {size}")
    return form


def _launch(kernel, form: str, n: int, channels: int, size: int, args: tuple, models: int):
    """A thread per window, or a block of STAGED_THREADS per STAGED_PLANES planes (of each model: the grid's z)."""
    if form == "windows":
        kernel.launch_1d(n * channels * (size // 2) ** 2, *args, models=models)
        return
    grid = ceil_div(n * channels, STAGED_PLANES)
    kernel.launch(grid if models == 1 else (grid, 1, models), STAGED_THREADS, *args, models=models)


def backward_apply(
    a,
    mean,
    invstd,
    gamma,
    dgamma,
    dbeta,
    d_pooled,
    argmax,
    n: int,
    channels: int,
    size: int,
    d_a,
    models: int = 1,
    param_stride: int = 0,
    form: str | None = None,
):
    """d_a, the gradient at BatchNorm's input, from the pooled gradient and dgamma, dbeta. a, d_pooled and d_a are
    float32, or bf16 bits alike (in --precision bf16: conv2's output, fc1's input gradient and conv2's output
    gradient). form: one of FORMS (None: form_of's for one model's n), the same values either way."""
    form = _checked_form("backward_apply", form, n, size, a.dtype)
    kernel = stored_kernel(_backward_apply[form], "a, d_pooled and d_a", a, d_pooled, d_a)
    args = (a, mean, invstd, gamma, dgamma, dbeta, d_pooled, argmax, I32(n), I32(channels), I32(size), d_a)
    _launch(kernel, form, n, channels, size, (*args, I32(param_stride)), models)
