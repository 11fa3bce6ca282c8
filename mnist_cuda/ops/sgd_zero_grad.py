"""The launch contracts of kernels/fast/7_sgd_zero_grad.cu: the update and the zero-grad in one pass."""

from __future__ import annotations

from .common import F32, I32, source

_source = source("fast/7_sgd_zero_grad.cu")
_update = _source.kernel("sgd_zero_grad_fast")
_momentum_update = _source.kernel("sgd_momentum_zero_grad_fast")


def sgd_zero_grad(params, grads, lr: float):
    """params -= lr * grads; grads = 0, four floats per thread (sizes a multiple of 4, 16-byte aligned)."""
    n4 = params.size // 4
    _update.launch_1d(n4, params, grads, F32(lr), I32(n4))


def sgd_momentum_zero_grad(
    params, grads, buffers, lr, first, momentum: float, dampening: float, weight_decay: float, nesterov: bool
):
    """torch.optim.SGD's step with its options at the rate lr[0] (ops.naive.sgd_momentum), then grads = 0,
    four floats per thread."""
    n4 = params.size // 4
    _momentum_update.launch_1d(
        n4,
        params,
        grads,
        buffers,
        lr,
        first,
        F32(momentum),
        F32(1.0 - dampening),
        F32(weight_decay),
        I32(bool(nesterov)),
        I32(n4),
    )
