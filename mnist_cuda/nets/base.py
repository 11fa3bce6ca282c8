"""What both nets share: the network's sizes and constants (the kernel versions, the precisions, the loss log's
capacity, the device input slots), and _Net, the base of both: the logits, the loss log and the accuracy count."""

from __future__ import annotations

import numpy as np

from .. import data, reference
from ..ops import both
from .parameters import Parameters

S1 = data.IMAGE_SIZE  # conv1's images
S2 = S1 // 2  # conv2's
S3 = S2 // 2  # the pooled features fc1 reads
CLASSES = data.NUM_CLASSES
EPS, MOMENTUM = reference.BN_EPS, reference.BN_MOMENTUM
KERNEL_VERSIONS = ("naive", "fast")
# the precision of the fast kernels' tensor-core products (conv2's and fc1's): fp32 keeps float32's accuracy
# (3xTF32); tf32 runs conv2 in plain TF32, as PyTorch's cuDNN convolutions by default; bf16 runs conv2 and
# fc1 on bf16 operands, as torch.autocast(dtype=torch.bfloat16), and stores conv2's input and output, fc1's input,
# and their gradients as bf16, as autocast does. Accumulation, BatchNorm's statistics, the loss and the update stay
# float32 in all three. The naive kernels compute in plain fp32.
PRECISIONS = ("fp32", "tf32", "bf16")
LOSS_CAPACITY = 1 << 16  # losses logged on the GPU between two reads
SLOTS = 2  # device input buffers a step alternates between (FastNet keeps the image moments of each)


class _Net:
    """What both versions share: sizes, the loss log, the accuracy counter, the update (each version names its
    optimizer kernels, sgd and sgd_momentum)."""

    count = 1  # the models a step steps (nets.ModelsNet: several), each with its loss log

    def __init__(self, params: Parameters, batch_size: int):
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        c1, c2 = params.channels
        if self.count * batch_size * max(c1, c2) * S1 * S1 >= 2**31:  # the models' batches are one batch
            images = f"batch size {batch_size}" if self.count == 1 else f"{self.count} models x batch size {batch_size}"
            raise ValueError(f"{images} is too large for 32-bit indexing")
        self.cp, self.params, self.batch_size = params.cp, params, batch_size
        self.c1, self.c2, self.hidden = c1, c2, params.hidden
        self.features = c2 * S3 * S3  # fc1's inputs
        self.p, self.g, self.running = params.p, params.g, params.running
        cp, K = self.cp, self.count
        self.logits = cp.empty((K * batch_size, CLASSES), cp.float32)
        self.loss = cp.zeros(K, cp.float32)
        self.loss_log = cp.zeros(LOSS_CAPACITY if K == 1 else (K, LOSS_CAPACITY), cp.float32)
        self.loss_count = cp.zeros(K, cp.int32)

    @property
    def images_per_step(self) -> int:
        return self.batch_size

    def bind(self, params: Parameters):
        """Compute with another model's parameters from now on (one of the same architecture): a K-model run
        evaluates its models one at a time through one net."""
        self.params, self.p, self.g, self.running = params, params.p, params.g, params.running

    def count_step(self):
        """A training step was taken: BatchNorm's batch counter, as torch's num_batches_tracked."""
        self.params.num_batches_tracked += 1

    def prepare_batch(self, x, n: int, slot: int):
        """Work on a batch that depends on its images alone, launched right after its load."""

    def update(self, opt):
        """The optimizer's step (optim.Optimizer) by the net's kernels: plain SGD at a constant rate, or with its
        options (its schedule's rate first)."""
        p, o = self.params, opt.options
        if o.plain:
            self.sgd(p.params, p.grads, o.lr)
            return
        opt.schedule()
        self.sgd_momentum(
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

    def count_correct(self, labels, correct, n: int):
        """correct += the samples of the last forward whose largest logit is the label."""
        both.count_correct(self.logits, labels, correct, n)

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
