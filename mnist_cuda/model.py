"""The network on the GPU: flat parameter/gradient buffers, layers as views, our kernels for every op.

    Model       parameters (one flat float32 buffer), gradients (another), BN running statistics;
                state_dict() / load_state_dict() with PyTorch's names, so a checkpoint moves between
                this model, mnist_cuda.reference and torch.
    Workspace   everything one batch size needs: activations, pinned staging buffers, the loss log;
                allocated once, so a training step allocates nothing and can be captured as a graph.

One step = load (async host-to-device copy; the fast version also takes the batch's image moments
there, for conv1's BatchNorm) -> forward (+ loss) -> backward -> update -> zero-grad, all launched on
the current stream; nothing waits for the host unless a caller reads the loss. Captured
as a CUDA graph (capture_train_step), the step instead loads the *next* batch on a side branch, into the
other of two device input buffers, while it computes on this one (graph_step runs that protocol).
"""
from __future__ import annotations

import numpy as np

from . import data, kernels, reference
from .kernels import ceil_div, launch, launch_1d, parts_of, split_k

I32, F32 = np.int32, np.float32
ALIGN = 4  # every parameter view starts on a 16-byte boundary (room for float4 loads)
REDUCE_THREADS = 256  # block size of the one-block-per-channel reductions
KERNEL_VERSIONS = ("naive", "fast")


