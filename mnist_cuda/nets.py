"""The network on the GPU: its parameters in flat buffers, and the two kernel versions of its step.

    Parameters   every parameter in one flat float32 buffer and every gradient in another (each layer's
                 tensors are views), the BatchNorm running statistics; state_dict() / load_state_dict()
                 with torch's names, so a checkpoint moves between this, mnist_cuda.reference and torch.
    NaiveNet     the step as the plain kernels of kernels/naive/: one op per launch.
    FastNet      the step as the fused kernels of kernels/fast/, with side streams for the work nothing
                 reads until the update (a graph captures them as branches).

A net holds the activations of one batch size, allocated once: a step allocates nothing. Its methods
launch on the current stream; mnist_cuda.step drives them (staging, loads, graphs, evaluation).
"""

from __future__ import annotations

import numpy as np

from . import cuda, data, ops, reference
from .ops import bn_relu_pool, conv1_bn_relu_pool, conv2_implicit_gemm, head, linear_splitk, naive
from .ops.common import NO_POSITION
from .ops.sgd_zero_grad import sgd_momentum_zero_grad, sgd_zero_grad

ALIGN = 4  # every parameter view starts on a 16-byte boundary (room for float4 loads)
S1 = data.IMAGE_SIZE  # conv1's images
S2 = S1 // 2  # conv2's
S3 = S2 // 2  # the pooled features fc1 reads
CLASSES = data.NUM_CLASSES
EPS, MOMENTUM = reference.BN_EPS, reference.BN_MOMENTUM
KERNEL_VERSIONS = ("naive", "fast")
# the precision of the fast kernels' tensor-core products (conv2's and fc1's): fp32 keeps float32's accuracy
# (3xTF32); tf32 runs conv2 in plain TF32, as PyTorch's cuDNN convolutions by default; bf16 runs conv2 and
# fc1 on bf16 operands, as torch.autocast(dtype=torch.bfloat16). Accumulation, BatchNorm, the loss and the
# update stay float32 in all three. The naive kernels compute in plain fp32.
PRECISIONS = ("fp32", "tf32", "bf16")
LOSS_CAPACITY = 1 << 16  # losses logged on the GPU between two reads
SLOTS = 2  # device input buffers a step alternates between (FastNet keeps the image moments of each)


class Parameters:
    """Parameters, gradients and BatchNorm running statistics on the GPU, with torch's names."""

    def __init__(self, channels=(32, 64), hidden=128):
        self.cp = cp = cuda.require_gpu()
        self.channels, self.hidden = tuple(channels), hidden
        self.shapes = reference.param_shapes(self.channels, hidden)
        offsets, total = {}, 0
        for name, shape in self.shapes.items():
            offsets[name] = total
            total += cuda.ceil_div(int(np.prod(shape)), ALIGN) * ALIGN
        self.offsets = offsets
        self.params = cp.zeros(total, dtype=cp.float32)
        self.grads = cp.zeros(total, dtype=cp.float32)
        self.p, self.g = self.views(self.params), self.views(self.grads)
        c1, c2 = self.channels
        self.stats = cp.zeros(2 * c1 + 2 * c2, dtype=cp.float32)  # one flat buffer as well
        self.running = {
            "bn1.running_mean": self.stats[:c1],
            "bn1.running_var": self.stats[c1 : 2 * c1],
            "bn2.running_mean": self.stats[2 * c1 : 2 * c1 + c2],
            "bn2.running_var": self.stats[2 * c1 + c2 :],
        }
        self.num_batches_tracked = 0

    def views(self, flat) -> dict:
        """Each parameter's view into a flat buffer of this layout (parameters, gradients, momentum)."""
        return {
            k: flat[o : o + int(np.prod(s))].reshape(s) for (k, s), o in zip(self.shapes.items(), self.offsets.values())
        }

    def state_spec(self):
        return reference.state_dict_spec(self.channels, self.hidden)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies in torch's order and names (conv1.weight, bn1.weight, ..., fc2.bias)."""
        self.cp.cuda.runtime.deviceSynchronize()  # training may run on another (non-blocking) stream
        out = {}
        for name in self.state_spec():
            if name.endswith("num_batches_tracked"):
                out[name] = np.array(self.num_batches_tracked, dtype=np.int64)
            else:
                out[name] = (self.p[name] if name in self.p else self.running[name]).get()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]):
        for name, (shape, _) in self.state_spec().items():
            if name not in state:
                raise KeyError(f"state_dict lacks {name}")
            value = np.asarray(state[name])
            if value.shape != tuple(shape):
                raise ValueError(f"{name}: shape {value.shape}, expected {tuple(shape)}")
            if name.endswith("num_batches_tracked"):
                self.num_batches_tracked = int(value)
            else:
                target = self.p[name] if name in self.p else self.running[name]
                target.set(np.ascontiguousarray(value, dtype=np.float32))
        self.cp.cuda.runtime.deviceSynchronize()  # the steps run on non-blocking streams


