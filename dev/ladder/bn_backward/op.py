"""BN2's backward from the pooled gradient, the ladder's op bn_backward: each rung's launch contract (grid, block,
arguments, -D options).

The product fuses BatchNorm's backward with the ReLU's and the max pool's (FastNet.backward: backward_reduce, then
backward_apply, from the pooled gradient), so the op is that fused computation: from x [N,C,S,S] (conv2's output
a2), BatchNorm's saved mean and invstd, gamma, the pooled gradient d_pooled [N,C,S/2,S/2] and the forward's record
of the ReLU and the pool, the gradient dx at BatchNorm's input and dgamma, dbeta:

    dz = relu_backward(maxpool_backward(d_pooled)), at BatchNorm's output
    dbeta = sum dz, dgamma = sum dz xhat (xhat = (x - mean) invstd), dx = gamma invstd / count (count dz - dbeta -
    xhat dgamma), per channel over count = N x S x S

The forward's record comes in the two forms the two ends read, drawn from one forward on the host: the naive chain
reads the ReLU's output (relu_out) and the pool's argmax (0..3); the fused rungs and the product read position (the
argmax, or NO_POSITION where the ReLU blocked the window) and, from rung 04 on, x_at (x at the argmax).
"""

import functools

import numpy as np
from ladder_op import Block, Op, ProductRung, Rung, from_bf16, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import bn_relu_pool
from mnist_cuda.ops.common import MAX_PARTS, NO_POSITION, parts_of

I32 = np.int32
MAX_CHANNELS = 1024  # the channels the rungs' own scratch (part_sums, blocks_done) has room for
NAIVE_THREADS = 256  # mnist_cuda.ops.naive.REDUCE_THREADS: BatchNorm's backward, a block per channel
PRODUCT_MAX_WINDOWS = 32 * 2  # the product holds a channel's windows of an image in 2 registers a lane


def _scratch_fits(s: Block):
    if s.c > MAX_CHANNELS:
        raise ValueError(f"{s.c} channels: the rungs' scratch has room for {MAX_CHANNELS}")


def launch_naive(
    kernels, s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta
):
    """Rung 01, the naive net's block backward (nets._NaiveBlock.backward): maxpool2x2_backward_naive and
    relu_backward_naive a thread per element, batchnorm_backward_naive a block of 256 per channel. The gradients
    at the ReLU's output and at BatchNorm's output go through dx: the ReLU's and BatchNorm's backward read each
    element before the same thread writes it (BatchNorm's after the barrier that ends its sums), so in place is
    safe, and the traffic is the naive net's."""
    pool, relu, bn = kernels
    n, c, size = s.ints()
    elements = s.n * s.c * s.s * s.s
    pool.launch_1d(elements, d_pooled, argmax, dx, n, c, size, size)
    relu.launch_1d(elements, dx, relu_out, dx, I32(elements))
    bn.launch((s.c,), NAIVE_THREADS, dx, x, mean, invstd, gamma, dx, dgamma, dbeta, n, c, I32(s.s * s.s))


FUSED = {"THREADS": 256, "NO_POSITION": NO_POSITION}


def launch_fused(
    kernel, s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta
):
    """Rung 02: a block of THREADS threads per channel."""
    kernel.launch((s.c,), FUSED["THREADS"], x, mean, invstd, gamma, d_pooled, position, *s.ints(), dx, dgamma, dbeta)


SPLIT = {"THREADS": 256, "NO_POSITION": NO_POSITION, "MAX_PARTS": MAX_PARTS, "MAX_CHANNELS": MAX_CHANNELS}


def launch_split(
    kernels, s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta
):
    """Rung 03: reduce, a block of THREADS threads per (part, channel), reading x at the positions; apply."""
    reduce, apply = kernels
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    reduce.launch(
        (parts, s.c), SPLIT["THREADS"], x, mean, invstd, d_pooled, position, *s.ints(), I32(per_part), dgamma, dbeta
    )
    _apply(apply, s, x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, dx)


def _apply(apply, s: Block, x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, dx):
    """Rungs 03 to 05's apply: a thread per element of x, blocks of 256."""
    apply.launch_1d(s.n * s.c * s.s * s.s, x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, *s.ints(), dx)


X_AT = SPLIT


def launch_x_at(
    kernels, s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta
):
    """Rung 04: rung 03's, the reduction reading x_at instead of x."""
    reduce, apply = kernels
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    reduce.launch(
        (parts, s.c), X_AT["THREADS"], x_at, mean, invstd, d_pooled, position, *s.ints(), I32(per_part), dgamma, dbeta
    )
    _apply(apply, s, x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, dx)


