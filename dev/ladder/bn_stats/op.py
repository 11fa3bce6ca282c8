"""BatchNorm's training statistics, the ladder's op bn_stats: each rung's launch contract (grid, block, arguments,
-D options).

Per channel c of x [N,C,HW], over its count = N x HW values: mean, invstd = 1 / sqrt(var + eps) with the biased
variance, and the running statistics' update with momentum and the unbiased variance. The network's BN2 takes it
over conv2's output a2 [N,64,14,14] (BN1's statistics come from the batch's image moments, in conv1's kernels).

The op's outputs are mean, invstd, running_mean and running_var; the old running statistics are inputs. Rungs 02 on
read them and write the new ones apart. Rung 01 and the product update the running statistics in place, as the
step does: the running statistics' outputs start from the old ones (OP.initial).
"""

import dataclasses

import numpy as np
from ladder_op import Op, ProductRung, Rung, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import bn_relu_pool
from mnist_cuda.ops.common import MAX_PARTS, parts_of

I32, F32 = np.int32, np.float32
EPS, MOMENTUM = F32(ref.BN_EPS), F32(ref.BN_MOMENTUM)
MAX_CHANNELS = 1024  # the channels the rungs' own scratch (part_stats, blocks_done) has room for
NAIVE_THREADS = 256  # mnist_cuda.ops.naive.REDUCE_THREADS: a block per channel
PRODUCT_MAX_HW = 32 * 7  # the product holds an image's values of a channel in 7 registers a lane (BN_STATS_VALUES)


@dataclasses.dataclass(frozen=True)
class Channels:
    """x [n, c, hw]: the statistics of each of c channels over n images of hw values."""

    n: int
    c: int
    hw: int

    def __str__(self):
        return f"N={self.n},C={self.c},HW={self.hw}"

    def ints(self) -> tuple:
        return I32(self.n), I32(self.c), I32(self.hw)


def _scratch_fits(s: Channels):
    if s.c > MAX_CHANNELS:
        raise ValueError(f"{s.c} channels: the rungs' scratch has room for {MAX_CHANNELS}")


