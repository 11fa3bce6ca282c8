"""conv2's weight gradient, the ladder's op conv2_weight_grad: each rung's launch contract (grid, block, arguments,
-D options).

dw[k,c,r,s] = sum_n sum_{y,x} dy[n,k,y,x] * x[n,c,y+r-1,x+s-1] (zero padding 1): x [N,C,H,W], dy [N,K,H,W] ->
dw [K,C,3,3]. A reduction over N x H x W into K x C x 9 weights.

Rungs 03 and 04 split the sum across blocks and keep the parts' partial results in the op's scratch (partial),
sized for the most parts a launch makes.
"""

import numpy as np
from ladder_op import CONV_CHECK_SHAPES, Conv, Op, ProductRung, Rung, is_conv2, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import conv2_implicit_gemm as conv2
from mnist_cuda.ops import splitk_reduce
from mnist_cuda.sizes import GRID_LIMIT

I32 = np.int32


def inputs(rng, s: Conv) -> dict:
    """x and dy ~ N(0, 1), as mnist_cuda.kernel_cases draws them for the weight gradient."""
    x = rng.standard_normal((s.n, s.c, s.h, s.w)).astype(np.float32)
    dy = rng.standard_normal((s.n, s.k, s.h, s.w)).astype(np.float32)
    return {"x": x, "dy": dy}


def launch_naive(kernel, s: Conv, x, dy, dw, partial):
    """Rung 01: a thread per element of dw, blocks of 256 (mnist_cuda.ops.naive.conv2d_backward_weight's contract)."""
    kernel.launch_1d(s.k * s.c * 9, x, dy, dw, *s.ints())


BLOCK_REDUCE = {"THREADS": 256}


def launch_block_reduce(kernel, s: Conv, x, dy, dw, partial):
    """Rung 02: a block of THREADS threads per (output channel, input channel) pair, the pair k * C + c in x."""
    kernel.launch((s.k * s.c,), BLOCK_REDUCE["THREADS"], x, dy, dw, *s.ints())


# Blocks the split rungs aim for: about two per SM of an H100 or H200 (132 SMs), one wave at their size.
WAVE_BLOCKS = 264


