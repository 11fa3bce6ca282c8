"""The launch contracts of kernels/fast/4_linear_splitk.cu: fc1's three products on the tensor cores, the long
reductions cut into splits that splitk_reduce sums. Each product has a "tiled" form (the mma.sync core,
kernels/include/gemm_tile.cuh, any GPU); the input gradient also has a "wgmma" form
(kernels/include/wgmma_tile.cuh), Hopper's warpgroup MMA, for kernels compiled for sm_90a. form=None takes
the wgmma form in bf16, for batches of at least WG_MIN_BATCH: much faster at the largest batches, slightly
slower at some middling ones (docs/performance.md, sections 3 and 6). form="tiled" or "wgmma" forces one.
The forward has the tiled form alone: on wgmma its small gains at middling batches in bf16 do not pay for
its loss at large ones (docs/performance.md).

precision: the step's precision (conv2_implicit_gemm.KERNEL_PRECISION). fc1 runs in 3xTF32 (float32's accuracy)
at "fp32" and at "tf32" alike, as PyTorch keeps its matrix products in float32 by default while its
convolutions may use TF32; at "bf16" both operands are rounded to bf16, as under torch.autocast, and fc1's input
x (block 2's pooled output, read by the forward and the weight gradient) and its gradient dx (the input gradient's
output, BatchNorm 2's backward's input) are stored as bf16 (input_dtype: uint16 arrays of bf16 bits), as autocast
keeps them: the products see the same x from half the bytes, and dx is rounded to the nearest. The weight w and the
output's gradient dy may be float32, or in "bf16" bf16 copies (weight_to_bf16, and the head's d_pre): the values the
products would round them to, in half the bytes (operand_dtype; the same bits out).

models: K models in one launch (kernels/include/common.cuh), each of n samples: x, dy, dx and out [K][n][...],
the weight (and gradient) of model m at m * param_stride from model 0's (a bf16 copy of the weights, dense, at
m * weight_stride), and the partial results dense, model m's
[splits][...] at m * splits * (one split's size): a buffer of K times the size functions' one model's size holds
them. Splits and forms are chosen from n, one model's batch, so each model's bits are its single launch's."""

from __future__ import annotations

import numpy as np

from .. import cuda
from ..cuda import ceil_div, sm_count
from .common import BF16, I32, STORED_TYPES, activation_dtype, check_stored, precision_kernels, source
from .splitk_reduce import splitk_reduce

TILE, TILE_K = 64, 16  # a block's output tile is TILE x TILE (narrow: half as wide); k steps of TILE_K
GEMM_THREADS, GEMM_MIN_BLOCKS = 256, 3  # 3 blocks per SM cap the registers so that 24 warps hide latency
GEMM_STAGES = 4  # k-steps in a block's copy ring: 3 in flight while one is multiplied (<= 40 KB per block)
MAX_SPLITS = 64
# the wgmma form: one warpgroup of WG_THREADS per block, 64 samples x WG_INPUT_GRAD_COLS inputs (3136 = 28 x
# 112); k staged WG_CHUNK_K at a time, in two buffers
WG_THREADS, WG_CHUNK_K, WG_INPUT_GRAD_COLS, WG_MIN_BATCH = 128, 32, 112, 256
# from this many images per model the bf16 step gives the products a bf16 copy of the weight and dy (operand_dtype):
# below it the copy's launch costs what the shorter reads save (docs/performance.md)
BF16_OPERANDS_MIN_BATCH = 512
FORMS = ("tiled", "wgmma")

_src = source(
    "fast/4_linear_splitk.cu",
    TILE_M=TILE,
    TILE_N=TILE,
    TILE_K=TILE_K,
    GEMM_THREADS=GEMM_THREADS,
    GEMM_MIN_BLOCKS=GEMM_MIN_BLOCKS,
    GEMM_STAGES=GEMM_STAGES,
    WG_THREADS=WG_THREADS,
    WG_CHUNK_K=WG_CHUNK_K,
    WG_INPUT_GRAD_COLS=WG_INPUT_GRAD_COLS,
)
# the kernels' Precision template argument for each of the step's precisions (nets.PRECISIONS): under tf32 fc1
# stays 3xTF32, as PyTorch's matrix products stay fp32 where its convolutions take TF32
KERNEL_PRECISION = {"fp32": "Precision::Fp32", "tf32": "Precision::Fp32", "bf16": "Precision::Bf16"}
_NAMES = ("forward", "backward_input", "backward_input_narrow", "backward_weight", "backward_input_wgmma")
# then the type of x and dx (the kernels' X; input_dtype), and that of w and dy (T; operand_dtype): each precision's
# own, and in bf16 also float32 w and dy, rounded as the products read them
_kernel = precision_kernels(
    _src,
    "linear",
    _NAMES,
    {
        p: f"{e}, {STORED_TYPES[activation_dtype(p)]}, {STORED_TYPES[activation_dtype(p)]}"
        for p, e in KERNEL_PRECISION.items()
    },
)
_kernel_float_operands = precision_kernels(_src, "linear", _NAMES, {"bf16": "Precision::Bf16, bfloat16, float"})
_weight_to_bf16 = _src.kernel("linear_weight_to_bf16_fast")


