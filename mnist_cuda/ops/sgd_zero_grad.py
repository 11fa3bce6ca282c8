"""The launch contracts of kernels/fast/7_sgd_zero_grad.cu: the update and the zero-grad in one pass."""

from __future__ import annotations

import numpy as np

from .common import F32, I32, source

PLAIN, OPTIONS = 0, 1  # a model's kind in sgd_models_zero_grad: plain SGD, or SGD with its options
_source = source("fast/7_sgd_zero_grad.cu", SGD_PLAIN=PLAIN)
_update = _source.kernel("sgd_zero_grad_fast")
_momentum_update = _source.kernel("sgd_momentum_zero_grad_fast")
_models_update = _source.kernel("sgd_models_zero_grad_fast")


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


def model_hyperparameters(options) -> dict[str, np.ndarray]:
    """sgd_models_zero_grad's per-model arrays by argument name (to copy to the device), from each model's
    optim.SGDOptions, with the values and dtypes the single-model launches pass: kind PLAIN where the options are
    plain (sgd_zero_grad's step), else OPTIONS (sgd_momentum_zero_grad's), momentum, one_minus_dampening,
    weight_decay, nesterov."""
    return {
        "kind": np.array([PLAIN if o.plain else OPTIONS for o in options], np.int32),
        "momentum": np.array([o.momentum for o in options], np.float32),
        "one_minus_dampening": np.array([1.0 - o.dampening for o in options], np.float32),
        "weight_decay": np.array([o.weight_decay for o in options], np.float32),
        "nesterov": np.array([int(bool(o.nesterov)) for o in options], np.int32),
    }


def initial_rates(options) -> np.ndarray:
    """sgd_models_zero_grad's lr [K] as it starts (to copy to the device): a plain model's constant rate (the
    float32 sgd_zero_grad passes), 0 for the others until their schedule (ops.both.sgd_schedule_models) writes
    theirs each step."""
    return np.array([o.lr if o.plain else 0.0 for o in options], np.float32)


def sgd_models_zero_grad(
    params, grads, buffers, lr, first, kind, momentum, one_minus_dampening, weight_decay, nesterov, models: int
):
    """K models' updates and zero-grads in one launch, each with its own hyperparameters: params, grads and
    buffers [K][P] (model m's flat buffers at m * P; buffers may be grads where no model has momentum); on the
    device, [K] each: lr (float32) and first (int32), sgd_schedule_models' outputs (a plain model's lr is its
    constant rate: initial_rates), and kind, momentum, one_minus_dampening, weight_decay, nesterov
    (model_hyperparameters). Model m's results are the bits of sgd_zero_grad (kind PLAIN) or
    sgd_momentum_zero_grad on its buffers alone."""
    n4 = params.size // (4 * models)
    _models_update.launch_1d(
        n4,
        params,
        grads,
        buffers,
        lr,
        first,
        momentum,
        one_minus_dampening,
        weight_decay,
        nesterov,
        kind,
        I32(n4),
        models=models,
    )
