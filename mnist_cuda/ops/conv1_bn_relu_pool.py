"""The launch contracts of kernels/fast/conv1_bn_relu_pool.cu: conv1 -> BatchNorm -> ReLU -> maxpool fused,
forward and backward, with BatchNorm's statistics from the batch's image moments."""
from __future__ import annotations

from ..cuda import ceil_div, sm_count
from .common import F32, I32, source

FORWARD_CHANNELS = (8, 32)  # the forward's choices of channels per block (forward_channels_per_block)
CONV1_THREADS = 224  # 7 warps: thread t < 196 owns pooled window t of a 14x14 output (forward, moments)
CONV1_MOMENTS = 54  # the image moments: 9 sums S_t and 45 products G_tu (t <= u), in double
# the backward: a block takes CONV1_GRAD_CHANNELS channels of a part of the batch, a thread
# CONV1_GRAD_THREAD_CHANNELS of them in every CONV1_GRAD_LANES-th window (196 = 7 x 28), CONV1_GRAD_BLOCKS
# blocks per SM; the pooled gradient and positions pass through a ring of CONV1_GRAD_STAGES images
CONV1_GRAD_CHANNELS, CONV1_GRAD_THREAD_CHANNELS, CONV1_GRAD_LANES = 32, 2, 28
CONV1_GRAD_THREADS = CONV1_GRAD_LANES * CONV1_GRAD_CHANNELS // CONV1_GRAD_THREAD_CHANNELS
CONV1_GRAD_BLOCKS, CONV1_GRAD_STAGES = 1, 3
CONV1_GRAD_SUMS = 10  # the backward's sums per channel: sum dz, then E_t for the 9 taps
CONV1_GRAD_STAGE_BYTES = CONV1_GRAD_CHANNELS * 196 * 5  # a ring stage: 196 float gradients, then 196 byte positions per channel

_src = source("fast/conv1_bn_relu_pool.cu", CONV1_THREADS=CONV1_THREADS, CONV1_MOMENTS=CONV1_MOMENTS,
              CONV1_GRAD_CHANNELS=CONV1_GRAD_CHANNELS, CONV1_GRAD_THREAD_CHANNELS=CONV1_GRAD_THREAD_CHANNELS,
              CONV1_GRAD_LANES=CONV1_GRAD_LANES, CONV1_GRAD_THREADS=CONV1_GRAD_THREADS,
              CONV1_GRAD_BLOCKS=CONV1_GRAD_BLOCKS, CONV1_GRAD_STAGES=CONV1_GRAD_STAGES, CONV1_GRAD_SUMS=CONV1_GRAD_SUMS,
              CONV1_GRAD_STAGE_BYTES=CONV1_GRAD_STAGE_BYTES)
_moments = _src.kernel("conv1_image_moments_fast")
_forward = {c: _src.kernel(f"conv1_bn_relu_pool_fast<{c}>") for c in FORWARD_CHANNELS}
_backward = _src.kernel("conv1_backward_fast")


def moment_partial_shape() -> tuple[int, int]:
    """Scratch of image_moments (float64): a row per part, at most a part per SM."""
    return sm_count(), CONV1_MOMENTS


def backward_max_parts() -> int:
    """The most parts backward splits a batch into per channel group: a part per block slot (one wave)."""
    return CONV1_GRAD_BLOCKS * sm_count()


def backward_partial_size(channels: int) -> int:
    """Scratch of backward (float32)."""
    return backward_max_parts() * channels * CONV1_GRAD_SUMS


def moments_parts(n: int) -> tuple[int, int]:
    """(parts, images per part) of image_moments: up to a part per SM (a block fills an SM's registers, and
    its last block merges the parts in order, which takes any number)."""
    per_part = ceil_div(n, sm_count())
    return ceil_div(n, per_part), per_part


def image_moments(x, n: int, moment_partial, counter, moments):
    """The image moments of the n images x (bytes, [n, 1, 28, 28]) into moments [CONV1_MOMENTS] (float64).
    counter: one uint32, zero, left zero."""
    parts, per_part = moments_parts(n)
    _moments.launch(parts, CONV1_THREADS, x, I32(n), I32(per_part), moment_partial, counter, moments)


def forward_channels_per_block(n: int, channels: int) -> int:
    """The most channels per block of the forward that still give every SM two blocks, else the fewest:
    a block stages its image and computes its statistics once for all its channels, which pays where
    there are blocks enough; at small batches fewer blocks would leave SMs idle (docs/performance.md).
    Every output is computed the same way whatever the choice."""
    for per_block in sorted(FORWARD_CHANNELS, reverse=True):
        if n * ceil_div(channels, per_block) >= 2 * sm_count():
            return per_block
    return min(FORWARD_CHANNELS)


def forward(x, w, train: bool, moments, eps: float, momentum: float, mean, invstd, running_mean, running_var,
            gamma, beta, n: int, channels: int, pooled, argmax, per_block: int | None = None):
    """pooled, argmax [n, channels, 14, 14] = maxpool(relu(bn(conv1(normalize(x))))), argmax the window position
    0..3, or NO_POSITION where the ReLU blocked the window (pooled <= 0: what backward reads). In training BatchNorm's
    statistics come from `moments` (saved in mean, invstd; the running ones updated); in evaluation mean and
    invstd must hold the running statistics' (bn_relu_pool.eval_stats). per_block: channels per block, one
    of FORWARD_CHANNELS (None: forward_channels_per_block's choice)."""
    per_block = per_block or forward_channels_per_block(n, channels)
    _forward[per_block].launch((n, ceil_div(channels, per_block)), CONV1_THREADS, x, w, I32(train), moments, F32(eps),
                    F32(momentum), mean, invstd, running_mean, running_var, gamma, beta, I32(n), I32(channels),
                    pooled, argmax)


def backward_grid(n: int, channels: int) -> tuple[tuple[int, int], int]:
    """Grid of backward and its images per part: one wave of blocks (each holds its images ahead in its ring,
    so a longer part costs little, and the last block merges fewer parts)."""
    groups = ceil_div(channels, CONV1_GRAD_CHANNELS)
    per_part = ceil_div(n, max(1, backward_max_parts() // groups))
    return (ceil_div(n, per_part), groups), per_part


def backward(x, w, mean, invstd, gamma, moments, d_pooled, argmax, n: int, channels: int, partial, counter, dgamma,
             dbeta, dw):
    """dgamma, dbeta and conv1's dw from the pooled gradient and the forward's argmax (NO_POSITION where the ReLU
    blocked the window: the pooled values are not read). counter: one uint32 per channel group, zero."""
    grid, per_part = backward_grid(n, channels)
    _backward.launch(grid, CONV1_GRAD_THREADS, x, w, mean, invstd, gamma, moments, d_pooled, argmax, I32(n),
                     I32(channels), I32(per_part), partial, counter, dgamma, dbeta, dw,
                     shared_mem=CONV1_GRAD_STAGES * CONV1_GRAD_STAGE_BYTES)