def input_dtype(precision: str):
    """The dtype of fc1's input x and its gradient dx at `precision`: bf16 bits (common.BF16) in "bf16", float32
    otherwise (the kernels' X)."""
    _kernel("forward", precision)  # checks the precision
    return activation_dtype(precision)


def operand_dtype(precision: str, batch: int):
    """The dtype of the weight's copy and the output's gradient dy that the step gives fc1's products at `precision`
    for batches of `batch` images (a model's): bf16 bits in "bf16" from BF16_OPERANDS_MIN_BATCH images (weight_to_bf16),
    float32 otherwise. Both give the same bits."""
    _kernel("forward", precision)  # checks the precision
    return np.dtype(BF16 if precision == "bf16" and batch >= BF16_OPERANDS_MIN_BATCH else np.float32)


def _check_input(array, name: str, precision: str):
    check_stored(array, name, input_dtype(precision), "fc1", precision)


def _product(name: str, precision: str, *operands):
    """The kernel of product `name` for the dtype of its operands w and dy, which they share: float32, or in "bf16"
    also bf16 bits."""
    dtypes = {np.dtype(a.dtype) for a in operands}
    kernel = _kernel(name, precision)
    if dtypes == {np.dtype(np.float32)}:
        return _kernel_float_operands(name, precision) if precision == "bf16" else kernel
    if dtypes != {np.dtype(BF16)} or precision != "bf16":
        names = " and ".join(str(np.dtype(a.dtype)) for a in operands)
        also = f", or bf16 ({np.dtype(BF16)}) alike" if precision == "bf16" else ""
        raise ValueError(f"fc1's operands (w, dy) must be float32{also} in {precision}; got {names}")
    return kernel


def _weight_stride(param_stride: int, weight_stride: int | None):
    """The stride between the models' weights as the products read them: weight_stride (a bf16 copy's, the weights
    alone), by default param_stride (the parameters themselves)."""
    return I32(param_stride if weight_stride is None else weight_stride)


def weight_to_bf16(w, copy, count: int, models: int = 1, param_stride: int = 0):
    """copy [models][count] = w's first count floats (of each model, param_stride apart) as bf16 bits, each rounded to
    the nearest as the bf16 products round a float32 weight."""
    if np.dtype(w.dtype) != np.float32:
        raise ValueError(f"w is {np.dtype(w.dtype)}; its bf16 copy is made from float32")
    if np.dtype(copy.dtype) != np.dtype(BF16) or copy.size < models * count:
        raise ValueError(f"the copy must be {models * count:,} bf16 values ({np.dtype(BF16)})")
    _weight_to_bf16.launch_1d(count, w, copy, I32(count), I32(param_stride), models=models)


