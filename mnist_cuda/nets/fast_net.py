"""FastNet: the step as the fused kernels of kernels/fast/, with side streams for the work nothing reads until
the update (a graph captures them as branches)."""

from __future__ import annotations

import numpy as np

from .. import cuda, ops
from ..ops import bn_relu_pool, conv1_bn_relu_pool, conv2_implicit_gemm, head, linear_splitk
from ..ops.common import NO_POSITION, widen
from ..ops.sgd_zero_grad import sgd_momentum_zero_grad, sgd_zero_grad
from .base import EPS, MOMENTUM, PRECISIONS, S2, S3, SLOTS, _Net
from .parameters import Parameters


class FastNet(_Net):
    """The step as the fused kernels of kernels/fast/. conv1's output is never stored (its BatchNorm
    statistics come from the batch's image moments, taken when the batch is loaded); conv2 and fc1 run on
    the tensor cores; the head is one kernel; the update zeroes the gradients.

    Two side streams carry work that nothing on the main path reads before the update (or, for conv2's
    weight staging, before conv2): `side` takes the staging, fc1's weight-gradient products and the head's
    sums over its blocks; `conv_side` takes conv2's weight gradient, which behind fc1's started late,
    then the sum of fc1's weight-gradient splits, and, where the weight gradient reads x and dy in its layout
    (conv2_implicit_gemm.weight_grad_from_layout), x's layout beside the forward."""

    # the optimizer's kernels (_Net.update), each fused with the zero-grad (ALIGN keeps the flat buffers' size a
    # multiple of 4): plain SGD, and SGD with its options
    sgd, sgd_momentum = staticmethod(sgd_zero_grad), staticmethod(sgd_momentum_zero_grad)

    version = "fast"
    param_stride = running_stride = 0  # one model: no other model's parameters to reach

    def __init__(self, params: Parameters, batch_size: int, precision: str = "fp32"):
        super().__init__(params, batch_size)
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
        cp, B, c1, c2, H, F = self.cp, batch_size, self.c1, self.c2, self.hidden, self.features
        self.precision = precision
        self.side, self.conv_side = cuda.SideStream(cp), cuda.SideStream(cp)
        self._buffers(cp, B, c1, c2, H, F, precision)
        self.x = self.x_moments = None

    def _rows(self, *shape) -> tuple:
        """The shape of a buffer of `shape` per model: itself for one model, [count][shape] for several."""
        return shape if self.count == 1 else (self.count, *shape)

    def _buffers(self, cp, B, c1, c2, H, F, precision):
        """The step's buffers, for `count` models of B images (ModelsNet: their parts one after another)."""
        f32, rows, KB = cp.float32, self._rows, self.count * B
        # block 1: pooled output and its argmax; BatchNorm's statistics; the image moments of the batch in
        # each device input buffer (slot), from its load to its backward
        self.mean1, self.invstd1 = cp.empty(rows(c1), f32), cp.empty(rows(c1), f32)
        self.partial1 = cp.empty(rows(conv1_bn_relu_pool.backward_partial_size(c1)), f32)
        self.counters1 = cp.zeros((2, *rows(c1)), cp.uint32)  # last-block counters: moments, backward
        # conv2's input, conv2's output and their gradients: as bf16 in bf16 (conv2_implicit_gemm.stored_dtype)
        stored = conv2_implicit_gemm.stored_dtype(precision)
        self.out1, self.argmax1 = cp.empty((KB, c1, S2, S2), stored), cp.empty((KB, c1, S2, S2), cp.uint8)
        self.moment_partial = cp.empty(rows(*conv1_bn_relu_pool.moment_partial_shape()), cp.float64)
        self.moments = [cp.empty(rows(conv1_bn_relu_pool.CONV1_MOMENTS), cp.float64) for _ in range(SLOTS)]
        # block 2
        self.mean2, self.invstd2 = cp.empty(rows(c2), f32), cp.empty(rows(c2), f32)
        self.partial2 = cp.empty(rows(bn_relu_pool.partial_size(c2)), f32)
        # conv2's forward's (mean, M2) per part and channel: BN2's statistics where it leaves them (moment_form)
        moments = conv2_implicit_gemm.moment_source(B, precision, self.count)
        self.moment_parts2 = cp.empty(conv2_implicit_gemm.moment_parts_size(c2, B, moments), f32) if moments else None
        self.counters2 = cp.zeros((2, *rows(c2)), cp.uint32)  # last-block counters: statistics, backward
        self.a2, self.d_a2 = cp.empty((KB, c2, S2, S2), stored), cp.empty((KB, c2, S2, S2), stored)
        # block 2's pooled output and its gradient, fc1's input and its gradient: as bf16 in bf16 too
        # (linear_splitk.input_dtype)
        pooled2 = linear_splitk.input_dtype(precision)
        self.out2, self.argmax2 = cp.empty((KB, c2, S3, S3), pooled2), cp.empty((KB, c2, S3, S3), cp.uint8)
        self.a2_at = cp.empty((KB, c2, S3, S3), stored)  # a2 at each window's argmax, for BN2's backward sums
        self.d_out1 = cp.empty((KB, c1, S2, S2), stored)
        self.w2_partial = cp.empty(rows(conv2_implicit_gemm.weight_grad_partial_size(c1, c2)), f32)
        # conv2's input and its output's gradient in the weight gradient's layout, where it reads them there
        self.wgrad_from_layout = conv2_implicit_gemm.weight_grad_from_layout(B, precision)
        if self.wgrad_from_layout:
            size = conv2_implicit_gemm.weight_grad_layout_size
            self.out1_layout = cp.empty(self.count * size(B, c1, precision), stored)
            self.d_a2_layout = cp.empty(self.count * size(B, c2, precision), stored)
        # conv2's weights as its two image-tile products read them (stage_weights), the forward and the input
        # gradient in their forms for batches of up to B images (a model's batch)
        self.conv2_forward = conv2_implicit_gemm.forward_product(B, precision)
        self.conv2_input_grad = conv2_implicit_gemm.input_grad_product(B, precision)
        quads = conv2_implicit_gemm.weight_quads(c1, c2, precision, self.conv2_forward)
        self.forward_quads = cp.empty((self.count * quads, 4), f32)
        quads = conv2_implicit_gemm.weight_quads(c2, c1, precision, self.conv2_input_grad)
        self.input_grad_quads = cp.empty((self.count * quads, 4), f32)
        # fc1 and the head
        self.fc1_out, self.d_features = cp.empty((KB, H), f32), cp.empty((KB, F), pooled2)
        self.fc1_partial = cp.empty(rows(linear_splitk.forward_partial_size(B, F, H)), f32)
        self.fc1_w_partial = cp.empty(rows(linear_splitk.weight_partial_size(B, F, H)), f32)
        # the gradient at fc1's pre-activation and, in bf16, fc1's weight copy: in the dtype fc1's products read them
        # (linear_splitk.operand_dtype: bf16 copies in bf16 from its batch threshold)
        operands = linear_splitk.operand_dtype(precision, B)
        self.d_pre = cp.empty((KB, H), operands)
        self.fc1_weight_copy = cp.empty(self.count * H * F, operands) if operands != np.float32 else None
        self.head_partial = cp.empty(rows(head.partial_size(B, H)), f32)

    def _k(self, params: bool = False, running: bool = False) -> dict:
        """The ops functions' arguments for the models a launch steps (one here; ModelsNet: several, their
        parameters param_stride and running statistics running_stride floats apart)."""
        out = {"models": self.count}
        if params:
            out["param_stride"] = self.param_stride
        if running:
            out["running_stride"] = self.running_stride
        return out

    def prepare_batch(self, x, n: int, slot: int):
        """The image moments of the n images in device input buffer `slot`."""
        conv1_bn_relu_pool.image_moments(x, n, self.moment_partial, self.counters1[0], self.moments[slot], **self._k())

    def _stage_weights(self):
        """conv2's weights as its products read them and, in bf16, fc1's bf16 copy."""
        if self.fc1_weight_copy is not None:
            linear_splitk.weight_to_bf16(
                self.p["fc1.weight"], self.fc1_weight_copy, self.hidden * self.features, **self._k(params=True)
            )
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

    def _conv2_and_bn2_stats(self, n: int, train: bool):
        """conv2's forward, then BN2's statistics (in training) or the running ones (evaluation). Where the forward
        leaves its output's moments (conv2_implicit_gemm.moment_form: its persistent form's blocks, or a block per tile
        in fp32) the statistics are merged from them, not taken by a pass over its output."""
        r, c1, c2, precision = self.running, self.c1, self.c2, self.precision
        form = conv2_implicit_gemm.moment_form(n, c2, precision) if train and self.moment_parts2 is not None else None
        conv2_implicit_gemm.forward(
            self.out1,
            self.forward_quads,
            self.a2,
            n,
            c1,
            c2,
            precision,
            self.conv2_forward,
            moment_parts=self.moment_parts2 if form else None,
            **self._k(),
        )
        statistics = (EPS, MOMENTUM, self.mean2, self.invstd2, r["bn2.running_mean"], r["bn2.running_var"])
        tiles, tile_values = conv2_implicit_gemm.moment_counts(n)
        if form == "blocks":
            parts = conv2_implicit_gemm.moment_part_count(n, c2, precision)
            bn_relu_pool.stats_from_parts(self.moment_parts2, parts, tiles, tile_values, c2, *statistics)
        elif form == "tiles":
            bn_relu_pool.stats_from_tiles(self.moment_parts2, tiles, tile_values, c2, *statistics)
        elif train:
            bn_relu_pool.stats(
                self.a2, n, c2, S2 * S2, self.partial2, self.counters2[0], *statistics, **self._k(running=True)
            )
        else:
            bn_relu_pool.eval_stats(r["bn2.running_mean"], r["bn2.running_var"], EPS, c2, self.mean2, self.invstd2)

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """Logits of the n images x (bytes, device input buffer `slot`: its moments); in training also the
        gradient at fc1's pre-activation and the head's sums (the loss among them, logged in backward)."""
        p, r, c1, c2, H, F = self.p, self.running, self.c1, self.c2, self.hidden, self.features
        self.x, self.x_moments = x, self.moments[slot]
        self.side.run(self._stage_weights)
        if not train:
            bn_relu_pool.eval_stats(r["bn1.running_mean"], r["bn1.running_var"], EPS, c1, self.mean1, self.invstd1)
        conv1_bn_relu_pool.forward(
            x,
            p["conv1.weight"],
            train,
            self.x_moments,
            EPS,
            MOMENTUM,
            self.mean1,
            self.invstd1,
            r["bn1.running_mean"],
            r["bn1.running_var"],
            p["bn1.weight"],
            p["bn1.bias"],
            n,
            c1,
            self.out1,
            self.argmax1,
            **self._k(params=True, running=True),
        )
        if train and self.wgrad_from_layout:  # beside the forward, which does not read it
            self.conv_side.run(
                lambda: conv2_implicit_gemm.to_weight_grad_layout(
                    self.out1, self.out1_layout, n, c1, self.precision, **self._k()
                )
            )
        self.side.join()
        self._conv2_and_bn2_stats(n, train)
        bn_relu_pool.forward(
            self.a2,
            self.mean2,
            self.invstd2,
            p["bn2.weight"],
            p["bn2.bias"],
            n,
            c2,
            S2,
            self.out2,
            self.argmax2,
            self.a2_at,
            **self._k(params=True),
        )
        fc1_weight, weight_stride = self._fc1_weight()
        linear_splitk.forward(
            self.out2,
            fc1_weight,
            p["fc1.bias"],
            self.fc1_partial,
            self.fc1_out,
            n,
            F,
            H,
            self.precision,
            weight_stride=weight_stride,
            **self._k(params=True),
        )
        head.forward_backward(
            self.fc1_out,
            p["fc2.weight"],
            p["fc2.bias"],
            labels,
            n,
            H,
            train,
            self.logits,
            self.d_pre,
            self.head_partial,
            **self._k(params=True),
        )
        self.conv_side.join()  # a forward captured alone ends with its branches

    def _fc1_weight(self) -> tuple:
        """fc1's weight as its products read it, and its models' stride: the bf16 copy in bf16, else the parameter."""
        if self.fc1_weight_copy is None:
            return self.p["fc1.weight"], self.param_stride
        return self.fc1_weight_copy, self.hidden * self.features

    def _head_sums(self, n):
        g = self.g
        head.sum_parts(
            self.head_partial,
            n,
            self.hidden,
            g["fc2.weight"],
            g["fc2.bias"],
            g["fc1.bias"],
            self.loss,
            self.loss_log,
            self.loss_count,
            **self._k(params=True),
        )

    def _fc1_weight_grad(self, n):
        linear_splitk.backward_weight(
            self.out2,
            self.d_pre,
            self.g["fc1.weight"],
            self.fc1_w_partial,
            n,
            self.features,
            self.hidden,
            self.precision,
            sum_splits=False,
            **self._k(params=True),
        )

    def _conv2_weight_grad(self, n):
        x, dy = self.out1, self.d_a2
        if self.wgrad_from_layout:  # written beside the forward and after BN2's backward apply
            x, dy = self.out1_layout, self.d_a2_layout
        parts = conv2_implicit_gemm.backward_weight(
            x, dy, self.w2_partial, n, self.c1, self.c2, self.precision, from_layout=self.wgrad_from_layout, **self._k()
        )
        ops.splitk_reduce.splitk_reduce(
            self.w2_partial, parts, self.g["conv2.weight"], models=self.count, out_stride=self.param_stride
        )
        # fc1's weight-gradient splits are summed here, after fc1's products on `side` (joined): on `side` the
        # sum's blocks took the SMs just as conv2's gradients could start (docs/performance.md)
        fc1_splits, _ = linear_splitk.weight_splits(n, self.features, self.hidden)
        if fc1_splits > 1:
            self.side.join()
            ops.splitk_reduce.splitk_reduce(
                self.fc1_w_partial, fc1_splits, self.g["fc1.weight"], models=self.count, out_stride=self.param_stride
            )

    def backward(self, n: int):
        p, g, c1, c2 = self.p, self.g, self.c1, self.c2
        # fc1's weight-gradient products first: behind the head's sums they would start only as BN2's
        # backward apply does, and contend with it (docs/performance.md)
        self.side.run(lambda: self._fc1_weight_grad(n))
        self.side.run(lambda: self._head_sums(n))
        fc1_weight, weight_stride = self._fc1_weight()
        linear_splitk.backward_input(
            self.d_pre,
            fc1_weight,
            self.d_features,
            n,
            self.features,
            self.hidden,
            precision=self.precision,
            weight_stride=weight_stride,
            **self._k(params=True),
        )
        bn_relu_pool.backward_reduce(
            self.a2_at,
            self.mean2,
            self.invstd2,
            self.d_features,
            self.argmax2,
            n,
            c2,
            S2,
            self.partial2,
            self.counters2[1],
            g["bn2.weight"],
            g["bn2.bias"],
            **self._k(params=True),
        )
        bn_relu_pool.backward_apply(
            self.a2,
            self.mean2,
            self.invstd2,
            p["bn2.weight"],
            g["bn2.weight"],
            g["bn2.bias"],
            self.d_features,
            self.argmax2,
            n,
            c2,
            S2,
            self.d_a2,
            **self._k(params=True),
        )
        if self.wgrad_from_layout:
            # on this stream, so that the weight gradient's blocks start before the input gradient's take every SM
            # (on its own branch, the weight gradient waited for them and then ran beside conv1's backward;
            # docs/performance.md)
            conv2_implicit_gemm.to_weight_grad_layout(self.d_a2, self.d_a2_layout, n, c2, self.precision, **self._k())
        self.conv_side.run(lambda: self._conv2_weight_grad(n))
        conv2_implicit_gemm.backward_input(
            self.d_a2, self.input_grad_quads, self.d_out1, n, c1, c2, self.precision, self.conv2_input_grad, **self._k()
        )
        conv1_bn_relu_pool.backward(
            self.x,
            p["conv1.weight"],
            self.mean1,
            self.invstd1,
            p["bn1.weight"],
            self.x_moments,
            self.d_out1,
            self.argmax1,
            n,
            c1,
            self.partial1,
            self.counters1[1],
            g["bn1.weight"],
            g["bn1.bias"],
            g["conv1.weight"],
            **self._k(params=True),
        )
        self.conv_side.join()
        self.side.join()

    def zero_grad(self):
        """Nothing to do: the update zeroes the gradients."""

    def decisions(self, n: int) -> dict:
        """As NaiveNet.decisions. The blocks' argmax holds NO_POSITION where the ReLU blocked the window; there
        the reference's value and gradient are 0 whatever the position, so it reads as position 0."""

        def positions(argmax):
            argmax = argmax[:n].get()
            return np.where(argmax == NO_POSITION, 0, argmax).astype(np.uint8)

        return {
            "block1": (positions(self.argmax1), widen(self.out1[:n].get()) > 0),
            "block2": (positions(self.argmax2), widen(self.out2[:n].get()) > 0),
            "fc1": self.fc1_out[:n].get() > 0,
        }