class _Net:
    """What both versions share: sizes, the loss log, the accuracy counter."""

    def __init__(self, params: Parameters, batch_size: int):
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        c1, c2 = params.channels
        if batch_size * max(c1, c2) * S1 * S1 >= 2**31:
            raise ValueError(f"batch size {batch_size} is too large for 32-bit indexing")
        self.cp, self.params, self.batch_size = params.cp, params, batch_size
        self.c1, self.c2, self.hidden = c1, c2, params.hidden
        self.features = c2 * S3 * S3  # fc1's inputs
        self.p, self.g, self.running = params.p, params.g, params.running
        cp = self.cp
        self.logits = cp.empty((batch_size, CLASSES), cp.float32)
        self.loss = cp.zeros(1, cp.float32)
        self.loss_log = cp.zeros(LOSS_CAPACITY, cp.float32)
        self.loss_count = cp.zeros(1, cp.int32)

    def prepare_batch(self, x, n: int, slot: int):
        """Work on a batch that depends on its images alone, launched right after its load."""

    def count_correct(self, labels, correct, n: int):
        """correct += the samples of the last forward whose largest logit is the label."""
        naive.count_correct(self.logits, labels, correct, n)

    def losses(self, reset: bool = False) -> np.ndarray:
        """The losses logged since the last reset. Synchronises the whole device: the steps may run on
        any stream, and a reset must land before the next step's loss kernel."""
        self.cp.cuda.runtime.deviceSynchronize()
        count = int(self.loss_count.get()[0])
        out = self.loss_log[: min(count, self.loss_log.size)].get()
        if reset:
            self.loss_count.fill(0)
            self.cp.cuda.runtime.deviceSynchronize()
        return out


