"""The launch contracts of kernels/fast/1_conv1_bn_relu_pool.cu: conv1 -> BatchNorm -> ReLU -> maxpool fused,
forward and backward, with BatchNorm's statistics from the batch's image moments."""

from __future__ import annotations

from ..cuda import ceil_div, sm_count
from .common import F32, I32, STORED_TYPES, source, stored_kernel, stored_kernels

FORWARD_CHANNELS = (8, 32)  # the forward's choices of channels per block (forward_channels_per_block)
CONV1_THREADS = 224  # 7 warps: thread t < 196 owns pooled window t of a 14x14 output (forward, moments)
# the forward on the tensor cores: a block per image and CONV1_MMA_CHANNELS channels, 5 warps that take 5 of the
# image's 25 groups of 8 windows each, CONV1_MMA_BLOCKS blocks per SM (its launch bounds)
CONV1_MMA_THREADS, CONV1_MMA_CHANNELS, CONV1_MMA_BLOCKS = 160, 32, 4
CONV1_MOMENTS = 54  # the image moments: 9 sums S_t and 45 products G_tu (t <= u), in double
# the backward: a block takes per_block channels (one of BACKWARD_CHANNELS) of a part of the batch, a thread
# one of them in the windows of one of the CONV1_GRAD_ROWS pooled rows, and an SM as many blocks as make
# CONV1_GRAD_SM_CHANNELS channels; the pooled gradient and positions pass through a ring of CONV1_GRAD_STAGES
# images
BACKWARD_CHANNELS = (8, 32)  # the backward's choices of channels per block (backward_channels_per_block)
BACKWARD_WIDE_IMAGES_PER_SM = 8  # the images per SM from which the backward takes its most channels per block
CONV1_GRAD_ROWS, CONV1_GRAD_SM_CHANNELS, CONV1_GRAD_STAGES = 14, 32, 3
CONV1_GRAD_SUMS = 10  # the backward's sums per channel: sum dz, then E_t for the 9 taps
CONV1_GRAD_CHANNEL_BYTES = 196 * 5  # a channel's part of a ring stage: 196 float gradients, then 196 byte positions

_src = source(
    "fast/1_conv1_bn_relu_pool.cu",
    CONV1_THREADS=CONV1_THREADS,
    CONV1_MMA_THREADS=CONV1_MMA_THREADS,
    CONV1_MMA_CHANNELS=CONV1_MMA_CHANNELS,
    CONV1_MMA_BLOCKS=CONV1_MMA_BLOCKS,
    CONV1_MOMENTS=CONV1_MOMENTS,
    CONV1_GRAD_ROWS=CONV1_GRAD_ROWS,
    CONV1_GRAD_SM_CHANNELS=CONV1_GRAD_SM_CHANNELS,
    CONV1_GRAD_STAGES=CONV1_GRAD_STAGES,
    CONV1_GRAD_SUMS=CONV1_GRAD_SUMS,
    CONV1_GRAD_CHANNEL_BYTES=CONV1_GRAD_CHANNEL_BYTES,
)
_moments = _src.kernel("conv1_image_moments_fast")
# per channels per block, pooled's type: float32, or bf16 (conv2's input in --precision bf16)
_forward = {c: stored_kernels(_src, "conv1_bn_relu_pool_fast", c) for c in FORWARD_CHANNELS}
_forward_mma = stored_kernels(_src, "conv1_mma_bn_relu_pool_fast")
# the backward's kernels by the pooled gradient's type (float32; bf16 in --precision bf16), then channels per block
_by_channels = {c: stored_kernels(_src, "conv1_backward_fast", c) for c in BACKWARD_CHANNELS}
_backward = {dtype: {c: kernels[dtype] for c, kernels in _by_channels.items()} for dtype in STORED_TYPES}


def _models_grid(grid, models: int):
    """grid with the models as its z (the kernels' model_index); one model's launch keeps its grid as it is."""
    if models == 1:
        return grid
    x, y = grid if isinstance(grid, tuple) else (grid, 1)
    return x, y, models


def moment_partial_shape() -> tuple[int, int]:
    """Scratch of image_moments (float64) for one model: a row per part, at most a part per SM (K models: K
    times as many rows)."""
    return sm_count(), CONV1_MOMENTS


