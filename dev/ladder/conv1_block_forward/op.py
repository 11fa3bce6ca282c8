"""conv1's block forward in training, the ladder's op conv1_block_forward: each rung's launch contract (grid, block,
arguments, -D options).

x [N,1,28,28] bytes -> normalised -> conv1 (3x3, stride 1, zero padding 1, no bias; w [K,1,3,3]) -> BatchNorm2d with
the batch's statistics (gamma, beta [K]) -> ReLU -> 2x2 max-pool -> pooled [N,K,14,14] and each window's position;
BatchNorm's mean and invstd [K] saved, its running statistics updated. The shape is a Conv of ladder_op with C = 1
and a 28 x 28 image: the rungs are built for conv1's geometry and take any N and K.

Launches run inside a CUDA graph capture when timed, so they allocate nothing: what a rung needs besides the op's
inputs and outputs comes as outputs the reference does not name (dev/ladder.py allocates every output and compares
only the reference's): the running statistics, the argmax bytes, rung 01's intermediate tensors and the per-part
sums. Their contents are not checked.
"""

import numpy as np
from ladder_op import Conv, Op, ProductRung, Rung, from_bf16

from mnist_cuda import data
from mnist_cuda import reference as ref
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import conv1_bn_relu_pool as conv1
from mnist_cuda.ops.common import F32, I32

EPS, MOMENTUM = ref.BN_EPS, ref.BN_MOMENTUM
DATA = {"MNIST_MEAN": data.MEAN, "MNIST_STD": data.STD}  # normalize_pixel's constants, as mnist_cuda.ops passes them
REDUCE_THREADS = 256  # rung 01's statistics: a block per channel (mnist_cuda.ops.naive.REDUCE_THREADS)
PARTS = 128  # rungs 04 and 05: a pass over the batch takes at most this many parts (a block each, or a row of them)
MOMENTS = 54  # the image moments: S_t for the 9 taps, then G_tu for t <= u
STATS_THREADS = 64  # rung 05's stats: one block


def _parts(n: int) -> tuple[int, int]:
    """(parts, images per part) of a pass over n images in at most PARTS parts."""
    per_part = ceil_div(n, PARTS)
    return ceil_div(n, per_part), per_part


