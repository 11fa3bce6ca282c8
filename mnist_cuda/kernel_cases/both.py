"""The cases of the kernels both nets launch (kernels/both/), each the family of its own: the augmentation's
shift and the evaluation's accuracy count. (sgd_schedule, the optimizer's rate, is checked with the updates
that read it: sgd.py.)"""

from __future__ import annotations

import numpy as np

from .. import data
from .. import reference as ref
from ..ops import both
from .common import Case, Prepared, _bytes, _dev, _exact, _f32, _poison


def shift_images_case():
    """shift_images: every image moved by its own offset, exactly as numpy moves it."""

    def make(rng, d):
        n, size = d.batch, data.IMAGE_SIZE
        images = rng.integers(0, 256, (n, 1, size, size), dtype=np.uint8)
        offsets = rng.integers(-3, 4, (n, 2)).astype(np.int8)
        xd, od, out = _dev(images, np.uint8), _dev(offsets, np.int8), _poison((n, 1, size, size), np.uint8)
        run = lambda: both.shift_images(xd, od, out, n)
        want = ref.shift_images(images, offsets)
        return Prepared(run, {"x": out}, {"x": want}, (0.0, 2.0 * images.nbytes), compare={"x": _exact})

    return Case("shift_images", make, ops=("shift_images",))


def count_correct_case():
    def make(rng, d):
        import cupy

        N = d.batch
        logits, labels = _f32(rng, (N, 10)), rng.integers(0, 10, N).astype(np.int32)
        correct = cupy.array([5], dtype=cupy.int32)  # accumulates
        args = (_dev(logits), _dev(labels, np.int32))
        run = lambda: both.count_correct(*args, correct, N)
        want = 5 + int((logits.argmax(1) == labels).sum())
        return Prepared(run, {"correct": correct}, {"correct": [want]}, (10.0 * N, _bytes(logits)))

    return Case("count_correct", make, ops=("count_correct",))