def launch_naive(kernel, s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """Rung 01: a block of 256 threads per channel (mnist_cuda.ops.naive.batchnorm_stats' contract)."""
    kernel.launch((s.c,), NAIVE_THREADS, x, mean, invstd, running_mean, running_var, *s.ints(), EPS, MOMENTUM)


SPLIT_BATCH = {"THREADS": 256, "MAX_PARTS": MAX_PARTS, "MAX_CHANNELS": MAX_CHANNELS}


def launch_split_batch(kernels, s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """Rung 02: parts, grid (parts, C) of THREADS threads (parts: mnist_cuda.ops.common.parts_of, at most
    MAX_PARTS); then merge, grid C of one warp."""
    parts_kernel, merge = kernels
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    parts_kernel.launch((parts, s.c), SPLIT_BATCH["THREADS"], x, *s.ints(), I32(per_part))
    merge.launch(
        (s.c,),
        32,
        *s.ints(),
        I32(per_part),
        I32(parts),
        EPS,
        MOMENTUM,
        old_mean,
        old_var,
        mean,
        invstd,
        running_mean,
        running_var,
    )


LAST_BLOCK = SPLIT_BATCH


def launch_last_block(kernel, s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """Rung 03: grid (parts, C) of THREADS threads, the last block of each channel merging its parts."""
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    kernel.launch(
        (parts, s.c),
        LAST_BLOCK["THREADS"],
        x,
        *s.ints(),
        I32(per_part),
        EPS,
        MOMENTUM,
        old_mean,
        old_var,
        mean,
        invstd,
        running_mean,
        running_var,
    )


WARP_PER_CHANNEL = {"CHANNELS": 8, "VALUES": 7, "MAX_PARTS": MAX_PARTS, "MAX_CHANNELS": MAX_CHANNELS}


def launch_warp_per_channel(kernel, s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """Rung 04: grid (parts, ceil(C / CHANNELS)) of a warp per channel, the last block of each group of CHANNELS
    channels merging the group's parts."""
    _scratch_fits(s)
    parts, per_part = parts_of(s.n)
    channels = WARP_PER_CHANNEL["CHANNELS"]
    kernel.launch(
        (parts, -(-s.c // channels)),
        32 * channels,
        x,
        *s.ints(),
        I32(per_part),
        EPS,
        MOMENTUM,
        old_mean,
        old_var,
        mean,
        invstd,
        running_mean,
        running_var,
    )


def prepare_product(s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """The top rung: bn_relu_pool.stats as FastNet.forward launches it, with its scratch (partial) and its zeroed
    counters (a row of c, as FastNet's counters2[0]); the running statistics start from the drawn ones (OP.initial)."""
    import cupy

    partial = cupy.empty(bn_relu_pool.partial_size(s.c), cupy.float32)
    counter = cupy.zeros(s.c, cupy.uint32)  # one per group of BN_CHANNELS channels at least; left zero
    cupy.cuda.get_current_stream().synchronize()
    return lambda: bn_relu_pool.stats(
        x, s.n, s.c, s.hw, partial, counter, float(EPS), float(MOMENTUM), mean, invstd, running_mean, running_var
    )


def prepare_product_bf16(s: Channels, x, old_mean, old_var, mean, invstd, running_mean, running_var):
    """Rung 10: the product in --precision bf16, where conv2's output is stored as bf16: the same launch on x rounded
    to bf16 (rounded here, untimed); the statistics stay float32. Against the reference on the unrounded x."""
    return prepare_product(s, to_bf16(x), old_mean, old_var, mean, invstd, running_mean, running_var)


def _work_bf16(s: Channels) -> tuple[float, float]:
    """As _work, with x read as bf16 (2 bytes a value)."""
    return 3.0 * s.n * s.c * s.hw, 2.0 * s.n * s.c * s.hw + 4.0 * 6 * s.c


def _inputs(rng, s: Channels) -> dict:
    """x ~ N(0.5, 2^2) (mnist_cuda.kernel_cases' batchnorm cases), the old running mean ~ N(0, 1) and running
    variance |N(0, 1)| + 0.5."""
    return {
        "x": (rng.standard_normal((s.n, s.c, s.hw)) * 2.0 + 0.5).astype(np.float32),
        "old_running_mean": rng.standard_normal(s.c).astype(np.float32),
        "old_running_var": (np.abs(rng.standard_normal(s.c)) + 0.5).astype(np.float32),
    }


def _reference(x, old_running_mean, old_running_var) -> dict:
    n, c, hw = x.shape
    _, (_, invstd, mean, var) = ref.batchnorm_forward_train(x.reshape(n, c, hw, 1), np.ones(c), np.zeros(c))
    running_mean, running_var = ref.batchnorm_running_update(old_running_mean, old_running_var, mean, var, n * hw)
    return {"mean": mean, "invstd": invstd, "running_mean": running_mean, "running_var": running_var}


def _work(s: Channels) -> tuple[float, float]:
    """3 FLOPs per value (a sum, a deviation, its square added); x read once, the old running statistics read and
    the four outputs written, as float32."""
    return 3.0 * s.n * s.c * s.hw, 4.0 * (s.n * s.c * s.hw + 6 * s.c)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "batchnorm_stats_naive", launch_naive),
        Rung(
            "02_split_batch.cu",
            "bn_stats_rung02_split_batch_parts + bn_stats_rung02_split_batch_merge",
            launch_split_batch,
            SPLIT_BATCH,
        ),
        Rung("03_last_block.cu", "bn_stats_rung03_last_block", launch_last_block, LAST_BLOCK),
        Rung("04_warp_per_channel.cu", "bn_stats_rung04_warp_per_channel", launch_warp_per_channel, WARP_PER_CHANNEL),
        ProductRung(
            "09_product",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_stats_fast<float>",
            prepare_product,
            lambda s: s.hw <= PRODUCT_MAX_HW,
            unit="fp32",
        ),
        ProductRung(
            "10_product_bf16",
            "fast/3_bn_relu_pool.cu",
            "batchnorm_stats_fast<bfloat16>",
            prepare_product_bf16,
            lambda s: s.hw <= PRODUCT_MAX_HW,
            unit="fp32",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
    ),
    geometry="BN2's statistics over a2 [N,64,14,14]: x [N,64,196] -> mean, invstd, running_mean, running_var [64]",
    check_shapes=(
        Channels(3, 5, 13 * 13),  # odd sizes: a part of one image, a 169-long channel, channels no group fills
        Channels(2, 33, 30),  # a short channel (a warp's registers mostly empty), 33 channels
        Channels(67, 9, 7 * 7),  # 34 parts of two images, the last of one
        Channels(5, 32, 28 * 28),  # BN1's geometry: channels longer than a warp's registers hold at once
        Channels(64, 64, 196),  # the network's
        Channels(512, 64, 196),
    ),
    network_shape=lambda batch: Channels(batch, 64, 196),
    inputs=_inputs,
    outputs=lambda s: {name: (s.c,) for name in ("mean", "invstd", "running_mean", "running_var")},
    reference=_reference,
    work=_work,
    naive=("naive/3_batchnorm.cu", "batchnorm_stats_naive"),
    # rung 01 and the product update the running statistics in place, as the step does
    initial=lambda inputs: {"running_mean": inputs["old_running_mean"], "running_var": inputs["old_running_var"]},
)
