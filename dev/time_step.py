#!/usr/bin/env python3
"""Time our whole training step alone (no PyTorch), as compare_pytorch.py times it: a loop with no
synchronisation inside, at least --warmup-seconds of untimed steps first, then --steps steps with a CUDA
event every 10 steps; each window's mean step is one sample; prints the median per batch size.

    PYTHONPATH=. python dev/time_step.py --data-dir data/mnist [--batch-sizes 64,512] [--precision tf32|bf16] [--json F]

For checking that a change did not slow the step: run it several times on each tree, in one session.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from mnist_cuda.cli import (
    Parser,
    add_precision_arguments,
    batch_sizes,
    data_inputs,
    existing_dir,
    int_in_range,
    non_negative_at_most,
    output_path,
    refuse_clashes,
    write_json,
)
from mnist_cuda.sizes import MAX_SECONDS, MAX_TIMED

WINDOW = 10


def build_parser() -> Parser:
    p = Parser(prog="time_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-dir",
        type=existing_dir,
        default=None,
        help="the MNIST files (else $MNIST_DATA_DIR, then the cache, then a download)",
    )
    p.add_argument("--batch-sizes", type=batch_sizes, default="64,512", help="comma-separated")
    p.add_argument(
        "--steps",
        type=int_in_range(WINDOW, MAX_TIMED),
        default=500,
        help="timed steps per batch size (whole windows of 10 are timed)",
    )
    p.add_argument(
        "--warmup-seconds",
        type=non_negative_at_most(MAX_SECONDS),
        default=1.0,
        help="untimed steps for at least this long first",
    )
    p.add_argument("--kernels", choices=("naive", "fast"), default="fast", help="kernel version")
    add_precision_arguments(p, "default: fp32")
    p.add_argument("--json", type=output_path, default=None, help="also write the medians here")
    return p


def window_means(cp, step, ds, idxs, first: int, steps: int) -> list[float]:
    """us per step of each WINDOW steps (batches idxs[first:], cycled), run with no synchronisation inside and a
    CUDA event after each window."""
    marks = [cp.cuda.Event()]
    marks[0].record(step.stream)
    for k in range(steps):
        j = first + k
        step.run(ds.train_x, ds.train_y, idxs[j % len(idxs)], idxs[(j + 1) % len(idxs)])
        if (k + 1) % WINDOW == 0:
            marks.append(cp.cuda.Event())
            marks[-1].record(step.stream)
    step.synchronize()
    return [cp.cuda.get_elapsed_time(a, b) * 1000 / WINDOW for a, b in zip(marks, marks[1:])]


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_clashes(p, inputs=data_inputs("mnist", args.data_dir), outputs=[("--json", args.json)])
    from mnist_cuda import cuda, data, reference

    try:
        cp = cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"time_step: {e}", file=sys.stderr)
        return 2
    from mnist_cuda.nets import Parameters, make_net
    from mnist_cuda.step import Step

    ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    out = {}
    for batch in args.batch_sizes:
        params = Parameters()
        params.load_state_dict(reference.init_state_dict(0))
        step = Step(make_net(params, batch, args.kernels, args.precision or "fp32"), 0.05)
        idxs = list(data.batch_indices(data.epoch_order(len(ds.train_x), 0, 0), batch, drop_last=True))
        idxs = idxs * (1 + (args.steps + 100) // len(idxs))
        i, t0 = 0, time.perf_counter()
        while i < 20 or time.perf_counter() - t0 < args.warmup_seconds:
            step.run(ds.train_x, ds.train_y, idxs[i % len(idxs)], idxs[(i + 1) % len(idxs)])
            i += 1
        step.synchronize()
        per_step = window_means(cp, step, ds, idxs, i, args.steps)
        out[batch] = float(np.median(per_step))
        print(f"batch {batch}: median {out[batch]:.1f} us per step ({len(per_step)} windows of {WINDOW})")
    if args.json:
        write_json(args.json, {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "median_us": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
