"""Run a few training steps launch by launch, for a profiler to attach to.

    ncu --clock-control none --cache-control none --launch-skip 100 --launch-count 40 \\
        --metrics gpu__time_duration.sum python3 scripts/profile_step.py --batch-size 64

Random images and labels (the kernels' timing does not depend on the values), the default model and
learning rate, the fast kernels unless --kernels naive. Each step is launched kernel by kernel (no
graph), so a kernel profiler sees every launch with its name.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mnist_cuda import kernels, reference  # noqa: E402
from mnist_cuda.train import int_at_least  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-size", type=int_at_least(1), default=64)
    p.add_argument("--steps", type=int_at_least(1), default=10)
    p.add_argument("--kernels", choices=("naive", "fast"), default="fast")
    args = p.parse_args(argv)
    try:
        cp = kernels.require_gpu()
    except kernels.GPUUnavailable as e:
        sys.exit(f"error: {e}")
    from mnist_cuda.model import Model
    model = Model(kernels_version=args.kernels)
    model.load_state_dict(reference.init_state_dict(0, model.channels, model.hidden))
    ws = model.workspace(args.batch_size)
    rng = np.random.default_rng(0)
    for slot in range(ws.STAGING_SLOTS):
        ws.stage_x[slot][...] = rng.integers(0, 256, ws.stage_x[slot].shape, dtype=np.uint8)
        ws.stage_y[slot][...] = rng.integers(0, 10, ws.batch_size)
    kernels.preload()
    for step in range(args.steps):
        model.train_step(ws, step % ws.STAGING_SLOTS, 0.05)
    cp.cuda.runtime.deviceSynchronize()
    print(f"{args.steps} steps at batch {args.batch_size} ({args.kernels} kernels)")


if __name__ == "__main__":
    main()
