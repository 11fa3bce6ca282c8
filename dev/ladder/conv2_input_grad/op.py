"""conv2's input gradient, the ladder's op conv2_input_grad: each rung's launch contract (grid, block, arguments,
-D options).

3x3 convolution, stride 1, zero padding 1, no bias, NCHW; the gradient of its input: dy [N,K,H,W], w [K,C,3,3] ->
dx [N,C,H,W], dx[n,c,y,x] = sum_{k,r,s} dy[n,k,y+1-r,x+1-s] w[k,c,r,s] (a convolution of dy with the flipped,
transposed kernel). In ladder_op.Conv, c is dx's channels (the layer's input channels) and k is dy's.
"""

import numpy as np
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

from mnist_cuda import reference as ref
from mnist_cuda.kernel_cases import BF16_TOL, TF32_TOL
from mnist_cuda.ops import conv2_implicit_gemm as conv2


def launch_naive(kernel, s: Conv, dy, w, dx):
    """Rung 01: a thread per element of dx, blocks of 256 (mnist_cuda.ops.naive.conv2d_backward_input's
    contract)."""
    kernel.launch_1d(s.n * s.c * s.h * s.w, dy, w, dx, *s.ints())


SHARED_TILES = {"TILE_H": 8, "TILE_W": 16, "TILE_C": 4, "CHUNK_K": 8}


def launch_shared_tiles(kernel, s: Conv, dy, w, dx):
    """Rung 02: a block per TILE_H x TILE_W pixels of dx in an image and TILE_C of its channels, a thread per
    output; CHUNK_K channels of dy staged at a time (its shared memory is sized in the kernel, from these)."""
    t = SHARED_TILES
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_C"], channels=s.c)
    kernel.launch(grid, t["TILE_H"] * t["TILE_W"] * t["TILE_C"], dy, w, dx, *s.ints())


REGISTER_BLOCKING = {"TILE_H": 16, "TILE_W": 16, "TILE_C": 16, "CPT": 4, "CHUNK_K": 8}