def backward_max_parts() -> int:
    """The most parts backward splits a batch into per channel group: a part per SM."""
    return sm_count()


def backward_partial_size(channels: int) -> int:
    """Scratch of backward (float32) for one model (K models: K times as much)."""
    return backward_max_parts() * channels * CONV1_GRAD_SUMS


def moments_parts(n: int) -> tuple[int, int]:
    """(parts, images per part) of image_moments: up to a part per SM (a block fills an SM's registers, and
    its last block merges the parts in order, which takes any number)."""
    per_part = ceil_div(n, sm_count())
    return ceil_div(n, per_part), per_part


def image_moments(x, n: int, moment_partial, counter, moments, models: int = 1):
    """The image moments of the n images x (bytes, [n, 1, 28, 28]) into moments [CONV1_MOMENTS] (float64).
    counter: one uint32, zero, left zero. models: how many models' batches of n images at once, every buffer
    [models][one model's]: x [models, n, 1, 28, 28], moment_partial models x moment_partial_shape(), counter
    [models], moments [models, CONV1_MOMENTS]; each model's moments are those of its own launch."""
    parts, per_part = moments_parts(n)
    grid = _models_grid(parts, models)
    _moments.launch(grid, CONV1_THREADS, x, I32(n), I32(per_part), moment_partial, counter, moments, models=models)


def _most_channels(choices, n: int, channels: int, blocks: int) -> int:
    """The most channels per block of `choices` at which n images make at least `blocks` blocks (an image and
    a channel group each), else the fewest."""
    for per_block in sorted(choices, reverse=True):
        if n * ceil_div(channels, per_block) >= blocks:
            return per_block
    return min(choices)


def forward_tensor_cores(n: int, channels: int) -> bool:
    """Whether the forward takes conv1 on the tensor cores (conv1_mma_bn_relu_pool_fast) for a batch of n images: where
    its blocks, an image and 32 channels each, give every SM two at least. Below that the CUDA cores' form, whose
    smaller blocks fill more SMs, is faster (docs/performance.md). The two round conv1 differently, so the choice is
    made from one model's batch in a launch of several (each model's bits those of its own launch)."""
    return n * ceil_div(channels, CONV1_MMA_CHANNELS) >= 2 * sm_count()


def forward_channels_per_block(n: int, channels: int) -> int:
    """The most channels per block of the forward that still give every SM two blocks, else the fewest:
    a block stages its image and computes its statistics once for all its channels, which pays where
    there are blocks enough; at small batches fewer blocks would leave SMs idle (docs/performance.md).
    Every output is computed the same way whatever the choice."""
    return _most_channels(FORWARD_CHANNELS, n, channels, 2 * sm_count())


def forward(
    x,
    w,
    train: bool,
    moments,
    eps: float,
    momentum: float,
    mean,
    invstd,
    running_mean,
    running_var,
    gamma,
    beta,
    n: int,
    channels: int,
    pooled,
    argmax,
    per_block: int | None = None,
    models: int = 1,
    param_stride: int = 0,
    running_stride: int = 0,
    tensor_cores: bool | None = None,
):
    """pooled, argmax [n, channels, 14, 14] = maxpool(relu(bn(conv1(normalize(x))))), argmax the window position
    0..3, or NO_POSITION where the ReLU blocked the window (pooled <= 0: what backward reads). pooled is float32, or
    bf16 bits (common.BF16: conv2's input in --precision bf16, rounded from the float32 value the position is taken
    from). In training BatchNorm's
    statistics come from `moments` (saved in mean, invstd; the running ones updated); in evaluation mean and
    invstd must hold the running statistics' (bn_relu_pool.eval_stats). per_block: channels per block, one
    of FORWARD_CHANNELS (None: forward_channels_per_block's choice), for conv1 on the CUDA cores. tensor_cores: conv1
    on the tensor cores, in 3xTF32 (None: forward_tensor_cores's choice); per_block is then not used.
    models: how many models' batches of n images at once; x, moments, mean, invstd, pooled and argmax are
    [models][one model's], each model's w, gamma and beta param_stride floats after the previous model's, its
    running statistics running_stride. The choice of per_block changes no bits, so it is made from all the
    models' images (more blocks); that of tensor_cores does, so it is made from one model's."""
    if tensor_cores is None:
        tensor_cores = forward_tensor_cores(n, channels)
    if tensor_cores:
        kernel, threads = stored_kernel(_forward_mma, "pooled", pooled), CONV1_MMA_THREADS
        per_block = CONV1_MMA_CHANNELS
    else:
        per_block = per_block or forward_channels_per_block(models * n, channels)
        kernel, threads = stored_kernel(_forward[per_block], "pooled", pooled), CONV1_THREADS
    kernel.launch(
        _models_grid((n, ceil_div(channels, per_block)), models),
        threads,
        x,
        w,
        I32(train),
        moments,
        F32(eps),
        F32(momentum),
        mean,
        invstd,
        running_mean,
        running_var,
        gamma,
        beta,
        I32(n),
        I32(channels),
        pooled,
        argmax,
        I32(param_stride),
        I32(running_stride),
        models=models,
    )


