"""conv2's forward, the ladder's op conv2_forward: each rung's launch contract (grid, block, arguments, -D options).

3x3 convolution, stride 1, zero padding 1, no bias, NCHW: x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W].
"""

import dataclasses

from ladder_op import (
    CONV_CHECK_SHAPES,
    Conv,
    Op,
    ProductRung,
    Rung,
    conv_inputs,
    from_bf16,
    image_tile_grid,
    is_conv2,
    to_bf16,
)

from mnist_cuda import cuda
from mnist_cuda import reference as ref
from mnist_cuda.kernel_cases import BF16_TOL, TF32_TOL
from mnist_cuda.ops import bn_relu_pool
from mnist_cuda.ops import conv2_implicit_gemm as conv2


def launch_naive(kernel, s: Conv, x, w, y):
    """Rung 01: a thread per element of y, blocks of 256 (mnist_cuda.ops.naive.conv2d_forward's contract)."""
    kernel.launch_1d(s.n * s.k * s.h * s.w, x, w, y, *s.ints())


SHARED_TILES = {"TILE_H": 8, "TILE_W": 16, "TILE_K": 4, "CHUNK_C": 8}


def launch_shared_tiles(kernel, s: Conv, x, w, y):
    """Rung 02: a block per TILE_H x TILE_W output pixels of an image and TILE_K output channels, a thread per
    output; CHUNK_C input channels staged at a time (its shared memory is sized in the kernel, from these)."""
    t = SHARED_TILES
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    kernel.launch(grid, t["TILE_H"] * t["TILE_W"] * t["TILE_K"], x, w, y, *s.ints())


REGISTER_BLOCKING = {"TILE_H": 16, "TILE_W": 16, "TILE_K": 16, "KPT": 4, "CHUNK_C": 8}


