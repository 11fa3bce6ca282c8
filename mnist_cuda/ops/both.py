"""The launch contracts of the kernels both nets launch (kernels/both/), one kernel per file, named after it:
the naive net and the fast net run these same kernels.

    shift_images     the augmentation's shift of the batch's images, before the model (the step runner's)
    sgd_schedule     the optimizer's rate for this step, on the GPU from the step counter (optim.Optimizer's)
    count_correct    the evaluation's accuracy count (nets' count_correct)

mnist_cuda.nets.kernel_sources gives a net its own folder's sources and these (SOURCES)."""

from __future__ import annotations

import numpy as np

from .. import data
from .common import I32, NULL, source

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


# kernels/include/sgd_options.cuh's SCHEDULE_NONE, a plain-SGD model's schedule kind in sgd_schedule_models, and
# SCHEDULE_ARGS, the length of a model's row of model_args (Schedule.kernel_args' values)
SCHEDULE_NONE, SCHEDULE_ARGS = -1, 9


def sgd_schedule(state, lr_out, first_out, schedule_args: tuple, model_args=None):
    """One thread: this step's rate into lr_out and whether the momentum buffers start now into first_out,
    from the step counter in state (advanced). schedule_args: optim.Schedule.kernel_args(lr). model_args: K
    models' schedules instead (sgd_schedule_models, which checks them; schedule_args are then not read)."""
    models = 1 if model_args is None else model_args.shape[0]
    kind, lr, step_size, gamma, total, pct_start, div_factor, final_div_factor, anneal_cos = schedule_args
    _k["sgd_schedule"].launch(
        1 if models == 1 else (1, 1, models),
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
        NULL if model_args is None else model_args,  # none when it serves one model
        models=models,
    )


def schedule_rows(schedule_args: list) -> np.ndarray:
    """sgd_schedule_models' model_args (to copy to the device): a row of float64 per model, its schedule_args
    (optim.Schedule.kernel_args(lr)) in order, or for None (a plain-SGD model) kind SCHEDULE_NONE."""
    rows = [(SCHEDULE_NONE,) + (0,) * (SCHEDULE_ARGS - 1) if a is None else tuple(a) for a in schedule_args]
    if any(len(r) != SCHEDULE_ARGS for r in rows):
        raise ValueError(f"each model's schedule arguments are {SCHEDULE_ARGS} values")
    return np.array(rows, dtype=np.float64)


def sgd_schedule_models(state, lr_out, first_out, model_args):
    """sgd_schedule for K models in one launch (one thread each), each with its own schedule: state [K][2] int32,
    lr_out [K] float32, first_out [K] int32 and model_args [K][SCHEDULE_ARGS] float64 (schedule_rows), on the
    device. A model of kind SCHEDULE_NONE is left alone (its state not advanced, its lr_out[m] the constant rate
    its caller set). Each other model's outputs are the bits of sgd_schedule on its own state."""
    if model_args.dtype != np.float64 or model_args.ndim != 2 or model_args.shape[1] != SCHEDULE_ARGS:
        raise ValueError(f"model_args: [K][{SCHEDULE_ARGS}] float64 (schedule_rows)")
    sgd_schedule(state, lr_out, first_out, (0,) * SCHEDULE_ARGS, model_args)


def count_correct(logits, labels, correct, n: int):
    """correct += the number of samples whose largest logit (the first on ties) is the label."""
    _k["count_correct"].launch(1, COUNT_THREADS, logits, labels, correct, I32(n))
