"""The launch contract of kernels/fast/sgd_zero_grad.cu: the update and the zero-grad in one pass."""
from __future__ import annotations

from .common import F32, I32, source

_update = source("fast/sgd_zero_grad.cu").kernel("sgd_zero_grad_fast")


def sgd_zero_grad(params, grads, lr: float):
    """params -= lr * grads; grads = 0, four floats per thread (sizes a multiple of 4, 16-byte aligned)."""
    n4 = params.size // 4
    _update.launch_1d(n4, params, grads, F32(lr), I32(n4))
