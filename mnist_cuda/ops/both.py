"""The launch contracts of the kernels both nets launch (kernels/both/), one kernel per file, named after it:
the naive net and the fast net run these same kernels.

    shift_images     the augmentation's shift of the batch's images, before the model (the step runner's)
    sgd_schedule     the optimizer's rate for this step, on the GPU from the step counter (optim.Optimizer's)
    count_correct    the evaluation's accuracy count (nets' count_correct)

mnist_cuda.nets.kernel_sources gives a net its own folder's sources and these (SOURCES)."""

from __future__ import annotations

import numpy as np

from .. import data
from .common import I32, source

COUNT_THREADS = 256  # count_correct's one block, over the batch

_shift_images = source("both/shift_images.cu", IMAGE_SIZE=data.IMAGE_SIZE)
_sgd_schedule = source("both/sgd_schedule.cu")
_count_correct = source("both/count_correct.cu")
SOURCES = (_shift_images, _sgd_schedule, _count_correct)

_k = {
    name: src.kernel(name)
    for src, name in [
        (_shift_images, "shift_images"),
        (_sgd_schedule, "sgd_schedule"),
        (_count_correct, "count_correct"),
    ]
}


def shift_images(x, offsets, out, n: int):
    """out[i] = image x[i] (bytes) moved by offsets[i] = (dx, dy) whole pixels (int8), background moved in."""
    _k["shift_images"].launch_1d(n * data.IMAGE_SIZE * data.IMAGE_SIZE, x, offsets, out, I32(n))


def sgd_schedule(state, lr_out, first_out, schedule_args: tuple):
    """One thread: this step's rate into lr_out and whether the momentum buffers start now into first_out,
    from the step counter in state (advanced). schedule_args: optim.Schedule.kernel_args(lr)."""
    kind, lr, step_size, gamma, total, pct_start, div_factor, final_div_factor, anneal_cos = schedule_args
    _k["sgd_schedule"].launch(
        1,
        1,
        state,
        lr_out,
        first_out,
        I32(kind),
        np.float64(lr),
        I32(step_size),
        np.float64(gamma),
        I32(total),
        np.float64(pct_start),
        np.float64(div_factor),
        np.float64(final_div_factor),
        I32(anneal_cos),
    )


def count_correct(logits, labels, correct, n: int):
    """correct += the number of samples whose largest logit (the first on ties) is the label."""
    _k["count_correct"].launch(1, COUNT_THREADS, logits, labels, correct, I32(n))