def launch_register_blocking(kernel, s: Conv, x, w, y):
    """Rung 03: a block per TILE_H x TILE_W output pixels of an image and TILE_K output channels, a thread per
    2 x 2 pixels and KPT channels; CHUNK_C input channels staged at a time (shared memory sized in the kernel)."""
    t = REGISTER_BLOCKING
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    threads = (t["TILE_H"] // 2) * (t["TILE_W"] // 2) * (t["TILE_K"] // t["KPT"])
    kernel.launch(grid, threads, x, w, y, *s.ints())


MMA = {"TILE_H": 7, "TILE_W": 16, "TILE_K": 64, "WARP_K": 16, "CHUNK_C": 8}


def launch_mma(kernel, s: Conv, x, w, y):
    """Rungs 04 to 06: a block per TILE_H x TILE_W output pixels of an image (TILE_W = 16: A's 16 rows are a row of
    the tile) and TILE_K output channels, a warp per WARP_K of those channels over all TILE_H rows; CHUNK_C = 8 input
    channels staged at a time, a k-step per tap (shared memory sized in the kernel, from these). TILE_H = 7 covers
    the network's 14 rows in two tiles."""
    t = MMA
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    kernel.launch(grid, t["TILE_K"] // t["WARP_K"] * 32, x, w, y, *s.ints())


WGMMA = {"TILE_H": 7, "TILE_W": 16, "TILE_K": 64, "CHUNK_C": 8}


def wgmma_here() -> bool:
    """Whether kernels are compiled for sm_90a here (a Hopper GPU), where wgmma exists; False without a GPU, or where
    tests stand in for one (mnist_cuda.cuda.require_gpu replaced by an object without a device)."""
    try:
        return cuda.arch_specific()
    except (cuda.GPUUnavailable, AttributeError):
        return False


@dataclasses.dataclass(frozen=True)
class HopperRung(Rung):
    """A rung whose kernel exists only on sm_90a (wgmma): it takes every shape on a Hopper GPU, none elsewhere."""

    def accepts(self, shape) -> bool:
        return wgmma_here()


def launch_wgmma(kernel, s: Conv, x, w, y):
    """Rung 07: a block of one warpgroup (128 threads) per TILE_H x TILE_W output pixels of an image (TILE_W = 16:
    B's 16 columns are a row of the tile) and TILE_K = 64 output channels (A's 64 rows); CHUNK_C = 8 input channels
    staged at a time, a k-step per tap (shared memory sized in the kernel, from these). sm_90a only: off Hopper the
    kernel traps, so a real launch there is refused here."""
    if isinstance(kernel, cuda.Kernel) and not wgmma_here():
        raise RuntimeError("rung 07 (wgmma) runs only on a Hopper GPU, with kernels compiled for sm_90a")
    t = WGMMA
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    kernel.launch(grid, 128, x, w, y, *s.ints())


def prepare_product(s: Conv, x, w, y):
    """The top rung: conv2_implicit_gemm's forward in the form the step takes at this batch (fp32: 3xTF32), from
    the weights staged once beforehand as the step stages them (on its side stream, not part of the forward)."""
    import cupy

    product = conv2.forward_product(s.n, "fp32")
    forward_quads = cupy.empty((conv2.weight_quads(s.c, s.k, "fp32", product), 4), cupy.float32)
    input_grad_quads = cupy.empty((conv2.weight_quads(s.k, s.c, "fp32", "backward_input"), 4), cupy.float32)
    conv2.stage_weights(w, s.c, s.k, forward_quads, input_grad_quads, "fp32", product)
    return lambda: conv2.forward(x, forward_quads, y, s.n, s.c, s.k, "fp32", product)


def prepare_product_bf16(s: Conv, x, w, y, persistent: bool = False, moments: bool = False):
    """Rung 10: the product in --precision bf16: bf16 operands on the tensor cores, x read and y written as bf16, as
    the step stores conv2's input and output there (x rounded here, untimed: the product would round it to the same
    values); y put into the float32 output after the launch (untimed). A block per tile at every batch size, or
    persistent (rung 11), with its output's moments and BN2's statistics merged from them (rung 12)."""
    import cupy

    product = conv2.forward_product(s.n, "bf16")
    forward_quads = cupy.empty((conv2.weight_quads(s.c, s.k, "bf16", product), 4), cupy.float32)
    input_grad_quads = cupy.empty((conv2.weight_quads(s.k, s.c, "bf16", "backward_input"), 4), cupy.float32)
    conv2.stage_weights(w, s.c, s.k, forward_quads, input_grad_quads, "bf16", product)
    x_bits, y_bits = to_bf16(x), cupy.empty(y.shape, cupy.uint16)
    parts = conv2.moment_part_count(s.n, s.k, "bf16") if moments else 0
    moment_parts = cupy.empty(conv2.moment_parts_size(s.k, s.n, "blocks"), cupy.float32) if moments else None
    statistics = [cupy.zeros(s.k, cupy.float32) for _ in range(3)] + [cupy.ones(s.k, cupy.float32)]

    def run():
        form = {"persistent": persistent, "moment_parts": moment_parts}
        conv2.forward(x_bits, forward_quads, y_bits, s.n, s.c, s.k, "bf16", product, **form)
        if moments:
            tiles, tile_values = conv2.moment_counts(s.n)
            running = (ref.BN_EPS, ref.BN_MOMENTUM, *statistics)
            bn_relu_pool.stats_from_parts(moment_parts, parts, tiles, tile_values, s.k, *running)

    return run, lambda: from_bf16(y_bits, y)


def prepare_product_bf16_persistent(s: Conv, x, w, y):
    """Rung 11: rung 10's product in its persistent form at every batch size (the step takes it from
    conv2_implicit_gemm.PERSISTENT_FORWARD_MIN_BATCH images on): a block per SM slot runs its tiles' chunks as one
    stream, the next tile's first chunk staged while the last one's products run; the same bits as rung 10."""
    return prepare_product_bf16(s, x, w, y, persistent=True)


def prepare_product_bf16_moments(s: Conv, x, w, y):
    """Rung 12: rung 11 with its output's moments, then BN2's statistics merged from them, as the step runs its
    forward in training from conv2_implicit_gemm.MOMENTS_MIN_BATCH images on: each block sums the
    deviations of the values it stores and their squares, and batchnorm_stats_from_parts_fast merges the blocks'
    (mean, M2) into the mean, invstd and running statistics (which the kernel cases check; here y, the op's
    output, is checked). Its time is what stands in the step for rung 11 and bn_stats' product together."""
    return prepare_product_bf16(s, x, w, y, persistent=True, moments=True)


def prepare_product_tile_moments(s: Conv, x, w, y, persistent: bool | str = False):
    """Rung 13: rung 09's 3xTF32 product (its form for 64 channels a block, at every batch size) with its output's
    moments, then BN2's statistics merged from them, as the step ran its forward in fp32 from
    conv2_implicit_gemm.MOMENTS_MIN_BATCH images on before rung 14: each block, one tile, sums the deviations of the
    values it stores and their squares, and leaves its tile's (mean, M2) per channel; batchnorm_stats_from_tiles_fast,
    a block per channel, merges them. Its time is what stands in the step for rung 09 and bn_stats' product together.
    persistent: the product in that persistent form (conv2_implicit_gemm.FP32_PERSISTENT_FORMS: rungs 14 and 15)."""
    import cupy

    forward_quads = cupy.empty((conv2.weight_quads(s.c, s.k, "fp32", "forward"), 4), cupy.float32)
    input_grad_quads = cupy.empty((conv2.weight_quads(s.k, s.c, "fp32", "backward_input"), 4), cupy.float32)
    conv2.stage_weights(w, s.c, s.k, forward_quads, input_grad_quads, "fp32", "forward")
    moment_parts = cupy.empty(conv2.moment_parts_size(s.k, s.n, "tiles"), cupy.float32)
    statistics = [cupy.zeros(s.k, cupy.float32) for _ in range(3)] + [cupy.ones(s.k, cupy.float32)]
    tiles, tile_values = conv2.moment_counts(s.n)

    def run():
        form = {"persistent": persistent, "moment_parts": moment_parts}
        conv2.forward(x, forward_quads, y, s.n, s.c, s.k, "fp32", "forward", **form)
        bn_relu_pool.stats_from_tiles(moment_parts, tiles, tile_values, s.k, ref.BN_EPS, ref.BN_MOMENTUM, *statistics)

    return run


def prepare_product_warpgroup_pair(s: Conv, x, w, y):
    """Rung 14: rung 13 with the product as a persistent block of two warpgroups per SM, at every batch size here:
    every chunk's weights resident in its shared memory, each warpgroup running every other tile's chunks as one
    stream, staging each next chunk between issuing its products and waiting for them; the same bits and moments."""
    return prepare_product_tile_moments(s, x, w, y, persistent="pair")


def prepare_product_warp_specialized(s: Conv, x, w, y):
    """Rung 15: rung 14 as the step runs it from conv2_implicit_gemm.PAIR_FORWARD_MIN_BATCH images on, at every batch
    size here: each of the two warpgroups (the consumers) only issues products and stores its tiles' output, and a
    producer warpgroup of its own stages its chunks, the buffers handed between them through mbarriers, the registers
    moved from the producers to the consumers by setmaxnreg; the same bits and moments."""
    return prepare_product_tile_moments(s, x, w, y, persistent="warp_specialized")


def _work_bf16(s: Conv) -> tuple[float, float]:
    """As _work, with x read and y written as bf16 (2 bytes a value)."""
    flops, _ = _work(s)
    return flops, 4.0 * s.k * s.c * 9 + 2.0 * (s.n * s.c * s.h * s.w + s.n * s.k * s.h * s.w)


def _work(s: Conv) -> tuple[float, float]:
    """2 FLOPs per multiply-add; x and w read and y written once, as float32."""
    return 2.0 * s.n * s.k * s.h * s.w * s.c * 9, 4.0 * (s.n * s.c * s.h * s.w + s.k * s.c * 9 + s.n * s.k * s.h * s.w)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "conv2d_forward_naive", launch_naive),
        Rung("02_shared_tiles.cu", "conv2_forward_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "conv2_forward_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
        Rung("04_mma_tf32.cu", "conv2_forward_rung04_mma_tf32", launch_mma, MMA, unit="tf32", tolerance=TF32_TOL),
        Rung("05_3xtf32.cu", "conv2_forward_rung05_3xtf32", launch_mma, MMA, unit="3xtf32"),
        Rung("06_fragment_quads.cu", "conv2_forward_rung06_fragment_quads", launch_mma, MMA, unit="3xtf32"),
        HopperRung("07_wgmma.cu", "conv2_forward_rung07_wgmma", launch_wgmma, WGMMA, unit="3xtf32"),
        ProductRung(
            "09_product",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_stacked_fast (batch <= 96), conv2_forward_fast<Precision::Fp32>",
            prepare_product,
            is_conv2,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_fast<Precision::Bf16>",
            prepare_product_bf16,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_bf16_persistent",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_persistent_fast<Precision::Bf16, false>",
            prepare_product_bf16_persistent,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "12_product_bf16_moments",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_persistent_fast<Precision::Bf16, true>",
            prepare_product_bf16_moments,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "13_product_tile_moments",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_tile_moments_fast",
            prepare_product_tile_moments,
            is_conv2,
        ),
        ProductRung(
            "14_product_warpgroup_pair",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_warpgroup_pair_fast<true>",
            prepare_product_warpgroup_pair,
            is_conv2,
        ),
        ProductRung(
            "15_product_warp_specialized",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_forward_warp_specialized_fast<true>",
            prepare_product_warp_specialized,
            is_conv2,
        ),
    ),
    geometry="x [N,32,14,14], w [64,32,3,3] -> y [N,64,14,14]",
    check_shapes=CONV_CHECK_SHAPES,
    network_shape=lambda batch: Conv(batch, 32, 64, 14, 14),
    inputs=conv_inputs,
    outputs=lambda s: {"y": (s.n, s.k, s.h, s.w)},
    reference=lambda x, w: {"y": ref.conv2d_forward(x, w)},
    work=_work,
    naive=("naive/2_conv2d.cu", "conv2d_forward_naive"),
)