WARP_PER_CHANNEL = {"CHANNELS": 8, "NO_POSITION": NO_POSITION, "MAX_PARTS": MAX_PARTS, "MAX_CHANNELS": MAX_CHANNELS}


def launch_warp_per_channel(
    kernels, s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta
):
    """Rung 05: reduce on grid (parts, ceil(C / CHANNELS)), a warp per channel; apply."""
    reduce, apply = kernels
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    channels = WARP_PER_CHANNEL["CHANNELS"]
    reduce.launch(
        (parts, ceil_div(s.c, channels)),
        32 * channels,
        x_at,
        mean,
        invstd,
        d_pooled,
        position,
        *s.ints(),
        I32(per_part),
        dgamma,
        dbeta,
    )
    _apply(apply, s, x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, dx)


def prepare_product(
    s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta, form="windows"
):
    """Rung 09: bn_relu_pool.backward_reduce then backward_apply as FastNet.backward launches them, with their scratch
    (partial) and zeroed counters (a row of c, as FastNet's counters2[1]); the apply in its form `form`
    (bn_relu_pool.FORMS: rung 09's a thread per window, rung 11's staged planes)."""
    import cupy

    partial = cupy.empty(bn_relu_pool.partial_size(s.c), cupy.float32)
    counter = cupy.zeros(s.c, cupy.uint32)  # one per group of BN_CHANNELS channels at least; left zero
    cupy.cuda.get_current_stream().synchronize()

    def run():
        bn_relu_pool.backward_reduce(
            x_at, mean, invstd, d_pooled, position, s.n, s.c, s.s, partial, counter, dgamma, dbeta
        )
        bn_relu_pool.backward_apply(
            x, mean, invstd, gamma, dgamma, dbeta, d_pooled, position, s.n, s.c, s.s, dx, form=form
        )

    return run


def prepare_product_bf16(
    s: Block, x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at, dx, dgamma, dbeta, form="windows"
):
    """Rung 10: the product in --precision bf16, where conv2's output and its gradient, and fc1's input gradient (the
    pooled gradient), are stored as bf16: x rounded to bf16 (and x_at, stored as bf16 as the forward stores it), the
    pooled gradient rounded to bf16, dx written as bf16 and put into the float32 output after the launch (untimed); the
    sums stay float32. Against the reference on the unrounded x and pooled gradient. Rung 12: the same, the apply
    staged."""
    import cupy

    dx_bits = cupy.empty(dx.shape, cupy.uint16)
    run = prepare_product(
        s,
        to_bf16(x),
        mean,
        invstd,
        gamma,
        to_bf16(d_pooled),
        relu_out,
        argmax,
        position,
        to_bf16(x_at),
        dx_bits,
        dgamma,
        dbeta,
        form,
    )
    return run, lambda: from_bf16(dx_bits, dx)


