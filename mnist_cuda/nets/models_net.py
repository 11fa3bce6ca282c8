"""ModelsNet: K models of one architecture stepped together, each fast kernel launched once for all K (the model
is the grid's z: kernels/include/common.cuh), each model exactly as FastNet steps it alone.

The K models' parameters, gradients and running statistics are Parameters.stacked (model m's flat buffers at
m * size); every activation and scratch buffer holds the K models' parts one after another ([K][batch][...] for
a batch's tensors), so the K models' batch is one batch of K * batch images in which model m owns images
m * batch onwards. Every reduction over a batch keeps the single model's parts and order, so each model's
numbers are its FastNet's, bit for bit (tests/test_many_models_gpu.py).
"""

from __future__ import annotations

from .. import cuda, ops
from ..ops import bn_relu_pool, conv1_bn_relu_pool, conv2_implicit_gemm, head, linear_splitk
from .base import CLASSES, EPS, LOSS_CAPACITY, MOMENTUM, PRECISIONS, S2, S3, SLOTS
from .fast_net import FastNet
from .parameters import Parameters


class ModelsNet:
    """The training step of K models (Parameters.stacked) at `batch_size` images each, by the fast kernels."""

    version = "fast"

    def __init__(self, models: list[Parameters], batch_size: int, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
        first = models[0]
        self.cp = cp = first.cp
        self.models, self.count, self.batch_size, self.precision = models, len(models), batch_size, precision
        self.param_stride, self.running_stride = first.params.size, first.stats.size
        self._check_stacked()
        self.p, self.g, self.running = first.p, first.g, first.running  # model 0's: the kernels reach the rest
        c1, c2 = first.channels
        self.c1, self.c2, self.hidden, self.features = c1, c2, first.hidden, c2 * S3 * S3
        self.side, self.conv_side = cuda.SideStream(cp), cuda.SideStream(cp)
        self._block_buffers(cp, c1, c2)
        self._product_buffers(cp, c1, c2)
        K, B = self.count, batch_size
        self.logits = cp.empty((K * B, CLASSES), cp.float32)
        self.loss = cp.zeros(K, cp.float32)
        self.loss_log = cp.zeros((K, LOSS_CAPACITY), cp.float32)
        self.loss_count = cp.zeros(K, cp.int32)
        self.x = self.x_moments = None

    @property
    def images_per_step(self) -> int:
        """The images one step loads: every model's batch."""
        return self.count * self.batch_size

    def _check_stacked(self):
        for m, model in enumerate(self.models):
            for mine, first in ((model.params, self.models[0].params), (model.stats, self.models[0].stats)):
                if mine.data.ptr != first.data.ptr + m * first.nbytes:
                    raise ValueError("the models' buffers must be Parameters.stacked's, one after another")

    def _block_buffers(self, cp, c1, c2):
        K, B, f32 = self.count, self.batch_size, cp.float32
        self.mean1, self.invstd1 = cp.empty((K, c1), f32), cp.empty((K, c1), f32)
        self.partial1 = cp.empty((K, conv1_bn_relu_pool.backward_partial_size(c1)), f32)
        self.counters1 = cp.zeros((2, K, c1), cp.uint32)  # last-block counters per model: moments, backward
        self.out1, self.argmax1 = cp.empty((K * B, c1, S2, S2), f32), cp.empty((K * B, c1, S2, S2), cp.uint8)
        self.moment_partial = cp.empty((K, *conv1_bn_relu_pool.moment_partial_shape()), cp.float64)
        self.moments = [cp.empty((K, conv1_bn_relu_pool.CONV1_MOMENTS), cp.float64) for _ in range(SLOTS)]
        self.mean2, self.invstd2 = cp.empty((K, c2), f32), cp.empty((K, c2), f32)
        self.partial2 = cp.empty((K, bn_relu_pool.partial_size(c2)), f32)
        groups = cuda.ceil_div(c2, bn_relu_pool.BN_CHANNELS)
        self.counters2 = cp.zeros((2, K, groups), cp.uint32)  # statistics, backward
        self.a2, self.d_a2 = cp.empty((K * B, c2, S2, S2), f32), cp.empty((K * B, c2, S2, S2), f32)
        self.out2, self.argmax2 = cp.empty((K * B, c2, S3, S3), f32), cp.empty((K * B, c2, S3, S3), cp.uint8)
        self.a2_at = cp.empty((K * B, c2, S3, S3), f32)
        self.d_out1 = cp.empty((K * B, c1, S2, S2), f32)

    def _product_buffers(self, cp, c1, c2):
        K, B, H, F, f32, precision = self.count, self.batch_size, self.hidden, self.features, cp.float32, self.precision
        self.w2_partial = cp.empty((K, conv2_implicit_gemm.weight_grad_partial_size(c1, c2)), f32)
        self.conv2_forward = conv2_implicit_gemm.forward_product(B, precision)  # the forms of the per-model batch
        self.conv2_input_grad = conv2_implicit_gemm.input_grad_product(B, precision)
        forward_quads = conv2_implicit_gemm.weight_quads(c1, c2, precision, self.conv2_forward)
        input_grad_quads = conv2_implicit_gemm.weight_quads(c2, c1, precision, self.conv2_input_grad)
        self.forward_quads = cp.empty((K * forward_quads, 4), f32)
        self.input_grad_quads = cp.empty((K * input_grad_quads, 4), f32)
        self.fc1_out, self.d_features = cp.empty((K * B, H), f32), cp.empty((K * B, F), f32)
        self.fc1_partial = cp.empty((K, linear_splitk.forward_partial_size(B, F, H)), f32)
        self.fc1_w_partial = cp.empty((K, linear_splitk.weight_partial_size(B, F, H)), f32)
        self.d_pre = cp.empty((K * B, H), f32)
        self.head_partial = cp.empty((K, head.partial_size(B, H)), f32)

    # ---- the step -------------------------------------------------------------------------------------------

    def _k(self, params: bool = False, running: bool = False) -> dict:
        """The K-model launch arguments of an ops function."""
        out = {"models": self.count}
        if params:
            out["param_stride"] = self.param_stride
        if running:
            out["running_stride"] = self.running_stride
        return out

    def prepare_batch(self, x, n: int, slot: int):
        """The image moments of each model's images in device input buffer `slot`."""
        conv1_bn_relu_pool.image_moments(
            x, self.batch_size, self.moment_partial, self.counters1[0], self.moments[slot], **self._k()
        )

    def _stage_conv2_weights(self):
        conv2_implicit_gemm.stage_weights(
            self.p["conv2.weight"],
            self.c1,
            self.c2,
            self.forward_quads,
            self.input_grad_quads,
            self.precision,
            self.conv2_forward,
            self.conv2_input_grad,
            **self._k(params=True),
        )

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """The training forward of the K models on device input buffer `slot` (evaluation runs each model alone,
        through a FastNet: mnist_cuda.models_step)."""
        if not train:
            raise ValueError("ModelsNet steps training; evaluate each model with a FastNet")
        p, r, c1, c2, B = self.p, self.running, self.c1, self.c2, self.batch_size
        self.x, self.x_moments = x, self.moments[slot]
        self.side.run(self._stage_conv2_weights)
        conv1_bn_relu_pool.forward(
            x, p["conv1.weight"], True, self.x_moments, EPS, MOMENTUM, self.mean1, self.invstd1,
            r["bn1.running_mean"], r["bn1.running_var"], p["bn1.weight"], p["bn1.bias"], B, c1, self.out1,
            self.argmax1, **self._k(params=True, running=True),
        )  # fmt: skip
        self.side.join()
        conv2_implicit_gemm.forward(
            self.out1, self.forward_quads, self.a2, B, c1, c2, self.precision, self.conv2_forward, **self._k()
        )
        bn_relu_pool.stats(
            self.a2, B, c2, S2 * S2, self.partial2, self.counters2[0], EPS, MOMENTUM, self.mean2, self.invstd2,
            r["bn2.running_mean"], r["bn2.running_var"], **self._k(running=True),
        )  # fmt: skip
        bn_relu_pool.forward(
            self.a2, self.mean2, self.invstd2, p["bn2.weight"], p["bn2.bias"], B, c2, S2, self.out2, self.argmax2,
            self.a2_at, **self._k(params=True),
        )  # fmt: skip
        linear_splitk.forward(
            self.out2, p["fc1.weight"], p["fc1.bias"], self.fc1_partial, self.fc1_out, B, self.features,
            self.hidden, self.precision, **self._k(params=True),
        )  # fmt: skip
        head.forward_backward(
            self.fc1_out, p["fc2.weight"], p["fc2.bias"], labels, B, self.hidden, True, self.logits, self.d_pre,
            self.head_partial, **self._k(params=True),
        )  # fmt: skip

    def _head_sums(self):
        g = self.g
        head.sum_parts(
            self.head_partial, self.batch_size, self.hidden, g["fc2.weight"], g["fc2.bias"], g["fc1.bias"],
            self.loss, self.loss_log, self.loss_count, **self._k(params=True),
        )  # fmt: skip

    def _fc1_weight_grad(self):
        linear_splitk.backward_weight(
            self.out2, self.d_pre, self.g["fc1.weight"], self.fc1_w_partial, self.batch_size, self.features,
            self.hidden, self.precision, sum_splits=False, **self._k(params=True),
        )  # fmt: skip

    def _conv2_weight_grad(self):
        B, P = self.batch_size, self.param_stride
        parts = conv2_implicit_gemm.backward_weight(
            self.out1, self.d_a2, self.w2_partial, B, self.c1, self.c2, self.precision, **self._k()
        )
        ops.splitk_reduce.splitk_reduce(self.w2_partial, parts, self.g["conv2.weight"], models=self.count, out_stride=P)
        fc1_splits, _ = linear_splitk.weight_splits(B, self.features, self.hidden)
        if fc1_splits > 1:  # after fc1's products on `side`, as FastNet orders them
            self.side.join()
            ops.splitk_reduce.splitk_reduce(
                self.fc1_w_partial, fc1_splits, self.g["fc1.weight"], models=self.count, out_stride=P
            )

    def backward(self, n: int):
        p, g, c1, c2, B = self.p, self.g, self.c1, self.c2, self.batch_size
        self.side.run(self._fc1_weight_grad)
        self.side.run(self._head_sums)
        linear_splitk.backward_input(
            self.d_pre, p["fc1.weight"], self.d_features, B, self.features, self.hidden, precision=self.precision,
            **self._k(params=True),
        )  # fmt: skip
        bn_relu_pool.backward_reduce(
            self.a2_at, self.mean2, self.invstd2, self.d_features, self.argmax2, B, c2, S2, self.partial2,
            self.counters2[1], g["bn2.weight"], g["bn2.bias"], **self._k(params=True),
        )  # fmt: skip
        bn_relu_pool.backward_apply(
            self.a2, self.mean2, self.invstd2, p["bn2.weight"], g["bn2.weight"], g["bn2.bias"], self.d_features,
            self.argmax2, B, c2, S2, self.d_a2, **self._k(params=True),
        )  # fmt: skip
        self.conv_side.run(self._conv2_weight_grad)
        conv2_implicit_gemm.backward_input(
            self.d_a2, self.input_grad_quads, self.d_out1, B, c1, c2, self.precision, self.conv2_input_grad,
            **self._k(),
        )  # fmt: skip
        conv1_bn_relu_pool.backward(
            self.x, p["conv1.weight"], self.mean1, self.invstd1, p["bn1.weight"], self.x_moments, self.d_out1,
            self.argmax1, B, c1, self.partial1, self.counters1[1], g["bn1.weight"], g["bn1.bias"],
            g["conv1.weight"], **self._k(params=True),
        )  # fmt: skip
        self.conv_side.join()
        self.side.join()

    def update(self, opt):
        """The K models' optimizer steps in one launch (optim.ModelsOptimizer): each model's own rate and options."""
        params, grads, _ = self.models[0].stack
        opt.step(params, grads)

    def zero_grad(self):
        """Nothing to do: the update zeroes the gradients."""

    def count_step(self):
        for model in self.models:
            model.num_batches_tracked += 1

    def losses(self, reset: bool = False) -> list:
        """Each model's losses logged since the last reset (synchronises the device)."""
        self.cp.cuda.runtime.deviceSynchronize()
        counts = self.loss_count.get()
        out = [self.loss_log[m, : min(int(c), LOSS_CAPACITY)].get() for m, c in enumerate(counts)]
        if reset:
            self.loss_count.fill(0)
            self.cp.cuda.runtime.deviceSynchronize()
        return out

    def evaluation_net(self) -> FastNet:
        """A FastNet at this batch size for evaluating the models one at a time (FastNet.bind to each)."""
        return FastNet(self.models[0], self.batch_size, self.precision)
