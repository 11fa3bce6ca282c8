"""The launch contracts of kernels/fast/5_head.cu: fc2 -> log_softmax -> NLL and their backward in one
kernel, and the sums over its blocks in a second.

Both step `models` models at once (the grid's z): their sizes are one model's (n is the per-model batch) and
their buffers hold the models' parts one after another: h, labels, logits, d_pre [models][n][...], partial
[models][partial_size], loss and loss_count [models], loss_log [models][capacity]; fc2's weight and bias and the
gradients are param_stride floats apart."""

from __future__ import annotations

from ..cuda import ceil_div
from .common import CLASSES, I32, source, stored_kernel, stored_kernels

HEAD_SAMPLES, HEAD_THREADS = 16, 512  # samples and threads per block
# a block's sums: per hidden column fc2's dW [10] and fc1's bias gradient; then fc2's db [10] and the loss
_SUMS_PER_HIDDEN, _SUMS_FIXED = CLASSES + 1, CLASSES + 1
HEAD_SUMS = f"({_SUMS_PER_HIDDEN} * (H) + {_SUMS_FIXED})"  # the kernel's macro HEAD_SUMS(H)

_src = source("fast/5_head.cu", HEAD_SAMPLES=HEAD_SAMPLES, HEAD_THREADS=HEAD_THREADS, **{"HEAD_SUMS(H)": HEAD_SUMS})
# d_pre float32, or bf16 bits in the bf16 step (linear_splitk.operand_dtype), by its dtype
_forward_backward = stored_kernels(_src, "head_forward_backward_fast")
_sum_parts = _src.kernel("head_sum_parts_fast")


def head_sums(hidden: int) -> int:
    """Floats of one block's sums (HEAD_SUMS(H))."""
    return _SUMS_PER_HIDDEN * hidden + _SUMS_FIXED


def blocks(n: int) -> int:
    return ceil_div(n, HEAD_SAMPLES)


def partial_size(batch: int, hidden: int) -> int:
    """Floats of forward_backward's scratch for one model."""
    return blocks(batch) * head_sums(hidden)


def forward_backward(
    h,
    w,
    b,
    labels,
    n: int,
    hidden: int,
    train: bool,
    logits,
    d_pre,
    partial,
    models: int = 1,
    param_stride: int = 0,
):
    """logits [n, 10] = h [n, hidden] w^T + b; in training also d_pre [n, hidden], the loss's gradient at
    fc1's pre-activation (fc1's ReLU mask applied; float32, or bf16 bits rounded to the nearest), and each block's
    sums into partial [partial_size]."""
    stored_kernel(_forward_backward, "d_pre", d_pre).launch(
        blocks(n) if models == 1 else (blocks(n), 1, models),
        HEAD_THREADS,
        h,
        w,
        b,
        labels,
        I32(n),
        I32(hidden),
        I32(train),
        logits,
        d_pre,
        partial,
        I32(param_stride),
        models=models,
    )


def sum_parts(
    partial,
    n: int,
    hidden: int,
    dw,
    db,
    d_bias_fc1,
    loss,
    loss_log,
    loss_count,
    models: int = 1,
    param_stride: int = 0,
):
    """The blocks' sums in block order: fc2's dw and db, fc1's bias gradient, and the mean loss into loss and
    loss_log[loss_count++]. The models' logs are equally long, one after another: each holds
    loss_log.size // models losses."""
    capacity, rest = divmod(loss_log.size, models)
    if rest:
        raise ValueError(f"a loss log of {loss_log.size} floats does not split into {models} equal logs")
    _sum_parts.launch_1d(
        head_sums(hidden),
        partial,
        I32(blocks(n)),
        I32(n),
        I32(hidden),
        dw,
        db,
        d_bias_fc1,
        loss,
        loss_log,
        loss_count,
        I32(capacity),
        I32(param_stride),
        models=models,
    )
