"""The launch contracts of the naive kernels (kernels/naive/): one thread per output element, except the
reductions over a channel or the batch, which take one block of REDUCE_THREADS threads each. (The kernels
both nets launch, the augmentation's shift, the optimizer's schedule and the accuracy count, are
mnist_cuda/ops/both.py's.)

Tensors are NCHW float32 cupy arrays; n is the number of samples to process (a workspace may hold more)."""

from __future__ import annotations

from .common import F32, I32, source

REDUCE_THREADS = 256  # a block per channel (BatchNorm) or per batch (the loss)

_normalize = source("naive/1_normalize.cu")
_conv2d = source("naive/2_conv2d.cu")
_batchnorm = source("naive/3_batchnorm.cu")
_relu = source("naive/4_relu.cu")
_maxpool = source("naive/5_maxpool.cu")
_linear = source("naive/6_linear.cu")
_cross_entropy = source("naive/7_cross_entropy.cu")
_sgd = source("naive/8_sgd.cu")

_k = {
    name: src.kernel(name)
    for src, names in [
        (_normalize, ["normalize_naive"]),
        (_conv2d, ["conv2d_forward_naive", "conv2d_backward_input_naive", "conv2d_backward_weight_naive"]),
        (
            _batchnorm,
            ["batchnorm_stats_naive", "batchnorm_apply_naive", "batchnorm_eval_naive", "batchnorm_backward_naive"],
        ),
        (_relu, ["relu_forward_naive", "relu_backward_naive"]),
        (_maxpool, ["maxpool2x2_forward_naive", "maxpool2x2_backward_naive"]),
        (_linear, ["linear_forward_naive", "linear_backward_input_naive", "linear_backward_params_naive"]),
        (_cross_entropy, ["cross_entropy_naive"]),
        (_sgd, ["sgd_naive", "sgd_momentum_naive"]),
    ]
    for name in names
}


def normalize(images, out, count: int):
    """out = (images / 255 - MNIST_MEAN) / MNIST_STD for the first `count` pixels (images as bytes)."""
    _k["normalize_naive"].launch_1d(count, images, out, I32(count))


def conv2d_forward(x, w, y, n: int, c_in: int, c_out: int, size: int):
    """y [n, c_out, size, size] = conv3x3(x [n, c_in, size, size], w [c_out, c_in, 3, 3]), zero padding 1."""
    _k["conv2d_forward_naive"].launch_1d(
        n * c_out * size * size, x, w, y, I32(n), I32(c_in), I32(c_out), I32(size), I32(size)
    )


def conv2d_backward_input(dy, w, dx, n: int, c_in: int, c_out: int, size: int):
    _k["conv2d_backward_input_naive"].launch_1d(
        n * c_in * size * size, dy, w, dx, I32(n), I32(c_in), I32(c_out), I32(size), I32(size)
    )


def conv2d_backward_weight(x, dy, dw, n: int, c_in: int, c_out: int, size: int):
    _k["conv2d_backward_weight_naive"].launch_1d(
        dw.size, x, dy, dw, I32(n), I32(c_in), I32(c_out), I32(size), I32(size)
    )


def batchnorm_stats(
    x, mean, invstd, running_mean, running_var, n: int, channels: int, hw: int, eps: float, momentum: float
):
    """The batch's mean and 1/std per channel, and the running statistics' update (in place)."""
    _k["batchnorm_stats_naive"].launch(
        channels,
        REDUCE_THREADS,
        x,
        mean,
        invstd,
        running_mean,
        running_var,
        I32(n),
        I32(channels),
        I32(hw),
        F32(eps),
        F32(momentum),
    )


def batchnorm_apply(x, mean, invstd, gamma, beta, y, n: int, channels: int, hw: int):
    _k["batchnorm_apply_naive"].launch_1d(
        n * channels * hw, x, mean, invstd, gamma, beta, y, I32(n), I32(channels), I32(hw)
    )


def batchnorm_eval(x, running_mean, running_var, gamma, beta, y, n: int, channels: int, hw: int, eps: float):
    _k["batchnorm_eval_naive"].launch_1d(
        n * channels * hw, x, running_mean, running_var, gamma, beta, y, I32(n), I32(channels), I32(hw), F32(eps)
    )


def batchnorm_backward(dy, x, mean, invstd, gamma, dx, dgamma, dbeta, n: int, channels: int, hw: int):
    _k["batchnorm_backward_naive"].launch(
        channels, REDUCE_THREADS, dy, x, mean, invstd, gamma, dx, dgamma, dbeta, I32(n), I32(channels), I32(hw)
    )


def relu_forward(x, y, count: int):
    _k["relu_forward_naive"].launch_1d(count, x, y, I32(count))


def relu_backward(dy, y, dx, count: int):
    """dx = dy where ReLU's output y > 0, else 0."""
    _k["relu_backward_naive"].launch_1d(count, dy, y, dx, I32(count))


def maxpool_forward(x, y, argmax, n: int, channels: int, size: int):
    """y, argmax [n, channels, size/2, size/2] (argmax: the window position 0..3, as bytes)."""
    _k["maxpool2x2_forward_naive"].launch_1d(
        n * channels * (size // 2) ** 2, x, y, argmax, I32(n), I32(channels), I32(size), I32(size)
    )


def maxpool_backward(dy, argmax, dx, n: int, channels: int, size: int):
    _k["maxpool2x2_backward_naive"].launch_1d(
        n * channels * size * size, dy, argmax, dx, I32(n), I32(channels), I32(size), I32(size)
    )


def linear_forward(x, w, b, y, n: int, n_in: int, n_out: int):
    """y [n, n_out] = x [n, n_in] w^T + b."""
    _k["linear_forward_naive"].launch_1d(n * n_out, x, w, b, y, I32(n), I32(n_in), I32(n_out))


def linear_backward_input(dy, w, dx, n: int, n_in: int, n_out: int):
    _k["linear_backward_input_naive"].launch_1d(n * n_in, dy, w, dx, I32(n), I32(n_in), I32(n_out))


def linear_backward_params(x, dy, dw, db, n: int, n_in: int, n_out: int):
    """dw = dy^T x and db = the sum of dy over the batch, one thread per element of both."""
    _k["linear_backward_params_naive"].launch_1d(n_out * (n_in + 1), x, dy, dw, db, I32(n), I32(n_in), I32(n_out))


def cross_entropy(logits, labels, dlogits, loss, loss_log, loss_count, n: int):
    """The mean NLL of log_softmax(logits) into loss and loss_log[loss_count++], and dlogits."""
    _k["cross_entropy_naive"].launch(
        1, REDUCE_THREADS, logits, labels, dlogits, loss, loss_log, loss_count, I32(loss_log.size), I32(n)
    )


def sgd(params, grads, lr: float):
    """params -= lr * grads over the flat buffers."""
    _k["sgd_naive"].launch_1d(params.size, params, grads, F32(lr), I32(params.size))


def sgd_momentum(
    params, grads, buffers, lr, first, momentum: float, dampening: float, weight_decay: float, nesterov: bool
):
    """torch.optim.SGD's step over the flat buffers at the rate lr[0] (a device float) with its options;
    first[0]: the momentum buffers take the direction as it is (their first step)."""
    _k["sgd_momentum_naive"].launch_1d(
        params.size,
        params,
        grads,
        buffers,
        lr,
        first,
        F32(momentum),
        F32(1.0 - dampening),
        F32(weight_decay),
        I32(bool(nesterov)),
        I32(params.size),
    )
