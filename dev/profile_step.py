#!/usr/bin/env python3
"""Run a few training steps launch by launch, for a profiler to attach to.

    PYTHONPATH=. ncu --clock-control none --cache-control none --launch-skip 100 --launch-count 40 \\
        --metrics gpu__time_duration.sum python3 dev/profile_step.py --batch-size 64

Random images and labels (the kernels' timing does not depend on the values), the default model and
learning rate, the fast kernels unless --kernels naive. Each step runs through mnist_cuda.step.Step in
its "eager" mode, kernel by kernel (no graph), so a kernel profiler sees every launch with its name.
"""

from __future__ import annotations

import sys

import numpy as np

from mnist_cuda import cuda, data, reference
from mnist_cuda.cli import Parser, add_precision_arguments, int_in_range
from mnist_cuda.nets import KERNEL_VERSIONS, Parameters, make_net
from mnist_cuda.sizes import MAX_BATCH, MAX_TIMED
from mnist_cuda.step import Step
from mnist_cuda.training import DEFAULTS

PROG = "profile_step.py"


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int_in_range(1, MAX_BATCH), default=64, help="samples per step")
    p.add_argument("--steps", type=int_in_range(1, MAX_TIMED), default=10, help="training steps to run")
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default="fast", help="kernel version")
    add_precision_arguments(p, "default: fp32")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    args.precision = args.precision or "fp32"
    if args.precision != "fp32" and args.kernels != "fast":
        p.error(
            f"argument --precision: {args.precision} needs --kernels fast (the naive kernels compute in plain fp32)"
        )
    try:
        cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    params = Parameters()
    params.load_state_dict(reference.init_state_dict(0, params.channels, params.hidden))
    try:
        net = make_net(params, args.batch_size, args.kernels, args.precision)
    except ValueError as e:
        p.error(f"argument --batch-size: {e}")
    step = Step(net, DEFAULTS["lr"], mode="eager")
    # two batches of random samples, one per staging slot, as a tiny training set
    B, rng = args.batch_size, np.random.default_rng(0)
    x = rng.integers(0, 256, (2 * B, 1, data.IMAGE_SIZE, data.IMAGE_SIZE), dtype=np.uint8)
    y = rng.integers(0, data.NUM_CLASSES, 2 * B).astype(np.int32)
    for i in range(args.steps):
        step.run(x, y, np.arange(B) + (i % 2) * B)
    step.synchronize()
    print(f"{args.steps} steps at batch {args.batch_size} ({args.kernels} kernels, {args.precision})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