def backward_channels_per_block(n: int, channels: int) -> int:
    """The backward's most channels per block where the batch's (image, channel group) pairs number at least
    BACKWARD_WIDE_IMAGES_PER_SM per SM, else the fewest: a block stages each image once for all its channels,
    which pays on long parts, while on short ones the SM's four smaller blocks overlap their per-image chains
    of copies and barriers (docs/performance.md measures both). With 32 channels (the model's) a channel's sums
    are taken in the same order whatever the choice (backward_grid)."""
    return _most_channels(BACKWARD_CHANNELS, n, channels, BACKWARD_WIDE_IMAGES_PER_SM * sm_count())


def backward_grid(n: int, channels: int, per_block: int) -> tuple[tuple[int, int], int]:
    """Grid of backward and its images per part, per_block channels per block: one wave of blocks (each holds its
    images ahead in its ring, so a longer part costs little, and the last block merges fewer parts), and at
    most a part per SM in each channel group. Where per_block divides the channels, the groups fill the SMs'
    block slots alike for every per_block, so the parts, and each channel's sums, are the same."""
    groups = ceil_div(channels, per_block)
    slots = sm_count() * (CONV1_GRAD_SM_CHANNELS // per_block)
    per_part = ceil_div(n, max(1, min(backward_max_parts(), slots // groups)))
    return (ceil_div(n, per_part), groups), per_part


def backward(
    x,
    w,
    mean,
    invstd,
    gamma,
    moments,
    d_pooled,
    argmax,
    n: int,
    channels: int,
    partial,
    counter,
    dgamma,
    dbeta,
    dw,
    per_block: int | None = None,
    models: int = 1,
    param_stride: int = 0,
):
    """dgamma, dbeta and conv1's dw from the pooled gradient and the forward's argmax (NO_POSITION where the ReLU
    blocked the window: the pooled values are not read). d_pooled is float32, or bf16 bits (common.BF16: conv2's
    input gradient in --precision bf16). counter: one uint32 per channel group, zero. per_block: channels per
    block, one of BACKWARD_CHANNELS (None: backward_channels_per_block's choice).
    models: how many models' batches of n images at once; x, mean, invstd, moments, d_pooled and argmax are
    [models][one model's], partial models x backward_partial_size(channels), counter one per channel group and
    model (a [models, channels] buffer holds them); each model's w, gamma and gradients are param_stride floats
    after the previous model's. per_block and the parts come from one model's batch n, as in its own launch:
    they set the order of its sums."""
    kernels = stored_kernel(_backward, "d_pooled", d_pooled)  # before any question to the GPU
    per_block = per_block or backward_channels_per_block(n, channels)
    grid, per_part = backward_grid(n, channels, per_block)
    kernels[per_block].launch(
        _models_grid(grid, models),
        CONV1_GRAD_ROWS * per_block,
        x,
        w,
        mean,
        invstd,
        gamma,
        moments,
        d_pooled,
        argmax,
        I32(n),
        I32(channels),
        I32(per_part),
        partial,
        counter,
        dgamma,
        dbeta,
        dw,
        I32(param_stride),
        shared_mem=CONV1_GRAD_STAGES * per_block * CONV1_GRAD_CHANNEL_BYTES,
        models=models,
    )