def split(s: Conv, tile_k: int, tile_c: int) -> tuple[tuple[int, int, int], int]:
    """(grid, images per part) of a split rung: a block per tile of tile_k output x tile_c input channels and run
    of images, as many runs as bring the blocks to about WAVE_BLOCKS (at most one per image); every run holds at
    least one image."""
    tiles = (ceil_div(s.k, tile_k), ceil_div(s.c, tile_c))
    if max(tiles) > GRID_LIMIT:
        raise ValueError(f"{tiles} channel tiles: they go in grid y and z, which take at most {GRID_LIMIT}")
    per_part = ceil_div(s.n, max(1, min(s.n, WAVE_BLOCKS // (tiles[0] * tiles[1]))))
    return (ceil_div(s.n, per_part), *tiles), per_part


def _launch_split(kernels, tile: dict, threads: int, s: Conv, x, dy, dw, partial):
    """The partial results of each run of images into partial (room for WAVE_BLOCKS runs: a launch makes no more),
    then their sum in part order (a thread per element of dw)."""
    partial_kernel, sum_kernel = kernels
    grid, per_part = split(s, tile["TILE_K"], tile["TILE_C"])
    partial_kernel.launch(grid, threads, x, dy, partial, *s.ints(), I32(per_part))
    count = s.k * s.c * 9
    sum_kernel.launch_1d(count, partial, I32(grid[0]), I32(count), dw)


SPLIT_K = {"TILE_K": 64, "TILE_C": 8, "KPT": 4, "TILE_P": 32}


def launch_split_k(kernels, s: Conv, x, dy, dw, partial):
    """Rung 03: grid (parts, ceil(K / TILE_K), ceil(C / TILE_C)), (TILE_K / KPT) x TILE_C threads (its shared
    memory sized in the kernel); then the sum of the parts."""
    t = SPLIT_K
    _launch_split(kernels, t, t["TILE_K"] // t["KPT"] * t["TILE_C"], s, x, dy, dw, partial)


MMA_3XTF32 = {"TILE_K": 64, "TILE_C": 8, "TILE_P": 32}


def launch_mma_3xtf32(kernels, s: Conv, x, dy, dw, partial):
    """Rung 04: rung 03's grid, a warp per 16 output channels of the tile; then the sum of the parts."""
    t = MMA_3XTF32
    _launch_split(kernels, t, t["TILE_K"] // 16 * 32, s, x, dy, dw, partial)


def _prepare_product(l2_prefetch: bool):
    def prepare(s: Conv, x, dy, dw, _split_partial):
        import cupy

        partial = cupy.empty(conv2.weight_grad_partial_size(s.c, s.k), cupy.float32)

        def run():
            parts = conv2.backward_weight(x, dy, partial, s.n, s.c, s.k, "fp32", l2_prefetch=l2_prefetch)
            splitk_reduce.splitk_reduce(partial, parts, dw)

        return run

    return prepare


# The top rung: conv2_implicit_gemm's weight gradient in fp32 (3xTF32) into a partial result per part, then
# splitk_reduce's sum of the parts, as FastNet._conv2_weight_grad runs them (its scratch made here, untimed).
prepare_product = _prepare_product(l2_prefetch=True)
# Rung 08: the same with the staging's loads plain, without the L2's 256-byte fetch.
prepare_product_no_l2_prefetch = _prepare_product(l2_prefetch=False)


def prepare_product_bf16(s: Conv, x, dy, dw, _split_partial):
    """Rung 10: the product in --precision bf16: bf16 operands on the tensor cores, from x and dy stored as bf16, as
    the step stores conv2's input and output gradient there (rounded here, untimed: the product would round them to
    the same values); the parts summed as in rung 09."""
    import cupy

    partial = cupy.empty(conv2.weight_grad_partial_size(s.c, s.k), cupy.float32)
    x_bits, dy_bits = to_bf16(x), to_bf16(dy)

    def run():
        parts = conv2.backward_weight(x_bits, dy_bits, partial, s.n, s.c, s.k, "bf16")
        splitk_reduce.splitk_reduce(partial, parts, dw)

    return run


def prepare_product_bf16_from_layout(s: Conv, x, dy, dw, _split_partial):
    """Rung 11: rung 10 with x and dy first written in the weight gradient's layout (to_weight_grad_layout: a pixel
    of a channel of 8 images one 16-byte unit), then read there: the two passes are timed with it, as the step
    runs them in bf16 from conv2_implicit_gemm.WGRAD_LAYOUT_MIN_BATCH images."""
    import cupy

    partial = cupy.empty(conv2.weight_grad_partial_size(s.c, s.k), cupy.float32)
    x_bits, dy_bits = to_bf16(x), to_bf16(dy)
    x_layout, dy_layout = (cupy.empty(conv2.weight_grad_layout_size(s.n, c, "bf16"), x_bits.dtype) for c in (s.c, s.k))

    def run():
        conv2.to_weight_grad_layout(x_bits, x_layout, s.n, s.c, "bf16")
        conv2.to_weight_grad_layout(dy_bits, dy_layout, s.n, s.k, "bf16")
        parts = conv2.backward_weight(x_layout, dy_layout, partial, s.n, s.c, s.k, "bf16", from_layout=True)
        splitk_reduce.splitk_reduce(partial, parts, dw)

    return run


def _work_bf16(s: Conv) -> tuple[float, float]:
    """As _work, with x and dy read as bf16 (2 bytes a value)."""
    flops, _ = _work(s)
    return flops, 4.0 * s.k * s.c * 9 + 2.0 * (s.n * s.c * s.h * s.w + s.n * s.k * s.h * s.w)


def _work(s: Conv) -> tuple[float, float]:
    """2 FLOPs per multiply-add; x and dy read and dw written once, as float32."""
    return 2.0 * s.k * s.c * 9 * s.n * s.h * s.w, 4.0 * (s.n * s.c * s.h * s.w + s.n * s.k * s.h * s.w + s.k * s.c * 9)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "conv2d_backward_weight_naive", launch_naive),
        Rung("02_block_reduce.cu", "conv2_weight_grad_rung02_block_reduce", launch_block_reduce, BLOCK_REDUCE),
        Rung(
            "03_split_k.cu",
            "conv2_weight_grad_rung03_split_k_partial + conv2_weight_grad_rung03_split_k_sum",
            launch_split_k,
            SPLIT_K,
        ),
        Rung(
            "04_mma_3xtf32.cu",
            "conv2_weight_grad_rung04_mma_3xtf32_partial + conv2_weight_grad_rung04_mma_3xtf32_sum",
            launch_mma_3xtf32,
            MMA_3XTF32,
            unit="3xtf32",
        ),
        ProductRung(
            "08_product_no_l2_prefetch",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_backward_weight_fast<Precision::Fp32, false>, its parts summed by splitk_reduce "
            "(fast/6_splitk_reduce.cu)",
            prepare_product_no_l2_prefetch,
            is_conv2,
        ),
        ProductRung(
            "09_product",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_backward_weight_fast<Precision::Fp32>, its parts summed by splitk_reduce (fast/6_splitk_reduce.cu)",
            prepare_product,
            is_conv2,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_backward_weight_fast<Precision::Bf16>, its parts summed by splitk_reduce (fast/6_splitk_reduce.cu)",
            prepare_product_bf16,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_bf16_from_layout",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_weight_grad_layout_fast<Precision::Bf16> (x, dy), conv2_backward_weight_fast<Precision::Bf16, true, "
            "true>, its parts summed by splitk_reduce (fast/6_splitk_reduce.cu)",
            prepare_product_bf16_from_layout,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
    ),
    geometry="x [N,32,14,14], dy [N,64,14,14] -> dw [64,32,3,3]",
    check_shapes=CONV_CHECK_SHAPES,
    network_shape=lambda batch: Conv(batch, 32, 64, 14, 14),
    inputs=inputs,
    outputs=lambda s: {"dw": (s.k, s.c, 3, 3)},
    scratch=lambda s: {"partial": (WAVE_BLOCKS * s.k * s.c * 9,)},  # the split rungs' parts
    reference=lambda x, dy: {"dw": ref.conv2d_backward(x, np.zeros((dy.shape[1], x.shape[1], 3, 3)), dy)[1]},
    work=_work,
    naive=("naive/2_conv2d.cu", "conv2d_backward_weight_naive"),
)
