"""ModelsNet: K models of one architecture stepped together, each fast kernel launched once for all K (the model
is the grid's z: kernels/include/common.cuh), each model exactly as FastNet steps it alone.

The K models' parameters, gradients and running statistics are Parameters.stacked (model m's flat buffers at
m * size); every activation and scratch buffer holds the K models' parts one after another ([K][batch][...] for
a batch's tensors), so the K models' batch is one batch of K * batch images in which model m owns images
m * batch onwards. FastNet's step is this one with one model: its buffers, forward and backward take the count.
Every reduction over a batch keeps the single model's parts and order, so each model's numbers are its FastNet's,
bit for bit (tests/test_many_models_gpu.py), with one exception: a lone model of 1,024 images or more takes BN2's
statistics from its forward's moments (conv2_implicit_gemm.moment_form), grouped otherwise than the statistics pass
a ModelsNet runs: there the statistics differ in their last bits, and so the steps after.
"""

from __future__ import annotations

from .base import LOSS_CAPACITY
from .fast_net import FastNet
from .parameters import Parameters


class ModelsNet(FastNet):
    """The training step of K models (Parameters.stacked) at `batch_size` images each, by the fast kernels."""

    def __init__(self, models: list[Parameters], batch_size: int, precision: str = "fp32"):
        first = models[0]
        self.models, self.count = models, len(models)
        self.param_stride, self.running_stride = first.params.size, first.stats.size
        for m, model in enumerate(models):
            for mine, base in ((model.params, first.params), (model.stats, first.stats)):
                if mine.data.ptr != base.data.ptr + m * base.nbytes:
                    raise ValueError("the models' buffers must be Parameters.stacked's, one after another")
        super().__init__(first, batch_size, precision)  # model 0's views: the kernels reach the others

    @property
    def images_per_step(self) -> int:
        """The images one step loads: every model's batch."""
        return self.count * self.batch_size

    # the step runner passes the images of all the models; the kernels take one model's batch
    def prepare_batch(self, x, n: int, slot: int):
        super().prepare_batch(x, self.batch_size, slot)

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """The training forward of the K models (evaluation runs each model alone through a FastNet:
        mnist_cuda.models_step)."""
        if not train:
            raise ValueError("ModelsNet steps training; evaluate each model with a FastNet")
        super().forward(x, labels, self.batch_size, True, slot)

    def backward(self, n: int):
        super().backward(self.batch_size)

    def update(self, opt):
        """The K models' optimizer steps in one launch (optim.ModelsOptimizer): each model's own rate and options."""
        params, grads, _ = self.models[0].stack
        opt.step(params, grads)

    def count_step(self):
        for model in self.models:
            model.num_batches_tracked += 1

    def losses(self, reset: bool = False) -> list:
        """Each model's losses logged since the last reset (synchronises the device)."""
        self.cp.cuda.runtime.deviceSynchronize()
        counts, logs = self.loss_count.get(), self.loss_log.reshape(self.count, LOSS_CAPACITY)  # (one model: a row)
        out = [logs[m, : min(int(c), LOSS_CAPACITY)].get() for m, c in enumerate(counts)]
        if reset:
            self.loss_count.fill(0)
            self.cp.cuda.runtime.deviceSynchronize()
        return out

    def evaluation_net(self) -> FastNet:
        """A FastNet at this batch size for evaluating the models one at a time (bind it to each)."""
        return FastNet(self.models[0], self.batch_size, self.precision)