class _NaiveBlock:
    """The activations of one conv -> BatchNorm -> ReLU -> maxpool block of the naive net."""

    def __init__(self, cp, index: int, c_in: int, c_out: int, size: int, batch: int, params: Parameters):
        self.c_in, self.c_out, self.size = c_in, c_out, size
        self.w, self.dw = params.p[f"conv{index}.weight"], params.g[f"conv{index}.weight"]
        self.gamma, self.beta = params.p[f"bn{index}.weight"], params.p[f"bn{index}.bias"]
        self.dgamma, self.dbeta = params.g[f"bn{index}.weight"], params.g[f"bn{index}.bias"]
        self.running_mean = params.running[f"bn{index}.running_mean"]
        self.running_var = params.running[f"bn{index}.running_var"]
        full, half = (batch, c_out, size, size), (batch, c_out, size // 2, size // 2)
        self.a, self.z, self.r = (cp.empty(full, cp.float32) for _ in range(3))  # conv, BatchNorm, ReLU outputs
        self.out, self.argmax = cp.empty(half, cp.float32), cp.empty(half, cp.uint8)  # pooled
        self.mean, self.invstd = cp.empty(c_out, cp.float32), cp.empty(c_out, cp.float32)
        self.d_r, self.d_z, self.d_a = (cp.empty(full, cp.float32) for _ in range(3))
        self.d_in = cp.empty((batch, c_in, size, size), cp.float32) if index > 1 else None
        self.x = None

    def forward(self, x, n: int, train: bool):
        self.x = x
        C, K, S, hw = self.c_in, self.c_out, self.size, self.size * self.size
        naive.conv2d_forward(x, self.w, self.a, n, C, K, S)
        if train:
            naive.batchnorm_stats(
                self.a, self.mean, self.invstd, self.running_mean, self.running_var, n, K, hw, EPS, MOMENTUM
            )
            naive.batchnorm_apply(self.a, self.mean, self.invstd, self.gamma, self.beta, self.z, n, K, hw)
        else:
            naive.batchnorm_eval(
                self.a, self.running_mean, self.running_var, self.gamma, self.beta, self.z, n, K, hw, EPS
            )
        naive.relu_forward(self.z, self.r, n * K * hw)
        naive.maxpool_forward(self.r, self.out, self.argmax, n, K, S)
        return self.out

    def backward(self, d_out, n: int, need_input_grad: bool):
        C, K, S, hw = self.c_in, self.c_out, self.size, self.size * self.size
        naive.maxpool_backward(d_out, self.argmax, self.d_r, n, K, S)
        naive.relu_backward(self.d_r, self.r, self.d_z, n * K * hw)
        naive.batchnorm_backward(
            self.d_z, self.a, self.mean, self.invstd, self.gamma, self.d_a, self.dgamma, self.dbeta, n, K, hw
        )
        naive.conv2d_backward_weight(self.x, self.d_a, self.dw, n, C, K, S)
        if need_input_grad:
            naive.conv2d_backward_input(self.d_a, self.w, self.d_in, n, C, K, S)
        return self.d_in


class NaiveNet(_Net):
    """The step as one plain kernel per op (kernels/naive/)."""

    version = "naive"

    def __init__(self, params: Parameters, batch_size: int):
        super().__init__(params, batch_size)
        cp, B, H = self.cp, batch_size, self.hidden
        self.images = cp.empty((B, 1, S1, S1), cp.float32)  # the batch normalised
        self.block1 = _NaiveBlock(cp, 1, 1, self.c1, S1, B, params)
        self.block2 = _NaiveBlock(cp, 2, self.c1, self.c2, S2, B, params)
        self.fc1_pre, self.fc1_out = cp.empty((B, H), cp.float32), cp.empty((B, H), cp.float32)
        self.d_fc1_out, self.d_fc1_pre = cp.empty((B, H), cp.float32), cp.empty((B, H), cp.float32)
        self.d_features = cp.empty((B, self.features), cp.float32)
        self.d_logits = cp.empty((B, CLASSES), cp.float32)

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """Logits of the n images x (bytes); in training also the loss (logged) and its gradient."""
        p, F, H = self.p, self.features, self.hidden
        naive.normalize(x, self.images, n * S1 * S1)
        h = self.block1.forward(self.images, n, train)
        h = self.block2.forward(h, n, train)
        naive.linear_forward(h, p["fc1.weight"], p["fc1.bias"], self.fc1_pre, n, F, H)
        naive.relu_forward(self.fc1_pre, self.fc1_out, n * H)
        naive.linear_forward(self.fc1_out, p["fc2.weight"], p["fc2.bias"], self.logits, n, H, CLASSES)
        if train:
            naive.cross_entropy(self.logits, labels, self.d_logits, self.loss, self.loss_log, self.loss_count, n)

    def backward(self, n: int):
        p, g, F, H = self.p, self.g, self.features, self.hidden
        naive.linear_backward_params(self.fc1_out, self.d_logits, g["fc2.weight"], g["fc2.bias"], n, H, CLASSES)
        naive.linear_backward_input(self.d_logits, p["fc2.weight"], self.d_fc1_out, n, H, CLASSES)
        naive.relu_backward(self.d_fc1_out, self.fc1_out, self.d_fc1_pre, n * H)
        naive.linear_backward_params(self.block2.out, self.d_fc1_pre, g["fc1.weight"], g["fc1.bias"], n, F, H)
        naive.linear_backward_input(self.d_fc1_pre, p["fc1.weight"], self.d_features, n, F, H)
        d = self.block2.backward(self.d_features, n, need_input_grad=True)
        self.block1.backward(d, n, need_input_grad=False)

    def update(self, opt):
        """The optimizer's step (optim.Optimizer): plain SGD at a constant rate, or with its options."""
        p, o = self.params, opt.options
        if o.plain:
            naive.sgd(p.params, p.grads, o.lr)
            return
        opt.schedule()
        naive.sgd_momentum(
            p.params,
            p.grads,
            opt.buffers if opt.buffers is not None else p.grads,
            opt.lr,
            opt.first,
            o.momentum,
            o.dampening,
            o.weight_decay,
            o.nesterov,
        )

    def zero_grad(self):
        grads = self.params.grads
        rt = self.cp.cuda.runtime
        rt.memsetAsync(grads.data.ptr, 0, grads.nbytes, self.cp.cuda.get_current_stream().ptr)

    def decisions(self, n: int) -> dict:
        """The ReLU and max-pool choices of the last training forward (reference.ReferenceModel.forward):
        each block's argmax and open windows, fc1's ReLU mask."""
        return {
            "block1": (self.block1.argmax[:n].get(), self.block1.out[:n].get() > 0),
            "block2": (self.block2.argmax[:n].get(), self.block2.out[:n].get() > 0),
            "fc1": self.fc1_out[:n].get() > 0,
        }


class FastNet(_Net):
    """The step as the fused kernels of kernels/fast/. conv1's output is never stored (its BatchNorm
    statistics come from the batch's image moments, taken when the batch is loaded); conv2 and fc1 run on
    the tensor cores; the head is one kernel; the update zeroes the gradients.

    Two side streams carry work that nothing on the main path reads before the update (or, for conv2's
    weight staging, before conv2): `side` takes the staging, fc1's weight-gradient products and the head's
    sums over its blocks; `conv_side` takes conv2's weight gradient, which behind fc1's started late,
    then the sum of fc1's weight-gradient splits."""

    version = "fast"

    def __init__(self, params: Parameters, batch_size: int, precision: str = "fp32"):
        super().__init__(params, batch_size)
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
        cp, B, c1, c2, H, F = self.cp, batch_size, self.c1, self.c2, self.hidden, self.features
        self.precision = precision
        self.side, self.conv_side = cuda.SideStream(cp), cuda.SideStream(cp)
        f32 = cp.float32
        # block 1: pooled output and its argmax; BatchNorm's statistics; the image moments of the batch in
        # each device input buffer (slot), from its load to its backward
        self.mean1, self.invstd1 = cp.empty(c1, f32), cp.empty(c1, f32)
        self.partial1 = cp.empty(conv1_bn_relu_pool.backward_partial_size(c1), f32)
        self.counters1 = cp.zeros((2, c1), cp.uint32)  # last-block counters: moments, backward
        self.out1, self.argmax1 = cp.empty((B, c1, S2, S2), f32), cp.empty((B, c1, S2, S2), cp.uint8)
        self.moment_partial = cp.empty(conv1_bn_relu_pool.moment_partial_shape(), cp.float64)
        self.moments = [cp.empty(conv1_bn_relu_pool.CONV1_MOMENTS, cp.float64) for _ in range(SLOTS)]
        # block 2
        self.mean2, self.invstd2 = cp.empty(c2, f32), cp.empty(c2, f32)
        self.partial2 = cp.empty(bn_relu_pool.partial_size(c2), f32)
        self.counters2 = cp.zeros((2, c2), cp.uint32)  # last-block counters: statistics, backward
        self.a2, self.d_a2 = cp.empty((B, c2, S2, S2), f32), cp.empty((B, c2, S2, S2), f32)
        self.out2, self.argmax2 = cp.empty((B, c2, S3, S3), f32), cp.empty((B, c2, S3, S3), cp.uint8)
        self.a2_at = cp.empty((B, c2, S3, S3), f32)  # a2 at each window's argmax, for BN2's backward sums
        self.d_out1 = cp.empty((B, c1, S2, S2), f32)
        self.w2_partial = cp.empty(conv2_implicit_gemm.weight_grad_partial_size(c1, c2), f32)
        # conv2's weights as its two image-tile products read them (stage_weights), the forward and the input
        # gradient in their forms for batches of up to B images
        self.conv2_forward = conv2_implicit_gemm.forward_product(B, precision)
        self.conv2_input_grad = conv2_implicit_gemm.input_grad_product(B, precision)
        self.forward_quads = cp.empty((conv2_implicit_gemm.weight_quads(c1, c2, precision, self.conv2_forward), 4), f32)
        self.input_grad_quads = cp.empty(
            (conv2_implicit_gemm.weight_quads(c2, c1, precision, self.conv2_input_grad), 4), f32
        )
        # fc1 and the head
        self.fc1_out, self.d_features = cp.empty((B, H), f32), cp.empty((B, F), f32)
        self.fc1_partial = cp.empty(linear_splitk.forward_partial_size(B, F, H), f32)
        self.fc1_w_partial = cp.empty(linear_splitk.weight_partial_size(B, F, H), f32)
        self.d_pre = cp.empty((B, H), f32)  # the gradient at fc1's pre-activation
        self.head_partial = cp.empty(head.partial_size(B, H), f32)
        self.x = self.x_moments = None

    def prepare_batch(self, x, n: int, slot: int):
        """The image moments of the n images in device input buffer `slot`."""
        conv1_bn_relu_pool.image_moments(x, n, self.moment_partial, self.counters1[0], self.moments[slot])

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
        )

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """Logits of the n images x (bytes, device input buffer `slot`: its moments); in training also the
        gradient at fc1's pre-activation and the head's sums (the loss among them, logged in backward)."""
        p, r, c1, c2, H, F = self.p, self.running, self.c1, self.c2, self.hidden, self.features
        self.x, self.x_moments = x, self.moments[slot]
        self.side.run(self._stage_conv2_weights)
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
        )
        self.side.join()
        conv2_implicit_gemm.forward(
            self.out1, self.forward_quads, self.a2, n, c1, c2, self.precision, self.conv2_forward
        )
        if train:
            bn_relu_pool.stats(
                self.a2,
                n,
                c2,
                S2 * S2,
                self.partial2,
                self.counters2[0],
                EPS,
                MOMENTUM,
                self.mean2,
                self.invstd2,
                r["bn2.running_mean"],
                r["bn2.running_var"],
            )
        else:
            bn_relu_pool.eval_stats(r["bn2.running_mean"], r["bn2.running_var"], EPS, c2, self.mean2, self.invstd2)
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
        )
        linear_splitk.forward(
            self.out2, p["fc1.weight"], p["fc1.bias"], self.fc1_partial, self.fc1_out, n, F, H, self.precision
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
        )

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
        )

    def _conv2_weight_grad(self, n):
        parts = conv2_implicit_gemm.backward_weight(
            self.out1, self.d_a2, self.w2_partial, n, self.c1, self.c2, self.precision
        )
        ops.splitk_reduce.splitk_reduce(self.w2_partial, parts, self.g["conv2.weight"])
        # fc1's weight-gradient splits are summed here, after fc1's products on `side` (joined): on `side` the
        # sum's blocks took the SMs just as conv2's gradients could start (docs/performance.md)
        fc1_splits, _ = linear_splitk.weight_splits(n, self.features, self.hidden)
        if fc1_splits > 1:
            self.side.join()
            ops.splitk_reduce.splitk_reduce(self.fc1_w_partial, fc1_splits, self.g["fc1.weight"])

    def backward(self, n: int):
        p, g, c1, c2 = self.p, self.g, self.c1, self.c2
        # fc1's weight-gradient products first: behind the head's sums they would start only as BN2's
        # backward apply does, and contend with it (docs/performance.md)
        self.side.run(lambda: self._fc1_weight_grad(n))
        self.side.run(lambda: self._head_sums(n))
        linear_splitk.backward_input(
            self.d_pre, p["fc1.weight"], self.d_features, n, self.features, self.hidden, precision=self.precision
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
        )
        self.conv_side.run(lambda: self._conv2_weight_grad(n))
        conv2_implicit_gemm.backward_input(
            self.d_a2, self.input_grad_quads, self.d_out1, n, c1, c2, self.precision, self.conv2_input_grad
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
        )
        self.conv_side.join()
        self.side.join()

    def update(self, opt):
        """The optimizer's step (optim.Optimizer), fused with the zero-grad (ALIGN keeps the flat buffers'
        size a multiple of 4)."""
        p, o = self.params, opt.options
        if o.plain:
            sgd_zero_grad(p.params, p.grads, o.lr)
            return
        opt.schedule()
        sgd_momentum_zero_grad(
            p.params,
            p.grads,
            opt.buffers if opt.buffers is not None else p.grads,
            opt.lr,
            opt.first,
            o.momentum,
            o.dampening,
            o.weight_decay,
            o.nesterov,
        )

    def zero_grad(self):
        """Nothing to do: the update zeroes the gradients."""

    def decisions(self, n: int) -> dict:
        """As NaiveNet.decisions. The blocks' argmax holds NO_POSITION where the ReLU blocked the window; there
        the reference's value and gradient are 0 whatever the position, so it reads as position 0."""

        def positions(argmax):
            argmax = argmax[:n].get()
            return np.where(argmax == NO_POSITION, 0, argmax).astype(np.uint8)

        return {
            "block1": (positions(self.argmax1), self.out1[:n].get() > 0),
            "block2": (positions(self.argmax2), self.out2[:n].get() > 0),
            "fc1": self.fc1_out[:n].get() > 0,
        }