def launch_naive(
    kernel, s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, xn, a, z, r, partial
):
    """Rung 01: the product's naive kernels as mnist_cuda/nets.py's naive net chains them for block 1 (the launch
    contracts of mnist_cuda.ops.naive): a thread per element in blocks of 256, the statistics a block per channel."""
    normalize, conv, stats, apply, relu, pool = kernel
    n, k, hw = s.n, s.k, s.h * s.w
    normalize.launch_1d(n * hw, x, xn, I32(n * hw))
    conv.launch_1d(n * k * hw, xn, w, a, *s.ints())
    stats.launch(
        k, REDUCE_THREADS, a, mean, invstd, running_mean, running_var, I32(n), I32(k), I32(hw), F32(EPS), F32(MOMENTUM)
    )
    apply.launch_1d(n * k * hw, a, mean, invstd, gamma, beta, z, I32(n), I32(k), I32(hw))
    relu.launch_1d(n * k * hw, z, r, I32(n * k * hw))
    pool.launch_1d(n * k * (hw // 4), r, pooled, argmax, I32(n), I32(k), I32(s.h), I32(s.w))


CONV_STATS = {"THREADS": 256, "CHANNELS": 8, **DATA}


def _conv_stats(conv_stats, stats, s: Conv, x, w, mean, invstd, running_mean, running_var, a, partial):
    """Rungs 02 and 03's first two kernels: conv_stats a block per image and group of CHANNELS channels (partial
    [K, N, 2] in double), then stats a block per channel."""
    t = CONV_STATS
    conv_stats.launch((s.n, ceil_div(s.k, t["CHANNELS"])), t["THREADS"], x, w, I32(s.n), I32(s.k), a, partial)
    stats.launch(
        s.k, t["THREADS"], partial, I32(s.n), I32(s.n), F32(EPS), F32(MOMENTUM), mean, invstd, running_mean, running_var
    )


def launch_conv_stats(
    kernel, s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, xn, a, z, r, partial
):
    """Rung 02: conv_stats and stats, then rung 01's last three kernels, a thread per element in blocks of 256."""
    conv_stats, stats, apply, relu, pool = kernel
    _conv_stats(conv_stats, stats, s, x, w, mean, invstd, running_mean, running_var, a, partial)
    count = s.n * s.k * s.h * s.w
    apply.launch_1d(count, a, mean, invstd, gamma, beta, z, I32(s.n), I32(s.k))
    relu.launch_1d(count, z, r, I32(count))
    pool.launch_1d(count // 4, r, pooled, argmax, I32(s.n), I32(s.k))


BN_RELU_POOL = CONV_STATS


def launch_bn_relu_pool(
    kernel, s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, xn, a, z, r, partial
):
    """Rung 03: rung 02's conv_stats and stats, then bn_relu_pool, a thread per pooled output in blocks of 256."""
    conv_stats, stats, bn_relu_pool = kernel
    _conv_stats(conv_stats, stats, s, x, w, mean, invstd, running_mean, running_var, a, partial)
    bn_relu_pool.launch_1d(s.n * s.k * s.h * s.w // 4, a, mean, invstd, gamma, beta, I32(s.n), I32(s.k), pooled, argmax)


RECOMPUTE = {"THREADS": 256, "WINDOW_THREADS": 224, "CHANNELS": 8, **DATA}


def _forward(forward, t: dict, s: Conv, x, w, gamma, beta, pooled, mean, invstd, argmax):
    """Rungs 04 and 05's forward, with the rung's sizes t: a block per image and group of CHANNELS channels, a thread
    per pooled window (WINDOW_THREADS threads)."""
    forward.launch(
        (s.n, ceil_div(s.k, t["CHANNELS"])),
        t["WINDOW_THREADS"],
        x,
        w,
        mean,
        invstd,
        gamma,
        beta,
        I32(s.n),
        I32(s.k),
        pooled,
        argmax,
    )


def launch_recompute(
    kernel, s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, xn, a, z, r, partial
):
    """Rung 04: sums a block per part of the batch (_parts) and group of CHANNELS channels (partial [K, parts, 2] in
    double), stats a block per channel, then the forward."""
    sums, stats, forward = kernel
    t, (parts, per_part) = RECOMPUTE, _parts(s.n)
    sums.launch((parts, ceil_div(s.k, t["CHANNELS"])), t["THREADS"], x, w, I32(s.n), I32(s.k), I32(per_part), partial)
    stats.launch(
        s.k,
        t["THREADS"],
        partial,
        I32(parts),
        I32(s.n),
        F32(EPS),
        F32(MOMENTUM),
        mean,
        invstd,
        running_mean,
        running_var,
    )
    _forward(forward, t, s, x, w, gamma, beta, pooled, mean, invstd, argmax)


IMAGE_MOMENTS = {"WINDOW_THREADS": 224, "CHANNELS": 8, **DATA}


def launch_image_moments(
    kernel, s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, xn, a, z, r, partial
):
    """Rung 05: moments a block per part of the batch (partial [parts, MOMENTS] in double), stats one block, then
    rung 04's forward."""
    moments, stats, forward = kernel
    t, (parts, per_part) = IMAGE_MOMENTS, _parts(s.n)
    moments.launch(parts, t["WINDOW_THREADS"], x, I32(s.n), I32(per_part), partial)
    stats.launch(
        1,
        STATS_THREADS,
        partial,
        I32(parts),
        w,
        I32(s.n),
        I32(s.k),
        F32(EPS),
        F32(MOMENTUM),
        mean,
        invstd,
        running_mean,
        running_var,
    )
    _forward(forward, t, s, x, w, gamma, beta, pooled, mean, invstd, argmax)


def prepare_product_cuda_cores(
    s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, *scratch
):
    """Rung 08: the product's forward with conv1 on the CUDA cores at every batch (tensor_cores=False), the form
    FastNet.forward takes below two blocks per SM."""
    return _product(s, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, False)


def prepare_product(s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, *scratch):
    """Rung 09: conv1_bn_relu_pool's forward in training as FastNet.forward launches it (conv1 on the tensor cores
    from two blocks per SM), with the batch's image moments taken beforehand (untimed) by conv1_image_moments_fast,
    as FastNet.prepare_batch takes them when the batch is loaded. argmax gets the window positions as bytes
    (NO_POSITION where the ReLU blocked the window)."""
    return _product(s, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax)


def prepare_product_bf16(s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, *scratch):
    """Rung 10: the product in --precision bf16, pooled written as bf16 (conv2's input, as the step stores it there);
    put into the float32 output after the launch (untimed)."""
    import cupy

    bits = cupy.empty(pooled.shape, cupy.uint16)
    run = _product(s, x, w, gamma, beta, bits, mean, invstd, running_mean, running_var, argmax)
    return run, lambda: from_bf16(bits, pooled)


def _product(s: Conv, x, w, gamma, beta, pooled, mean, invstd, running_mean, running_var, argmax, tensor_cores=None):
    """The product's launch into pooled (float32, or bf16 bits); tensor_cores as conv1_bn_relu_pool.forward takes
    it (None: its choice)."""
    import cupy

    moment_partial = cupy.empty(conv1.moment_partial_shape(), cupy.float64)
    counter = cupy.zeros(1, cupy.uint32)
    moments = cupy.empty(conv1.CONV1_MOMENTS, cupy.float64)
    conv1.image_moments(x, s.n, moment_partial, counter, moments)

    def run(moment_partial=moment_partial, counter=counter):  # (the scratch of the moments lives as long as the run)
        conv1.forward(
            x,
            w,
            True,
            moments,
            EPS,
            MOMENTUM,
            mean,
            invstd,
            running_mean,
            running_var,
            gamma,
            beta,
            s.n,
            s.k,
            pooled,
            argmax,
            tensor_cores=tensor_cores,
        )

    return run


def is_block1(s: Conv) -> bool:
    """The network's block 1, which the product's kernels are built for."""
    return (s.c, s.k, s.h, s.w) == (1, 32, 28, 28)


def _inputs(rng, s: Conv) -> dict:
    """Images as bytes, uniform over 0..255; w ~ N(0, 1/9), gamma ~ N(0, 1), beta ~ N(0, 1/4), as
    mnist_cuda.kernel_cases draws block 1's."""
    return {
        "x": rng.integers(0, 256, (s.n, 1, s.h, s.w), dtype=np.uint8),
        "w": (rng.standard_normal((s.k, 1, 3, 3)) / 3).astype(np.float32),
        "gamma": rng.standard_normal(s.k).astype(np.float32),
        "beta": (rng.standard_normal(s.k) * 0.5).astype(np.float32),
    }


def _outputs(s: Conv) -> dict:
    """pooled, mean and invstd: what the reference checks."""
    return {"pooled": (s.n, s.k, s.h // 2, s.w // 2), "mean": (s.k,), "invstd": (s.k,)}


def _scratch(s: Conv) -> dict:
    """What the rungs need besides, unchecked: the running statistics, the argmax bytes [N,K,14,14] (in a float32
    buffer of a quarter as many elements), rung 01's normalised images xn and full tensors a, z, r, and the
    per-part sums in double (as float32 pairs)."""
    full, windows = (s.n, s.k, s.h, s.w), (s.h // 2) * (s.w // 2)
    return {
        "running_mean": (s.k,),
        "running_var": (s.k,),
        "argmax": (s.n, s.k, ceil_div(windows, 4)),
        "xn": (s.n, 1, s.h, s.w),
        "a": full,
        "z": full,
        "r": full,
        "partial": (2 * s.n * max(2 * s.k, MOMENTS),),
    }


def _reference(x, w, gamma, beta) -> dict:
    """The float64 reference from the images as the network sees them (data.normalize, float32 like the kernels)."""
    a = ref.conv2d_forward(data.normalize(x.astype(np.uint8)).astype(np.float64), w)
    z, (_, invstd, mean, _) = ref.batchnorm_forward_train(a, gamma, beta)
    pooled, _ = ref.maxpool_forward(ref.relu_forward(z))
    return {"pooled": pooled, "mean": mean, "invstd": invstd}


def _work(s: Conv, pooled_bytes: int = 4) -> tuple[float, float]:
    """2 FLOPs per multiply-add of the convolution (BatchNorm, the ReLU and the pool left out); the images read once
    as bytes, w, gamma, beta and the running statistics read once, pooled written as float32 (pooled_bytes a value),
    its positions as a byte each, mean, invstd and the running statistics written once."""
    pooled = s.n * s.k * (s.h // 2) * (s.w // 2)
    flops = 2.0 * s.n * s.k * s.h * s.w * 9
    return flops, float(s.n * s.h * s.w + 4 * s.k * (9 + 2 + 2) + (pooled_bytes + 1) * pooled + 4 * s.k * 4)


def _work_bf16(s: Conv) -> tuple[float, float]:
    """As _work, with pooled written as bf16 (2 bytes a value)."""
    return _work(s, pooled_bytes=2)


OP = Op(
    rungs=(
        Rung(
            "01_naive.cu",
            "normalize_naive + conv2d_forward_naive + batchnorm_stats_naive + batchnorm_apply_naive"
            " + relu_forward_naive + maxpool2x2_forward_naive",
            launch_naive,
            DATA,
        ),
        Rung(
            "02_conv_stats.cu",
            " + ".join(f"conv1_block_forward_rung02_{k}" for k in ("conv_stats", "stats", "bn_apply", "relu", "pool")),
            launch_conv_stats,
            CONV_STATS,
        ),
        Rung(
            "03_bn_relu_pool.cu",
            "conv1_block_forward_rung03_conv_stats + conv1_block_forward_rung03_stats"
            " + conv1_block_forward_rung03_bn_relu_pool",
            launch_bn_relu_pool,
            BN_RELU_POOL,
        ),
        Rung(
            "04_recompute.cu",
            "conv1_block_forward_rung04_sums + conv1_block_forward_rung04_stats + conv1_block_forward_rung04_forward",
            launch_recompute,
            RECOMPUTE,
        ),
        Rung(
            "05_image_moments.cu",
            "conv1_block_forward_rung05_moments + conv1_block_forward_rung05_stats"
            " + conv1_block_forward_rung05_forward",
            launch_image_moments,
            IMAGE_MOMENTS,
        ),
        ProductRung(
            "08_product_cuda_cores",
            "fast/1_conv1_bn_relu_pool.cu",
            "conv1_bn_relu_pool_fast<32, float> (two blocks per SM or more), else conv1_bn_relu_pool_fast<8, float>",
            prepare_product_cuda_cores,
            is_block1,
            unit="fp32",
        ),
        ProductRung(
            "09_product",
            "fast/1_conv1_bn_relu_pool.cu",
            "conv1_mma_bn_relu_pool_fast<float> (two blocks per SM or more), else conv1_bn_relu_pool_fast<8, float>",
            prepare_product,
            is_block1,
            unit="fp32",
        ),
        ProductRung(
            "10_product_bf16",
            "fast/1_conv1_bn_relu_pool.cu",
            "conv1_mma_bn_relu_pool_fast<bfloat16> (two blocks per SM or more),"
            " else conv1_bn_relu_pool_fast<8, bfloat16>",
            prepare_product_bf16,
            is_block1,
            unit="fp32",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
    ),
    geometry="x [N,1,28,28] bytes, w [32,1,3,3], gamma, beta [32] -> pooled [N,32,14,14], mean, invstd [32]",
    check_shapes=(
        Conv(3, 1, 32, 28, 28),  # an odd batch
        Conv(5, 1, 13, 28, 28),  # channels that fill no group of CHANNELS
        Conv(64, 1, 32, 28, 28),  # the network's
        Conv(512, 1, 32, 28, 28),
    ),
    network_shape=lambda batch: Conv(batch, 1, 32, 28, 28),
    inputs=_inputs,
    outputs=_outputs,
    scratch=_scratch,
    reference=_reference,
    work=_work,
    naive=(
        ("naive/1_normalize.cu", "normalize_naive"),
        ("naive/2_conv2d.cu", "conv2d_forward_naive"),
        ("naive/3_batchnorm.cu", "batchnorm_stats_naive + batchnorm_apply_naive"),
        ("naive/4_relu.cu", "relu_forward_naive"),
        ("naive/5_maxpool.cu", "maxpool2x2_forward_naive"),
    ),
)