def wgmma_shared_bytes(precision: str) -> int:
    """Dynamic shared memory of a wgmma-form block: two buffers of both operands' chunks, each part of a
    chunk [16-byte quad][line + 1 spare slot] (kernels/include/wgmma_tile.cuh)."""
    _kernel("backward_input_wgmma", precision)
    values, parts = (8, 1) if precision == "bf16" else (4, 2)
    return 2 * 16 * parts * (WG_CHUNK_K // values) * ((64 + 1) + (WG_INPUT_GRAD_COLS + 1))


def _form(form: str | None, precision: str, n: int) -> str:
    """The input gradient's form."""
    if form is None:
        wgmma = precision == "bf16" and n >= WG_MIN_BATCH
        return "wgmma" if wgmma and cuda.arch_specific() else "tiled"
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; choose from {FORMS}")
    if form == "wgmma" and not cuda.arch_specific():
        raise ValueError("the wgmma form needs kernels compiled for sm_90a (a Hopper GPU)")
    return form


def split_k(k_total: int, tiles: int) -> tuple[int, int]:
    """Cut a product's reduction of length k_total into splits (each a multiple of TILE_K long, at least 4
    steps) so that tiles * splits blocks run in one wave (GEMM_MIN_BLOCKS per SM): a second, partly filled
    wave costs more than longer splits (docs/performance.md). Returns (splits, k_per_split)."""
    steps = ceil_div(k_total, TILE_K)
    splits = max(1, min(steps // 4, MAX_SPLITS, GEMM_MIN_BLOCKS * sm_count() // max(tiles, 1)))
    k_per_split = ceil_div(steps, splits) * TILE_K
    return ceil_div(k_total, k_per_split), k_per_split


def max_splits(k_total: int) -> int:
    """An upper bound of split_k's splits for any reduction of length <= k_total (to size scratch)."""
    return max(1, min(MAX_SPLITS, ceil_div(k_total, TILE_K) // 4))


def forward_partial_size(batch: int, n_in: int, n_out: int) -> int:
    return max_splits(n_in) * batch * n_out


def weight_partial_size(batch: int, n_in: int, n_out: int) -> int:
    return max_splits(batch) * n_out * n_in


def forward(
    x,
    w,
    b,
    partial,
    out,
    n: int,
    n_in: int,
    n_out: int,
    precision: str = "fp32",
    models: int = 1,
    param_stride: int = 0,
    weight_stride: int | None = None,
):
    """out [n, n_out] = relu(x [n, n_in] w^T + b), through partial [forward_partial_size] (of each model); x in
    input_dtype(precision), w float32 or in "bf16" bf16 bits (model m's at m * weight_stride, by default
    param_stride: a bf16 copy is the weights alone)."""
    _check_input(x, "x", precision)
    splits, k_per_split = split_k(n_in, ceil_div(n_out, TILE) * ceil_div(n, TILE))
    _product("forward", precision, w).launch(
        (ceil_div(n_out, TILE), ceil_div(n, TILE), splits * models),
        GEMM_THREADS,
        x,
        w,
        partial,
        I32(n),
        I32(n_in),
        I32(n_out),
        I32(k_per_split),
        _weight_stride(param_stride, weight_stride),
        models=models,
    )
    count = n * n_out
    splitk_reduce(
        partial,
        splits,
        out,
        bias=b,
        relu=True,
        count=count,
        models=models,
        out_stride=count if models > 1 else 0,
        bias_stride=param_stride,
    )


def _grid_2d(cols: int, rows: int, models: int) -> tuple:
    """A 2-D grid for each of `models` models (z: the model), the plain 2-D grid for one."""
    return (cols, rows) if models == 1 else (cols, rows, models)


def backward_input(
    dy,
    w,
    dx,
    n: int,
    n_in: int,
    n_out: int,
    narrow: bool | None = None,
    precision: str = "fp32",
    form: str | None = None,
    models: int = 1,
    param_stride: int = 0,
    weight_stride: int | None = None,
):
    """dx [n, n_in] = dy [n, n_out] w (dy and w float32, or in "bf16" bf16 bits alike; model m's w at
    m * weight_stride, by default param_stride: a bf16 copy is the weights alone). The wgmma form: tiles of 64 x
    WG_INPUT_GRAD_COLS. The tiled form: 64-wide
    tiles, or 32-wide ones (narrow) where the wide would be fewer blocks than the GPU has SMs (narrow=None:
    chosen so, from one model's blocks; True or False forces one). dx in input_dtype(precision)."""
    _check_input(dx, "dx", precision)
    if _form(form, precision, n) == "wgmma":
        if narrow:
            raise ValueError("narrow tiles are the tiled form's")
        _product("backward_input_wgmma", precision, dy, w).launch(
            _grid_2d(ceil_div(n_in, WG_INPUT_GRAD_COLS), ceil_div(n, 64), models),
            WG_THREADS,
            dy,
            w,
            dx,
            I32(n),
            I32(n_in),
            I32(n_out),
            _weight_stride(param_stride, weight_stride),
            shared_mem=wgmma_shared_bytes(precision),
            models=models,
        )
        return
    rows = ceil_div(n, TILE)
    if narrow is None:
        narrow = ceil_div(n_in, TILE) * rows < sm_count()
    kernel, width = (
        (_product("backward_input_narrow", precision, dy, w), TILE // 2)
        if narrow
        else (_product("backward_input", precision, dy, w), TILE)
    )
    kernel.launch(
        _grid_2d(ceil_div(n_in, width), rows, models),
        GEMM_THREADS,
        dy,
        w,
        dx,
        I32(n),
        I32(n_in),
        I32(n_out),
        _weight_stride(param_stride, weight_stride),
        models=models,
    )


def weight_splits(n: int, n_in: int, n_out: int) -> tuple[int, int]:
    """backward_weight's (splits, k_per_split) for a batch of n: its reduction over the batch split_k's way."""
    return split_k(n, ceil_div(n_in, TILE) * ceil_div(n_out, TILE))


def backward_weight(
    x,
    dy,
    dw,
    partial,
    n: int,
    n_in: int,
    n_out: int,
    precision: str = "fp32",
    sum_splits: bool = True,
    models: int = 1,
    param_stride: int = 0,
):
    """dw [n_out, n_in] = dy^T x, the batch cut into weight_splits(n, n_in, n_out) splits through partial
    [weight_partial_size] (of each model; with one split, straight into dw). With sum_splits False, more than one
    are left in partial for the caller to sum into dw (splitk_reduce, with models and out_stride=param_stride),
    where the step has room for it. x in input_dtype(precision)."""
    _check_input(x, "x", precision)
    splits, k_per_split = weight_splits(n, n_in, n_out)
    _product("backward_weight", precision, dy).launch(
        (ceil_div(n_in, TILE), ceil_div(n_out, TILE), splits * models),
        GEMM_THREADS,
        x,
        dy,
        dw if splits == 1 else partial,
        I32(n),
        I32(n_in),
        I32(n_out),
        I32(k_per_split),
        I32(param_stride),
        models=models,
    )
    if splits > 1 and sum_splits:
        splitk_reduce(partial, splits, dw, count=n_out * n_in, models=models, out_stride=param_stride)
