"""The step runner of K models stepped together (nets.ModelsNet, optim.ModelsOptimizer): mnist_cuda.step.Step's
staging, loads, graphs and modes, with the K models' batches side by side in one load (model m's images and
labels at m * batch), each model's batch from its own sample order and its augmentation offsets from its own
seed and amount, as its single run draws them; and the evaluation of each model alone, through one FastNet
bound to each model in turn (the single run's evaluation, bit for bit)."""

from __future__ import annotations

import numpy as np

from . import cuda, data
from .step import Step


class ModelsStep(Step):
    """Training steps of the K models of `net` (a ModelsNet); augments and seeds: each model's."""

    def __init__(self, net, optimizer, augments: list[int], seeds: list[int], mode: str = "graph", first_step: int = 0):
        super().__init__(net, optimizer, mode=mode, augment=max(augments), seed=0, first_step=first_step)
        self.augments, self.seeds, self.per_model = list(augments), list(seeds), net.batch_size
        self.evaluator = None
        # the kernels' forms for several models (common.cuh's MODEL_INDEX) beside the one-model forms the shift
        # and the evaluation launch
        self.sources = self.sources + [s.models_variant() for s in self.sources]
        cuda.preload(self.sources)

    def stage_batch(self, slot: int, x, y, idx, step: int) -> int:
        """Gather each model's samples idx[m] for training step number `step` into its rows of pinned slot
        `slot` (once the GPU has stopped reading it), with each model's offsets when augmenting (zero for a model
        without augmentation: shifting by nothing leaves its images as they are). Returns the images staged."""
        self.stage_free[slot].synchronize()
        B = self.per_model
        for m, rows in enumerate(idx):
            part = slice(m * B, (m + 1) * B)
            data.gather(x, y, rows, self.stage_x[slot][part], self.stage_y[slot][part])
            if self.augment:
                a, offsets = self.augments[m], self.stage_offsets[slot][part]
                if a:
                    offsets[...] = np.random.default_rng([self.seeds[m], step]).integers(-a, a + 1, offsets.shape)
                else:
                    offsets[...] = 0
        return len(idx) * B

    def losses(self, reset: bool = False) -> list:
        """Each model's losses logged since the last reset (synchronises the device)."""
        return self.net.losses(reset)

    def _evaluator(self) -> Step:
        if self.evaluator is None:
            self.evaluator = Step(self.net.evaluation_net(), 0.05)  # (never trained)
        return self.evaluator

    def evaluate_models(self, x, y) -> list[float]:
        """Each model's accuracy over every sample of (x, y), as its single run's Step.evaluate gives it."""
        return [self._bound(m).evaluate(x, y) for m in range(self.net.count)]

    def model_logits(self, m: int, x) -> np.ndarray:
        """Model m's logits over every sample of x, as its single run's Step.logits gives them."""
        return self._bound(m).logits(x)

    def _bound(self, m: int) -> Step:
        self.cp.cuda.runtime.deviceSynchronize()  # training may still run on this runner's stream
        evaluator = self._evaluator()
        evaluator.net.bind(self.net.models[m])
        return evaluator