def product_accepts(s: Block) -> bool:
    """Even images (the apply writes each window's rows as float2) of at most PRODUCT_MAX_WINDOWS windows."""
    return s.s % 2 == 0 and (s.s // 2) ** 2 <= PRODUCT_MAX_WINDOWS


def _inputs(rng, s: Block) -> dict:
    """x ~ N(0.3, 1.5^2), gamma ~ N(0, 1), d_pooled ~ N(0, 1) (mnist_cuda.kernel_cases' block backward); mean and
    invstd are x's batch statistics in float32, as the forward saves them; the forward's ReLU and pool run on the
    host in float64 with beta ~ N(0, 0.5^2), and what they record is the same for both forms."""
    x = (rng.standard_normal((s.n, s.c, s.s, s.s)) * 1.5 + 0.3).astype(np.float32)
    gamma = rng.standard_normal(s.c).astype(np.float32)
    beta = rng.standard_normal(s.c) * 0.5
    mean = x.mean(axis=(0, 2, 3), dtype=np.float64)
    invstd = 1.0 / np.sqrt(x.var(axis=(0, 2, 3), dtype=np.float64) + ref.BN_EPS)
    mean, invstd = mean.astype(np.float32), invstd.astype(np.float32)
    z = (x - mean[:, None, None].astype(np.float64)) * invstd[:, None, None] * gamma[:, None, None] + beta[
        :, None, None
    ]
    relu_out = ref.relu_forward(z).astype(np.float32)
    pooled, argmax = ref.maxpool_forward(relu_out.astype(np.float64))
    windows = ref._pool_windows(x)
    return {
        "x": x,
        "mean": mean,
        "invstd": invstd,
        "gamma": gamma,
        "d_pooled": rng.standard_normal(s.pooled).astype(np.float32),
        "relu_out": relu_out,
        "argmax": argmax,
        "position": np.where(pooled > 0, argmax, NO_POSITION).astype(np.uint8),
        "x_at": np.take_along_axis(windows, argmax.astype(np.int64)[..., None], -1)[..., 0].astype(np.float32),
    }


def _reference(x, mean, invstd, gamma, d_pooled, relu_out, argmax, position, x_at) -> dict:
    """The reference's chain: the pool's and the ReLU's backward from the naive form of the record, then
    BatchNorm's backward with xhat from the saved mean and invstd."""
    dz = ref.relu_backward(ref.maxpool_backward(d_pooled, argmax, x.shape), relu_out)
    xhat = (x - mean[:, None, None]) * invstd[:, None, None]
    dx, dgamma, dbeta = ref.batchnorm_backward(dz, gamma, (xhat, invstd, mean, None))
    return {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}


def _work(s: Block) -> tuple[float, float]:
    """8 FLOPs per element of x (its share of the sums, and dx); x read and dx written once, the pooled gradient
    and position read once, mean, invstd and gamma read and dgamma and dbeta written, as float32 (position bytes)."""
    elements, windows = s.n * s.c * s.s * s.s, s.n * s.c * (s.s // 2) ** 2
    return 8.0 * elements, 8.0 * elements + 5.0 * windows + 4.0 * 5 * s.c


def _work_bf16(s: Block) -> tuple[float, float]:
    """As _work, with x read, dx written and the pooled gradient read as bf16 (2 bytes a value each)."""
    elements, windows = s.n * s.c * s.s * s.s, s.n * s.c * (s.s // 2) ** 2
    return 8.0 * elements, 4.0 * elements + 3.0 * windows + 4.0 * 5 * s.c


OP = Op(
    rungs=(
        Rung(
            "01_naive.cu",
            "maxpool2x2_backward_naive + relu_backward_naive + batchnorm_backward_naive",
            launch_naive,
        ),
        Rung("02_fused.cu", "bn_backward_rung02_fused", launch_fused, FUSED),
        Rung("03_split.cu", "bn_backward_rung03_split_reduce + bn_backward_rung03_split_apply", launch_split, SPLIT),
        Rung("04_x_at.cu", "bn_backward_rung04_x_at_reduce + bn_backward_rung04_x_at_apply", launch_x_at, X_AT),
        Rung(
            "05_warp_per_channel.cu",
            "bn_backward_rung05_warp_per_channel_reduce + bn_backward_rung05_warp_per_channel_apply",
            launch_warp_per_channel,
            WARP_PER_CHANNEL,
        ),
        ProductRung(
            "09_product",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_backward_reduce_fast<float> + batchnorm_backward_apply_fast<float>",
            prepare_product,
            product_accepts,
            unit="fp32",
        ),
        ProductRung(
            "10_product_bf16",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_backward_reduce_fast<bfloat16> + batchnorm_backward_apply_fast<bfloat16>",
            prepare_product_bf16,
            product_accepts,
            unit="fp32",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_staged",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_backward_reduce_fast<float> + batchnorm_backward_apply_staged_fast<float>",
            functools.partial(prepare_product, form="staged"),
            product_accepts,
            unit="fp32",
        ),
        ProductRung(
            "12_product_staged_bf16",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_backward_reduce_fast<bfloat16> + batchnorm_backward_apply_staged_fast<bfloat16>",
            functools.partial(prepare_product_bf16, form="staged"),
            product_accepts,
            unit="fp32",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
    ),
    geometry="BN2 + ReLU + pool's backward: x [N,64,14,14], d_pooled [N,64,7,7] -> dx [N,64,14,14], dgamma, dbeta [64]",
    check_shapes=(
        Block(3, 5, 13),  # odd sizes: a 13 x 13 image (its last row and column in no window), 5 channels
        Block(2, 33, 10),  # 33 channels (a group of one), 25 windows an image
        Block(67, 9, 14),  # 34 parts of two images, the last of one
        Block(5, 32, 28),  # BN1's geometry: 196 windows an image, more than a warp's lanes
        Block(64, 64, 14),  # the network's
        Block(512, 64, 14),
    ),
    network_shape=lambda batch: Block(batch, 64, 14),
    inputs=_inputs,
    outputs=lambda s: {"dx": (s.n, s.c, s.s, s.s), "dgamma": (s.c,), "dbeta": (s.c,)},
    reference=_reference,
    work=_work,
    naive=(
        ("naive/5_maxpool.cu", "maxpool2x2_backward_naive"),
        ("naive/4_relu.cu", "relu_backward_naive"),
        ("naive/3_batchnorm.cu", "batchnorm_backward_naive"),
    ),
)