def launch_register_blocking(kernel, s: Conv, dy, w, dx):
    """Rung 03: a block per TILE_H x TILE_W pixels of dx in an image and TILE_C of its channels, a thread per
    2 x 2 pixels and CPT channels; CHUNK_K channels of dy staged at a time (shared memory sized in the kernel)."""
    t = REGISTER_BLOCKING
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_C"], channels=s.c)
    threads = (t["TILE_H"] // 2) * (t["TILE_W"] // 2) * (t["TILE_C"] // t["CPT"])
    kernel.launch(grid, threads, dy, w, dx, *s.ints())


# Half of a 14x14 image, 16 columns wide (two of them past the image's edge), and all 32 of conv2's input channels:
# the product's block tile. Two warps per 16 channels, each warp 7 of the tile's 14 columns of 8 pixels.
IMPLICIT_GEMM = {"TILE_H": 7, "TILE_W": 16, "TILE_C": 32, "WARP_NT": 7, "CHUNK_K": 8}


def launch_implicit_gemm(kernel, s: Conv, dy, w, dx):
    """Rungs 04 and 05: a block per TILE_H x TILE_W pixels of dx in an image and TILE_C of its channels; a warp
    per 16 channels x WARP_NT columns of 8 pixels; CHUNK_K channels of dy staged at a time (shared memory sized in
    the kernel)."""
    t = IMPLICIT_GEMM
    grid = image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_C"], channels=s.c)
    warps = (t["TILE_C"] // 16) * (t["TILE_H"] * t["TILE_W"] // 8 // t["WARP_NT"])
    kernel.launch(grid, 32 * warps, dy, w, dx, *s.ints())


def prepare_product(s: Conv, dy, w, dx):
    """The top rung: conv2_implicit_gemm's input gradient in the form the step takes at this batch (fp32: 3xTF32,
    paired from conv2_implicit_gemm.PAIRED_INPUT_GRAD_MIN_BATCH images), from the flipped weights staged once
    beforehand as the step stages them (on its side stream, not part of the input gradient)."""
    import cupy

    forward, product = conv2.forward_product(s.n, "fp32"), conv2.input_grad_product(s.n, "fp32")
    forward_quads = cupy.empty((conv2.weight_quads(s.c, s.k, "fp32", forward), 4), cupy.float32)
    input_grad_quads = cupy.empty((conv2.weight_quads(s.k, s.c, "fp32", product), 4), cupy.float32)
    conv2.stage_weights(w, s.c, s.k, forward_quads, input_grad_quads, "fp32", forward, product)
    return lambda: conv2.backward_input(dy, input_grad_quads, dx, s.n, s.c, s.k, "fp32", product)


def prepare_product_bf16(s: Conv, dy, w, dx):
    """Rung 10: the product in --precision bf16: bf16 operands on the tensor cores, from dy stored as bf16, as the
    step stores conv2's output gradient there (rounded here, untimed: the product would round it to the same values),
    and dx written as bf16, as the step stores conv2's input gradient there (put into the float32 output after the
    launch, untimed)."""
    import cupy

    forward, product = conv2.forward_product(s.n, "bf16"), conv2.input_grad_product(s.n, "bf16")
    forward_quads = cupy.empty((conv2.weight_quads(s.c, s.k, "bf16", forward), 4), cupy.float32)
    input_grad_quads = cupy.empty((conv2.weight_quads(s.k, s.c, "bf16", product), 4), cupy.float32)
    conv2.stage_weights(w, s.c, s.k, forward_quads, input_grad_quads, "bf16", forward, product)
    dy_bits, dx_bits = to_bf16(dy), cupy.empty(dx.shape, cupy.uint16)
    run = lambda: conv2.backward_input(dy_bits, input_grad_quads, dx_bits, s.n, s.c, s.k, "bf16", product)
    return run, lambda: from_bf16(dx_bits, dx)


def _work_bf16(s: Conv) -> tuple[float, float]:
    """As _work, with dy read and dx written as bf16 (2 bytes a value each)."""
    flops, _ = _work(s)
    return flops, 2.0 * (s.n * s.k * s.h * s.w + s.n * s.c * s.h * s.w) + 4.0 * s.k * s.c * 9


def _inputs(rng, s: Conv) -> dict:
    """dy ~ N(0, 1) and w ~ N(0, 1 / (9 C)), as conv_inputs draws x and w."""
    dy = rng.standard_normal((s.n, s.k, s.h, s.w)).astype(np.float32)
    return {"dy": dy, "w": conv_inputs(rng, Conv(1, s.c, s.k, 1, 1))["w"]}


def _reference(dy, w) -> dict:
    """conv2d_backward's dx (its dw, from a zero x of dx's shape, is not used)."""
    x = np.zeros((dy.shape[0], w.shape[1], *dy.shape[2:]))
    return {"dx": ref.conv2d_backward(x, w, dy)[0]}


def _work(s: Conv) -> tuple[float, float]:
    """2 FLOPs per multiply-add; dy and w read and dx written once, as float32."""
    return 2.0 * s.n * s.c * s.h * s.w * s.k * 9, 4.0 * (s.n * s.k * s.h * s.w + s.k * s.c * 9 + s.n * s.c * s.h * s.w)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "conv2d_backward_input_naive", launch_naive),
        Rung("02_shared_tiles.cu", "conv2_input_grad_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "conv2_input_grad_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
        Rung(
            "04_implicit_gemm_tf32.cu",
            "conv2_input_grad_rung04_implicit_gemm_tf32",
            launch_implicit_gemm,
            IMPLICIT_GEMM,
            unit="tf32",
            tolerance=TF32_TOL,
        ),
        Rung(
            "05_implicit_gemm_3xtf32.cu",
            "conv2_input_grad_rung05_implicit_gemm_3xtf32",
            launch_implicit_gemm,
            IMPLICIT_GEMM,
            unit="3xtf32",
        ),
        ProductRung(
            "09_product",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_backward_input_fast<Precision::Fp32> (batch < 2048), conv2_backward_input_paired_fast",
            prepare_product,
            is_conv2,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/2_conv2_implicit_gemm.cu",
            "conv2_backward_input_fast<Precision::Bf16>",
            prepare_product_bf16,
            is_conv2,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
    ),
    geometry="dy [N,64,14,14], w [64,32,3,3] -> dx [N,32,14,14]",
    check_shapes=CONV_CHECK_SHAPES,
    network_shape=lambda batch: Conv(batch, 32, 64, 14, 14),
    inputs=_inputs,
    outputs=lambda s: {"dx": (s.n, s.c, s.h, s.w)},
    reference=_reference,
    work=_work,
    naive=("naive/2_conv2d.cu", "conv2d_backward_input_naive"),
)