def kernel_sources(kernels: str | None) -> list[cuda.Source]:
    """The kernel sources a step and the evaluation of a net of `kernels` launch from, the ones
    mnist_cuda.cuda.preload compiles for it: its folder's (kernels/naive/ or kernels/fast/) and the naive
    ones every net shares (the accuracy count, the optimizer's schedule, the augmentation's shift); every
    declared source for None."""
    if kernels is None:
        return cuda.sources()
    if kernels not in KERNEL_VERSIONS:
        raise ValueError(f"unknown kernel version {kernels!r}; choose from {KERNEL_VERSIONS}")
    own = [s for s in cuda.sources() if s.path.startswith(f"{kernels}/")]
    return list(dict.fromkeys(own + list(naive.SHARED_SOURCES)))


def make_net(params: Parameters, batch_size: int, kernels: str = "fast", precision: str = "fp32"):
    """The net of a kernel version ("naive" or "fast") at a precision of PRECISIONS (tf32 and bf16: fast only)."""
    if kernels not in KERNEL_VERSIONS:
        raise ValueError(f"unknown kernel version {kernels!r}; choose from {KERNEL_VERSIONS}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
    if kernels == "naive":
        if precision != "fp32":
            raise ValueError(f"{precision} needs the fast kernels (the naive ones compute in plain fp32)")
        return NaiveNet(params, batch_size)
    return FastNet(params, batch_size, precision)