def _offsets(shapes: dict[str, tuple]) -> tuple[dict[str, int], int]:
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name] = total
        total += -(-int(np.prod(shape)) // ALIGN) * ALIGN
    return offsets, total


class Model:
    def __init__(self, channels=(32, 64), hidden=128, kernels_version="naive", tf32=False):
        """tf32: conv2's three products in plain TF32 (as PyTorch's cuDNN convolutions by default) instead
        of 3xTF32; the fast version only."""
        if kernels_version not in KERNEL_VERSIONS:
            raise ValueError(f"unknown kernel version {kernels_version!r}; choose from {KERNEL_VERSIONS}")
        if tf32 and kernels_version != "fast":
            raise ValueError("tf32 needs the fast kernels (the naive ones compute in plain fp32)")
        self.cp = cp = kernels.require_gpu()
        self.channels, self.hidden, self.version, self.tf32 = tuple(channels), hidden, kernels_version, bool(tf32)
        self.shapes = reference.param_shapes(self.channels, hidden)
        offsets, total = _offsets(self.shapes)
        self.params = cp.zeros(total, dtype=cp.float32)
        self.grads = cp.zeros(total, dtype=cp.float32)
        self.p = {k: self.params[o:o + int(np.prod(s))].reshape(s) for (k, s), o in
                  zip(self.shapes.items(), offsets.values())}
        self.g = {k: self.grads[o:o + int(np.prod(s))].reshape(s) for (k, s), o in
                  zip(self.shapes.items(), offsets.values())}
        # running_mean and running_var of bn1 and bn2, one flat buffer as well
        c1, c2 = self.channels
        self.stats = cp.zeros(2 * c1 + 2 * c2, dtype=cp.float32)
        self.running = {"bn1.running_mean": self.stats[:c1], "bn1.running_var": self.stats[c1:2 * c1],
                        "bn2.running_mean": self.stats[2 * c1:2 * c1 + c2],
                        "bn2.running_var": self.stats[2 * c1 + c2:]}
        self.num_batches_tracked = 0
        self._workspaces: dict[int, Workspace] = {}

    # ---- state ------------------------------------------------------------------------------

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
        spec = self.state_spec()
        for name, (shape, dtype) in spec.items():
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

    def workspace(self, batch_size: int) -> "Workspace":
        """The activations and staging buffers for this batch size (made once, then reused)."""
        if batch_size not in self._workspaces:
            self._workspaces[batch_size] = Workspace(self, batch_size)
        return self._workspaces[batch_size]

    # ---- the step ---------------------------------------------------------------------------

    def load(self, ws: "Workspace", slot: int, n: int):
        """Async copy of the n samples staged in pinned slot `slot` into device input buffer `slot`; the
        fast version then also takes the batch's image moments (conv1's BatchNorm statistics come from
        them, and they depend on the images alone)."""
        rt, stream = self.cp.cuda.runtime, self.cp.cuda.get_current_stream().ptr
        src = ws.stage[slot]  # images and labels in one buffer: one copy (of the whole buffer, even if n < B)
        rt.memcpyAsync(ws.batch[slot].data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, stream)
        if self.version == "fast":
            ws.block1.image_moments(ws.x[slot], n, slot)

    def forward(self, ws: "Workspace", n: int, train: bool = True, slot: int = 0):
        """Logits of the batch in device input buffer `slot` into ws.logits; in training also dlogits and the
        loss (ws.loss, ws.loss_log; the fast version records it in backward(), with the head's other sums)."""
        if self.version == "fast":  # conv2's weights staged for its products on the side stream, beside conv1
            ws.side.run(ws.block2.stage_weights)
        h = ws.block1.forward(ws.x[slot], n, train, slot)
        h = ws.block2.forward(h, n, train)
        h = ws.fc1.forward(h, n)
        ws.head.forward(h, ws.y[slot], n, train)

    def backward(self, ws: "Workspace", n: int):
        d = ws.head.backward(n)
        d = ws.fc1.backward(d, n)
        d = ws.block2.backward(d, n, need_input_grad=True)
        ws.block1.backward(d, n, need_input_grad=False)
        ws.conv_side.join()  # the weight gradients and the head's sums launched on the side streams (fast version)
        ws.side.join()

    def update(self, lr: float):
        if self.version == "fast":  # the update also zeroes the gradients (ALIGN keeps the size a multiple of 4)
            n4 = self.params.size // 4
            launch_1d("sgd_update_zero_grad", n4, self.params, self.grads, F32(lr), I32(n4))
        else:
            launch_1d("sgd_update", self.params.size, self.params, self.grads, F32(lr), I32(self.params.size))

    def zero_grad(self):
        if self.version == "fast":
            return  # done by sgd_update_zero_grad in update()
        rt = self.cp.cuda.runtime
        rt.memsetAsync(self.grads.data.ptr, 0, self.grads.nbytes, self.cp.cuda.get_current_stream().ptr)

    def phases(self, ws: "Workspace", slot: int, lr: float):
        """The five phases of a training step on the ws.batch_size samples staged in `slot`, as callables."""
        n = ws.batch_size
        return (lambda: self.load(ws, slot, n), lambda: self.forward(ws, n, True, slot),
                lambda: self.backward(ws, n), lambda: self.update(lr), self.zero_grad)

    def train_step(self, ws: "Workspace", slot: int, lr: float, events=None):
        """One training step on the batch staged in `slot`, launched kernel by kernel. With events (6
        CUDA events) the phase boundaries are recorded for per-phase timing."""
        if events is not None:
            events[0].record()
        for i, phase in enumerate(self.phases(ws, slot, lr)):
            phase()
            if events is not None:
                events[i + 1].record()
        self.num_batches_tracked += 1

    def capture(self, *work):
        """Capture the launches of the callables `work` as one CUDA graph (replay: graph.launch)."""
        cp = self.cp
        kernels.preload()  # module loading is not allowed while a stream is capturing
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                for fn in work:
                    fn()
            finally:
                graph = stream.end_capture()
        return graph

    def capture_train_step(self, ws: "Workspace", slot: int, lr: float):
        """The whole step as one CUDA graph: forward, backward, update and zero-grad on the batch in device
        input buffer `slot`, and on a side branch beside them the load of the next batch (staged in pinned
        slot 1 - slot) into the other device buffer. A batch copied right after the host wrote it is slow
        to copy (30 instead of 13 us at batch 512, NOTES.md), and at the head of the step nothing overlaps
        it. Replay with graph_step."""
        n, other = ws.batch_size, 1 - slot
        _, forward, backward, update, zero_grad = self.phases(ws, slot, lr)
        prefetch = lambda: ws.prefetch.run(lambda: self.load(ws, other, n))
        return self.capture(prefetch, forward, backward, update, zero_grad, ws.prefetch.join)

    def graph_step(self, graphs, ws: "Workspace", step: int, stream, x, y, idx, next_idx=None):
        """Training step number `step` on the samples idx of (x, y) (a full batch: the graphs are captured
        for ws.batch_size) by replaying graphs[step % 2] (from capture_train_step, one per slot) on
        `stream`. The batch is on the device already if the step before prefetched it; otherwise it is
        staged and loaded here first. next_idx (the next step's samples, if known) is staged now, for this
        step's graph to prefetch."""
        slot, other = step % 2, 1 - step % 2
        with stream:
            if ws.prefetched_step != step:
                ws.stage_batch(slot, x, y, idx)
                self.load(ws, slot, ws.batch_size)
                ws.stage_free[slot].record(stream)
            if next_idx is not None:
                ws.stage_batch(other, x, y, next_idx)
            graphs[slot].launch(stream)
            ws.stage_free[other].record(stream)  # the graph copied from the other slot
        ws.prefetched_step = step + 1 if next_idx is not None else None
        self.num_batches_tracked += 1

    def capture_phases(self, ws: "Workspace", slot: int, lr: float):
        """One graph per phase, for per-phase timing of graph replays."""
        return [self.capture(phase) for phase in self.phases(ws, slot, lr)]

    def eval_batch(self, ws: "Workspace", slot: int, n: int):
        """Forward in eval mode (running statistics) of the n samples staged in `slot`, and add the correct
        predictions to ws.correct."""
        ws.prefetched_step = None  # this overwrites a device input buffer
        self.load(ws, slot, n)
        self.forward(ws, n, False, slot)
        launch("count_correct", 1, REDUCE_THREADS, ws.logits, ws.y[slot], ws.correct, I32(n))


# ---------------------------------------------------------------------------------------------
# Layers. Each owns the activations it needs for one batch size and launches the kernels.


class ConvBlock:
    """conv 3x3 pad 1 (no bias) -> BatchNorm2d -> ReLU -> maxpool 2x2."""

    def __init__(self, model: Model, index: int, c_in: int, c_out: int, size: int, batch: int):
        cp = model.cp
        self.m, self.c_in, self.c_out, self.size = model, c_in, c_out, size
        self.w, self.dw = model.p[f"conv{index}.weight"], model.g[f"conv{index}.weight"]
        self.gamma, self.beta = model.p[f"bn{index}.weight"], model.p[f"bn{index}.bias"]
        self.dgamma, self.dbeta = model.g[f"bn{index}.weight"], model.g[f"bn{index}.bias"]
        self.running_mean = model.running[f"bn{index}.running_mean"]
        self.running_var = model.running[f"bn{index}.running_var"]
        full, half = (batch, c_out, size, size), (batch, c_out, size // 2, size // 2)
        self.a = cp.empty(full, cp.float32)  # conv output
        self.z = cp.empty(full, cp.float32)  # batchnorm output
        self.r = cp.empty(full, cp.float32)  # relu output
        self.out = cp.empty(half, cp.float32)  # pooled
        self.argmax = cp.empty(half, cp.uint8)
        self.mean = cp.empty(c_out, cp.float32)
        self.invstd = cp.empty(c_out, cp.float32)
        self.d_r = cp.empty(full, cp.float32)  # gradients of the same tensors
        self.d_z = cp.empty(full, cp.float32)
        self.d_a = cp.empty(full, cp.float32)
        self.d_in = cp.empty((batch, c_in, size, size), cp.float32) if index > 1 else None
        # the first block gets the images as bytes and normalises them first
        self.images = cp.empty((batch, 1, size, size), cp.float32) if index == 1 else None
        self.x = None

    def forward(self, x, n, train, slot=0):
        """slot: the device input buffer x is (only the fast conv1 needs it, for that batch's moments)."""
        if self.images is not None:
            launch_1d("normalize_images", x[:n].size, x, self.images, I32(x[:n].size))
            x = self.images
        self.x = x
        C, K, S = I32(self.c_in), I32(self.c_out), I32(self.size)
        N, HW = I32(n), I32(self.size * self.size)
        full = n * self.c_out * self.size * self.size
        launch_1d("conv2d_forward_naive", full, x, self.w, self.a, N, C, K, S, S)
        if train:
            launch("batchnorm_stats_naive", self.c_out, REDUCE_THREADS, self.a, self.mean, self.invstd,
                   self.running_mean, self.running_var, N, K, HW, F32(reference.BN_EPS),
                   F32(reference.BN_MOMENTUM))
            launch_1d("batchnorm_apply_naive", full, self.a, self.mean, self.invstd, self.gamma,
                      self.beta, self.z, N, K, HW)
        else:
            launch_1d("batchnorm_eval_naive", full, self.a, self.running_mean, self.running_var,
                      self.gamma, self.beta, self.z, N, K, HW, F32(reference.BN_EPS))
        launch_1d("relu_forward_naive", full, self.z, self.r, I32(full))
        launch_1d("maxpool2x2_forward_naive", full // 4, self.r, self.out, self.argmax, N, K, S, S)
        return self.out

    def backward(self, d_out, n, need_input_grad):
        C, K, S = I32(self.c_in), I32(self.c_out), I32(self.size)
        N, HW = I32(n), I32(self.size * self.size)
        full = n * self.c_out * self.size * self.size
        launch_1d("maxpool2x2_backward_naive", full, d_out, self.argmax, self.d_r, N, K, S, S)
        launch_1d("relu_backward_naive", full, self.d_r, self.r, self.d_z, I32(full))
        launch("batchnorm_backward_naive", self.c_out, REDUCE_THREADS, self.d_z, self.a, self.mean,
               self.invstd, self.gamma, self.d_a, self.dgamma, self.dbeta, N, K, HW)
        launch_1d("conv2d_backward_weight_naive", self.dw.size, self.x, self.d_a, self.dw, N, C, K, S, S)
        if need_input_grad:
            launch_1d("conv2d_backward_input_naive", n * self.c_in * self.size * self.size,
                      self.d_a, self.w, self.d_in, N, C, K, S, S)
            return self.d_in
        return None


class HiddenLayer:
    """fc1 -> ReLU over the flattened conv features."""

    def __init__(self, model: Model, n_in: int, n_out: int, batch: int):
        cp = model.cp
        self.n_in, self.n_out = n_in, n_out
        self.w, self.b = model.p["fc1.weight"], model.p["fc1.bias"]
        self.dw, self.db = model.g["fc1.weight"], model.g["fc1.bias"]
        self.h = cp.empty((batch, n_out), cp.float32)  # pre-activation
        self.out = cp.empty((batch, n_out), cp.float32)  # after relu
        self.d_h = cp.empty((batch, n_out), cp.float32)
        self.d_in = cp.empty((batch, n_in), cp.float32)
        self.x = None

    def forward(self, x, n):
        self.x = x
        I, O = I32(self.n_in), I32(self.n_out)
        launch_1d("linear_forward_naive", n * self.n_out, x, self.w, self.b, self.h, I32(n), I, O)
        launch_1d("relu_forward_naive", n * self.n_out, self.h, self.out, I32(n * self.n_out))
        return self.out

    def backward(self, d_out, n):
        I, O = I32(self.n_in), I32(self.n_out)
        launch_1d("relu_backward_naive", n * self.n_out, d_out, self.out, self.d_h, I32(n * self.n_out))
        launch_1d("linear_backward_params_naive", self.n_out * (self.n_in + 1), self.x, self.d_h,
                  self.dw, self.db, I32(n), I, O)
        launch_1d("linear_backward_input_naive", n * self.n_in, self.d_h, self.w, self.d_in, I32(n), I, O)
        return self.d_in


class Head:
    """fc2 -> log_softmax -> NLL (mean); the loss kernel also produces dlogits."""

    def __init__(self, model: Model, n_in: int, batch: int, loss_capacity: int):
        cp = model.cp
        self.n_in = n_in
        self.w, self.b = model.p["fc2.weight"], model.p["fc2.bias"]
        self.dw, self.db = model.g["fc2.weight"], model.g["fc2.bias"]
        self.logits = cp.empty((batch, 10), cp.float32)
        self.d_logits = cp.empty((batch, 10), cp.float32)
        self.d_in = cp.empty((batch, n_in), cp.float32)
        self.loss = cp.zeros(1, cp.float32)
        self.loss_log = cp.zeros(loss_capacity, cp.float32)
        self.loss_count = cp.zeros(1, cp.int32)
        self.x = None

    def forward(self, x, labels, n, train):
        self.x = x
        I = I32(self.n_in)
        launch_1d("linear_forward_naive", n * 10, x, self.w, self.b, self.logits, I32(n), I, I32(10))
        if train:
            launch("cross_entropy_forward_backward", 1, REDUCE_THREADS, self.logits, labels,
                   self.d_logits, self.loss, self.loss_log, self.loss_count, I32(self.loss_log.size), I32(n))

    def backward(self, n):
        I = I32(self.n_in)
        launch_1d("linear_backward_params_naive", 10 * (self.n_in + 1), self.x, self.d_logits,
                  self.dw, self.db, I32(n), I, I32(10))
        launch_1d("linear_backward_input_naive", n * self.n_in, self.d_logits, self.w, self.d_in,
                  I32(n), I, I32(10))
        return self.d_in


# ---------------------------------------------------------------------------------------------------
# The fast version: fused kernels (see kernels/conv1_fused.cu, batchnorm.cu, gemm.cuh, loss.cu). Same
# interface as the layers above, fewer launches, and intermediate tensors that are never written.


class _BatchNormParams:
    """The views and per-batch statistics one BatchNorm layer needs, plus scratch for its reductions."""

    def _init_bn(self, model: Model, index: int, channels: int, scratch: int):
        cp = model.cp
        self.w, self.dw = model.p[f"conv{index}.weight"], model.g[f"conv{index}.weight"]
        self.gamma, self.beta = model.p[f"bn{index}.weight"], model.p[f"bn{index}.bias"]
        self.dgamma, self.dbeta = model.g[f"bn{index}.weight"], model.g[f"bn{index}.bias"]
        self.running_mean = model.running[f"bn{index}.running_mean"]
        self.running_var = model.running[f"bn{index}.running_var"]
        self.mean, self.invstd = cp.empty(channels, cp.float32), cp.empty(channels, cp.float32)
        self.partial = cp.empty(scratch, cp.float32)  # per-part sums; each launch consumes its own
        # last-block counters, one per group of channels: row 0 for the forward's statistics (conv1: its
        # image moments), row 1 for the backward's reduction
        self.counters = cp.zeros((2, channels), cp.uint32)

    def _eval_stats(self, channels):
        """Evaluation normalises with the running statistics: put them where the forward kernels look."""
        launch_1d("batchnorm_eval_stats", channels, self.running_mean, self.running_var, F32(reference.BN_EPS),
                  I32(channels), self.mean, self.invstd)

    def _bn_args(self):
        return self.mean, self.invstd, self.gamma, self.beta


class Conv1BlockFast(_BatchNormParams):
    """conv1 (one input channel) -> BN -> ReLU -> maxpool, fused; conv1's output is recomputed, never
    stored, and BatchNorm's sums come from the batch's image moments, taken when the batch is loaded
    (kernels/conv1_fused.cu)."""

    def __init__(self, model: Model, c_out: int, batch: int, slots: int):
        cp = model.cp
        self.c_out, self.m = c_out, model
        self._init_bn(model, 1, c_out, kernels.MAX_PARTS * c_out * kernels.CONV1_GRAD_SUMS)
        half = (batch, c_out, 14, 14)
        self.out = cp.empty(half, cp.float32)
        self.argmax = cp.empty(half, cp.uint8)
        self.moment_partial = cp.empty((kernels.sm_count(), kernels.CONV1_MOMENTS), cp.float64)
        # the image moments of the batch in each device input buffer, from its load to its backward
        self.moments = [cp.empty(kernels.CONV1_MOMENTS, cp.float64) for _ in range(slots)]
        self.x = self.batch_moments = None

    def image_moments(self, x, n, slot):
        """The image moments of the n images x (device input buffer `slot`) into self.moments[slot]."""
        parts, per_part = kernels.conv1_moments_parts(n)
        launch("conv1_image_moments_fast", parts, kernels.CONV1_THREADS, x, I32(n), I32(per_part), self.moment_partial,
               self.counters[0], self.moments[slot])

    def forward(self, x, n, train, slot=0):
        self.x, self.batch_moments = x, self.moments[slot]
        C, groups = self.c_out, ceil_div(self.c_out, kernels.CONV1_CHANNELS)
        if not train:
            self._eval_stats(C)
        launch("conv1_bn_relu_pool_fast", (n, groups), kernels.CONV1_THREADS, x, self.w, I32(train), self.batch_moments,
               F32(reference.BN_EPS), F32(reference.BN_MOMENTUM), self.mean, self.invstd, self.running_mean,
               self.running_var, self.gamma, self.beta, I32(n), I32(C), self.out, self.argmax)
        return self.out

    def backward(self, d_out, n, need_input_grad):
        assert not need_input_grad, "the input images need no gradient"
        grid, per_part = kernels.conv1_backward_grid(n, self.c_out)
        launch("conv1_backward_fast", grid, kernels.CONV1_THREADS, self.x, self.w, self.mean, self.invstd, self.gamma,
               self.batch_moments, d_out, self.out, self.argmax, I32(n), I32(self.c_out), I32(per_part), self.partial,
               self.counters[1], self.dgamma, self.dbeta, self.dw)
        return None


class ConvBlockFast(_BatchNormParams):
    """conv (implicit GEMM) -> BN statistics -> BN+ReLU+maxpool fused; backward: BN reductions over the
    pooled gradient, BN's input gradient, then the convolution's weight (split-K) and input gradients."""

    def __init__(self, model: Model, index: int, c_in: int, c_out: int, size: int, batch: int,
                 side: "SideStream", grad_side: "SideStream"):
        if size != 14:
            raise ValueError("the fast convolution kernels are compiled for conv2's 14x14")
        cp = model.cp
        self.m, self.c_in, self.c_out, self.size = model, c_in, c_out, size
        self._init_bn(model, index, c_out, kernels.MAX_PARTS * c_out * 2)
        full, half = (batch, c_out, size, size), (batch, c_out, size // 2, size // 2)
        self.a = cp.empty(full, cp.float32)  # conv output
        self.d_a = cp.empty(full, cp.float32)
        self.out = cp.empty(half, cp.float32)
        self.argmax = cp.empty(half, cp.uint8)
        self.d_in = cp.empty((batch, c_in, size, size), cp.float32)
        self.w_partial = cp.empty(kernels.sm_count() * c_out * c_in * 9, cp.float32)  # per part of the images
        # the weights as the products read them, split into TF32 parts (conv2d_stage_weights_fast, or _tf32)
        self.forward_quads = cp.empty((kernels.conv_weight_quads(c_in, c_out, model.tf32), 4), cp.float32)
        self.input_grad_quads = cp.empty((kernels.conv_weight_quads(c_out, c_in, model.tf32), 4), cp.float32)
        self.side = side  # staging beside conv1's forward
        self.grad_side = grad_side  # weight gradient beside the input gradient and conv1's backward
        self.x = None

    def forward(self, x, n, train):
        self.x = x
        C, K, S, HW = I32(self.c_in), I32(self.c_out), I32(self.size), self.size * self.size
        parts, per_part = parts_of(n)
        self.side.join()  # stage_weights
        kernels.launch_conv_image_tile("forward", self.m.tf32, n, self.c_out, x, self.forward_quads, self.a, I32(n),
                                       C, K, S, S)
        if train:
            launch("batchnorm_stats_fast", (parts, ceil_div(self.c_out, 8)), 256, self.a, I32(n), K, I32(HW),
                   I32(per_part), self.partial, self.counters[0], F32(reference.BN_EPS),
                   F32(reference.BN_MOMENTUM), self.mean, self.invstd, self.running_mean, self.running_var)
        else:
            self._eval_stats(self.c_out)
        launch_1d("batchnorm_relu_maxpool_fast", self.out[:n].size, self.a, *self._bn_args(), I32(n), K, S,
                  self.out, self.argmax)
        return self.out

    def stage_weights(self):
        """The weights as both products read them (Model.forward launches this on the side stream first)."""
        kernels.stage_conv_weights(self.w, self.c_in, self.c_out, self.forward_quads, self.input_grad_quads,
                                   self.m.tf32)

    def _weight_grad(self, n):
        parts = kernels.launch_conv_weight_grad(n, self.c_in, self.c_out, self.x, self.d_a, self.w_partial,
                                                self.m.tf32)
        kernels.splitk_reduce(self.w_partial, parts, self.dw)

    def backward(self, d_out, n, need_input_grad):
        C, K, S = I32(self.c_in), I32(self.c_out), I32(self.size)
        parts, per_part = parts_of(n)
        launch("batchnorm_backward_reduce_fast", (parts, ceil_div(self.c_out, 8)), 256, self.a, self.mean,
               self.invstd, d_out, self.out, self.argmax, I32(n), K, S, I32(per_part), self.partial,
               self.counters[1], self.dgamma, self.dbeta)
        launch_1d("batchnorm_backward_apply_fast", self.out[:n].size, self.a, self.mean, self.invstd, self.gamma,
                  self.dgamma, self.dbeta, d_out, self.out, self.argmax, I32(n), K, S, self.d_a)
        self.grad_side.run(lambda: self._weight_grad(n))
        if need_input_grad:
            kernels.launch_conv_image_tile("backward_input", self.m.tf32, n, self.c_in, self.d_a, self.input_grad_quads,
                                           self.d_in, I32(n), C, K, S, S)
            return self.d_in
        return None


class HiddenLayerFast:
    """fc1 -> ReLU: a split-K product, then a reduction that adds the bias and applies the ReLU.
    backward() takes the gradient at the pre-activation (HeadFast applies the ReLU mask)."""

    def __init__(self, model: Model, n_in: int, n_out: int, batch: int, side: "SideStream"):
        cp = model.cp
        self.n_in, self.n_out, self.side = n_in, n_out, side
        self.w, self.b = model.p["fc1.weight"], model.p["fc1.bias"]
        self.dw = model.g["fc1.weight"]
        self.out = cp.empty((batch, n_out), cp.float32)
        self.d_in = cp.empty((batch, n_in), cp.float32)
        self.partial = cp.empty(kernels.max_splits(n_in) * batch * n_out, cp.float32)  # forward's splits
        self.w_partial = cp.empty(kernels.max_splits(batch) * n_out * n_in, cp.float32)  # weight gradient's
        self.x = None

    def _tiles(self, n):
        return ceil_div(self.n_out, kernels.TILE) * ceil_div(n, kernels.TILE)

    def _weight_tiles(self):
        return ceil_div(self.n_in, kernels.TILE) * ceil_div(self.n_out, kernels.TILE)

    def forward(self, x, n):
        self.x = x
        I, O = I32(self.n_in), I32(self.n_out)
        splits, k_per_split = split_k(self.n_in, self._tiles(n))
        launch("linear_forward_fast", (ceil_div(self.n_out, kernels.TILE), ceil_div(n, kernels.TILE), splits),
               kernels.GEMM_THREADS, x, self.w, self.partial, I32(n), I, O, I32(k_per_split))
        kernels.splitk_reduce(self.partial, splits, self.out, bias=self.b, relu=True, count=n * self.n_out)
        return self.out

    def _weight_grad(self, d_pre, n):
        I, O = I32(self.n_in), I32(self.n_out)
        splits, k_per_split = split_k(n, self._weight_tiles())
        launch("linear_backward_weight_fast", (ceil_div(self.n_in, kernels.TILE), ceil_div(self.n_out, kernels.TILE),
                                               splits),
               kernels.GEMM_THREADS, self.x, d_pre, self.dw if splits == 1 else self.w_partial, I32(n), I, O,
               I32(k_per_split))
        if splits > 1:
            kernels.splitk_reduce(self.w_partial, splits, self.dw)

    def backward(self, d_pre, n):
        I, O = I32(self.n_in), I32(self.n_out)
        self.side.run(lambda: self._weight_grad(d_pre, n))
        kernel, grid = kernels.linear_input_grad_launch(n, self.n_in)
        launch(kernel, grid, kernels.GEMM_THREADS, d_pre, self.w, self.d_in, I32(n), I, O)
        return self.d_in


class HeadFast:
    """fc2 -> log_softmax -> NLL and all of their backward in one kernel (kernels/loss.cu), which also
    produces fc1's bias gradient and the gradient at fc1's pre-activation. Its sums over the batch (fc2's
    gradients, fc1's bias gradient, the loss) are added by a second kernel, which backward() launches on
    the side stream: only the update reads them."""

    def __init__(self, model: Model, n_in: int, batch: int, loss_capacity: int, side: "SideStream"):
        cp = model.cp
        self.n_in, self.side = n_in, side
        self.w, self.b = model.p["fc2.weight"], model.p["fc2.bias"]
        self.dw, self.db, self.d_bias_fc1 = model.g["fc2.weight"], model.g["fc2.bias"], model.g["fc1.bias"]
        self.logits = cp.empty((batch, 10), cp.float32)
        self.d_pre = cp.empty((batch, n_in), cp.float32)
        self.partial = cp.empty(ceil_div(batch, kernels.HEAD_SAMPLES) * kernels.head_sums(n_in), cp.float32)
        self.loss = cp.zeros(1, cp.float32)
        self.loss_log = cp.zeros(loss_capacity, cp.float32)
        self.loss_count = cp.zeros(1, cp.int32)

    def forward(self, x, labels, n, train):
        launch("head_forward_backward_fast", ceil_div(n, kernels.HEAD_SAMPLES), kernels.HEAD_THREADS, x, self.w,
               self.b, labels, I32(n), I32(self.n_in), I32(train), self.logits, self.d_pre, self.partial)

    def backward(self, n):
        """The gradient at fc1's pre-activation, computed in forward(); the blocks' sums are added beside
        what follows."""
        self.side.run(lambda: launch_1d("head_sum_parts", kernels.head_sums(self.n_in), self.partial,
                                        I32(ceil_div(n, kernels.HEAD_SAMPLES)), I32(n), I32(self.n_in), self.dw,
                                        self.db, self.d_bias_fc1, self.loss, self.loss_log, self.loss_count,
                                        I32(self.loss_log.size)))
        return self.d_pre


class SideStream:
    """A second stream for work that may overlap the current stream's: the weight gradients and the head's
    sums over the batch, which nothing reads before the update, and conv2's weight staging, which nothing
    reads before conv2.
    run(fn) launches fn's kernels on the side stream after everything launched so far on the current
    stream; join() makes the current stream wait for them. Captured in a graph, the two streams become
    two branches of it. Outside a capture fn runs on the current stream instead: launched one by one, a
    step is bound by the host's launches and a second stream gains nothing, while eager work on the side
    stream (two launches queued there beside the current stream's) made every later replay of the step
    graph ~3 us slower at batch 64, for the rest of the process (H100, NOTES.md; the cause is not known)."""

    def __init__(self, cp):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.forked = cp.cuda.Event(disable_timing=True)
        self.done = cp.cuda.Event(disable_timing=True)
        self.pending = False

    def run(self, fn):
        current = self.cp.cuda.get_current_stream()
        if not current.is_capturing():
            fn()
            return
        self.forked.record(current)
        self.stream.wait_event(self.forked)
        with self.stream:
            fn()
        self.pending = True

    def join(self):
        if self.pending:  # (a capture may only wait for events recorded inside it)
            self.done.record(self.stream)
            self.cp.cuda.get_current_stream().wait_event(self.done)
            self.pending = False


class Workspace:
    """Everything a step at one batch size touches, allocated once."""

    STAGING_SLOTS = 2  # the host fills one pinned slot while the GPU copies from the other
    LOSS_CAPACITY = 1 << 16

    def __init__(self, model: Model, batch_size: int):
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        self.cp = cp = model.cp
        self.batch_size = B = batch_size
        c1, c2 = model.channels
        if B * max(c1, c2) * 28 * 28 >= 2 ** 31:
            raise ValueError(f"batch size {B} is too large for 32-bit indexing")
        # One byte buffer holds a batch's images (uint8, as MNIST stores them: the kernels normalise) and
        # then its labels (int32; B * 784 bytes keep them aligned), on the host (pinned) and on the device,
        # so that the load is a single copy of a quarter of the float32 batch. Two of each (slots): the
        # host fills one pinned slot while the GPU copies from the other, and the step graph computes on
        # one device buffer while it loads the next batch into the other. x, y and stage_x, stage_y are
        # views into them, per slot.
        size = B * 784 + 4 * B
        self.batch = [cp.zeros(size, cp.uint8) for _ in range(self.STAGING_SLOTS)]
        self.x = [b[:B * 784].reshape(B, 1, 28, 28) for b in self.batch]
        self.y = [b[B * 784:].view(cp.int32) for b in self.batch]
        self.prefetched_step = None  # the step whose batch graph_step's last graph loaded (any other step loads its own)
        self.stage = [kernels.pinned_empty((size,), np.uint8) for _ in range(self.STAGING_SLOTS)]
        self.stage_x = [st[:B * 784].reshape(B, 1, 28, 28) for st in self.stage]
        self.stage_y = [st[B * 784:].view(np.int32) for st in self.stage]
        for st in self.stage:
            st[...] = 0  # labels of unfilled rows (a partial last batch) stay valid class numbers
        self.stage_free = [cp.cuda.Event(disable_timing=True) for _ in range(self.STAGING_SLOTS)]
        self.side = SideStream(cp)  # conv2's weight staging, the head's sums and fc1's weight gradient
        # conv2's weight gradient, on a stream of its own: behind fc1's weight gradient (which shares the SMs
        # with the main branch) it started late (batch 512: 361 -> 350 us, H100, NOTES.md v17k; the staging
        # on this stream too made the step slower at both sizes)
        self.conv_side = SideStream(cp)
        self.prefetch = SideStream(cp)  # the step graph's load of the next batch
        if model.version == "fast":
            self.block1 = Conv1BlockFast(model, c1, B, self.STAGING_SLOTS)
            self.block2 = ConvBlockFast(model, 2, c1, c2, 14, B, self.side, self.conv_side)
            self.fc1 = HiddenLayerFast(model, c2 * 49, model.hidden, B, self.side)
            self.head = HeadFast(model, model.hidden, B, self.LOSS_CAPACITY, self.side)
        else:
            self.block1 = ConvBlock(model, 1, 1, c1, 28, B)
            self.block2 = ConvBlock(model, 2, c1, c2, 14, B)
            self.fc1 = HiddenLayer(model, c2 * 49, model.hidden, B)
            self.head = Head(model, model.hidden, B, self.LOSS_CAPACITY)
        self.correct = cp.zeros(1, cp.int32)

    @property
    def logits(self):
        return self.head.logits

    def stage_batch(self, slot: int, x, y, idx) -> int:
        """Gather the samples idx of (x, y) into pinned slot `slot`, once the GPU has stopped reading it
        (stage_free[slot]: record it after whatever reads the slot). Returns the batch length."""
        self.stage_free[slot].synchronize()
        return data.gather(x, y, idx, self.stage_x[slot], self.stage_y[slot])

    def losses(self, reset: bool = False) -> np.ndarray:
        """The losses logged since the last reset. Synchronises the whole device: the steps may run on
        any stream, and a reset must land before the next step's loss kernel."""
        self.cp.cuda.runtime.deviceSynchronize()
        count = int(self.head.loss_count.get()[0])
        out = self.head.loss_log[:min(count, self.head.loss_log.size)].get()
        if reset:
            self.head.loss_count.fill(0)
            self.cp.cuda.runtime.deviceSynchronize()
        return out
