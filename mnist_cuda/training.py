"""How the trainer trains, without its command line: its default settings and named recipes, the plan of
the batches a run trains (epoch by epoch, continued exactly from a checkpoint's place), and the loop that
trains one epoch's chunk of them with a step runner (mnist_cuda.step).

mnist_cuda.train is the command around these; the sweeps (scripts/), the comparison with PyTorch
(mnist_cuda.compare) and the dev tools train through them too, so a run there is the trainer's run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from . import data

PHASE_SAMPLE_EVERY = 50
LOG_EVERY = 100  # read the loss log (one sync) this often for the progress bar and the NaN check

# batch size and learning rate as scripts/sweep_hparams.py chose them (README, Results)
DEFAULTS = dict(
    dataset="mnist",
    epochs=10,
    batch_size=64,
    lr=0.05,
    seed=0,
    channels=(32, 64),
    hidden=128,
    kernels="fast",
    precision="fp32",
    shuffle=True,
    augment=0,
)
# named sets of flags, chosen by scripts/sweep_recipes.py on the H200 (benchmarks/results/recipes-h200.json):
# fast, the fewest seconds of training to 99.0% test accuracy on every seed; best, the highest mean accuracy
RECIPES = {
    "fast": dict(
        batch_size=128,
        lr=0.05,
        epochs=2,
        momentum=0.9,
        nesterov=True,
        weight_decay=5e-4,
        schedule="onecycle",
        target_accuracy=99.0,
    ),
    "best": dict(
        batch_size=64,
        lr=0.05,
        epochs=20,
        momentum=0.9,
        nesterov=True,
        weight_decay=5e-4,
        schedule="onecycle",
        augment=2,
    ),
}


class TrainingDiverged(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands: the next step's number (from 1), the epoch it belongs to (from 0) and the
    samples of that epoch's order already trained on."""

    step: int = 0
    epoch: int = 0
    sample: int = 0


@dataclasses.dataclass
class Chunk:
    """The steps of one epoch that a run trains: its batches and where training stands after them."""

    epoch: int
    batches: list
    end: Position

    @property
    def first_step(self) -> int:
        """The steps trained before the chunk's first one: its first step is number first_step + 1."""
        return self.end.step - len(self.batches)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The batches of `steps` steps from `start`, one chunk per epoch touched, each made as it is asked for:
    a long run holds one epoch's order at a time, and each iteration makes the same chunks afresh (the
    comparison runs one plan on each side). An epoch's order is a permutation seeded by (seed, epoch)
    (data.epoch_order) and drops its partial last batch, so a run continued from a checkpoint trains the same
    batches as one run that never stopped."""

    n_samples: int
    batch_size: int
    seed: int
    shuffle: bool
    start: Position
    steps: int

    def __iter__(self) -> Iterator[Chunk]:
        return _chunks(self.n_samples, self.batch_size, self.seed, self.shuffle, self.start, self.steps)


def plan(n_samples: int, batch_size: int, seed: int, shuffle: bool, start: Position, steps: int) -> Plan:
    """The Plan of `steps` steps from `start` (ValueError for a batch larger than the training set)."""
    if batch_size > n_samples:
        raise ValueError(f"batch size {batch_size} is larger than the training set ({n_samples} samples)")
    return Plan(n_samples, batch_size, seed, shuffle, start, steps)


def _chunks(n_samples, batch_size, seed, shuffle, start: Position, steps: int) -> Iterator[Chunk]:
    epoch, sample, step, left = start.epoch, start.sample, start.step, steps
    while left > 0:
        order = data.epoch_order(n_samples, seed, epoch, shuffle)
        batches = list(data.batch_indices(order[sample:], batch_size, drop_last=True))[:left]
        if not batches:  # less than a batch left of this epoch (possible after a change of batch size)
            epoch, sample = epoch + 1, 0
            continue
        this_epoch = epoch
        left -= len(batches)
        step += len(batches)
        sample += len(batches) * batch_size
        if sample + batch_size > n_samples:  # the epoch is done: its partial last batch is dropped
            epoch, sample = epoch + 1, 0
        yield Chunk(this_epoch, batches, Position(step, epoch, sample))


def run_chunk(step, ds, chunk: Chunk, on_progress=None, phase_events=None) -> np.ndarray:
    """Train the chunk's batches, loading each next batch while the current one computes; returns their
    losses. Steps whose number is a multiple of PHASE_SAMPLE_EVERY run eagerly with events between their
    phases (appended to phase_events, when given). on_progress(done, losses) every LOG_EVERY steps."""
    from .step import PHASES

    step.losses(reset=True)
    losses = np.zeros(0, np.float32)
    for i, (idx, next_idx) in enumerate(data.with_next(chunk.batches)):
        events = None
        if phase_events is not None and (chunk.first_step + i) % PHASE_SAMPLE_EVERY == 0:
            events = [step.cp.cuda.Event() for _ in range(len(PHASES) + 1)]
            phase_events.append(events)
        step.run(ds.train_x, ds.train_y, idx, next_idx, mode="eager" if events else None, events=events)
        if (i + 1) % LOG_EVERY == 0 or i + 1 == len(chunk.batches):
            losses = step.losses()
            _check_finite(losses, chunk.first_step)
            if on_progress:
                on_progress(i + 1, losses)
    step.synchronize()
    return losses


def run_rounds(models, ds, chunks, names, on_progress=None) -> list[np.ndarray]:
    """Train several models' chunks of one epoch (a chunk per model, as long as each other) in rounds, each
    round every model's next step: models.round(ds, [(idx, next_idx) of each model]) runs them (side by side on
    the GPU), models.losses(reset) reads each model's losses. Returns them; on_progress(done, losses) every
    LOG_EVERY rounds."""
    models.losses(reset=True)
    batches = [list(data.with_next(chunk.batches)) for chunk in chunks]
    rounds = len(batches[0])
    for i in range(rounds):
        models.round(ds, [pairs[i] for pairs in batches])
        if (i + 1) % LOG_EVERY == 0 or i + 1 == rounds:
            losses = models.losses()
            for name, ls in zip(names, losses):
                _check_finite(ls, chunks[0].first_step, f" of model {name}")
            if on_progress:
                on_progress(i + 1, losses)
    models.synchronize()
    return losses


def _check_finite(losses, first_step, whose: str = ""):
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        raise TrainingDiverged(f"the loss{whose} became {losses[bad[0]]} at step {first_step + int(bad[0]) + 1}")
