#!/usr/bin/env python3
"""Two ways to train K models at once, measured before either is built into the trainer (docs/performance.md):

    PYTHONPATH=. python dev/many_models_probe.py --data-dir data/mnist [--batch 64] [--models 1,2,4,8,16,32,64]

(a) "streams": K independent step runners (mnist_cuda.step.Step, each its own net, weights from its own seed,
    its own CUDA graph and stream), stepped round-robin from one host thread, kernels unchanged: each model's
    numbers are exactly its single run's. The figure is the wall clock per model-step over --steps rounds of all
    K, after a warm-up, the host's batch staging included (as the trainer's loop pays it).
(b) "one batch": the work of K models as one model's step at batch K x --batch (mnist_cuda's step at that batch,
    timed as dev/time_step.py times it). A step of K models in one graph (kernels with a model index) does this
    work plus each model's own weights, statistics and update, so this is a bound on what that design can reach.

Both print model-steps per second and the speed-up over one model stepped alone ((a) at K = 1, measured first).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from time_step import window_means

from mnist_cuda.cli import (
    Parser,
    batch_sizes,
    data_inputs,
    existing_dir,
    int_in_range,
    output_path,
    refuse_clashes,
    write_json,
)
from mnist_cuda.sizes import MAX_BATCH, MAX_TIMED

PROG = "many_models_probe.py"


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=existing_dir, default=None, help="MNIST's IDX files (default: ./data/mnist)")
    p.add_argument("--batch", type=int_in_range(1, 1024), default=64, help="images per model and step (default: 64)")
    p.add_argument("--models", type=batch_sizes, default="1,2,4,8,16,32,64", help="the K to measure, comma-separated")
    p.add_argument(
        "--steps", type=int_in_range(10, MAX_TIMED), default=200, help="timed rounds of all K models (default: 200)"
    )
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="also write the figures here")
    return p


def _indices(n_train: int, batch: int, seed: int, count: int) -> list:
    from mnist_cuda import data

    idxs = list(data.batch_indices(data.epoch_order(n_train, seed, 0), batch, drop_last=True))
    return idxs * (1 + count // len(idxs))


def streams(ds, k: int, batch: int, steps: int) -> float:
    """(a): us of wall clock per model-step, K step runners stepped round-robin."""
    from mnist_cuda import reference
    from mnist_cuda.nets import Parameters, make_net
    from mnist_cuda.step import Step

    runners, orders = [], []
    for seed in range(k):
        params = Parameters()
        params.load_state_dict(reference.init_state_dict(seed))
        runners.append(Step(make_net(params, batch), 0.05, seed=seed))
        orders.append(_indices(len(ds.train_x), batch, seed, steps + 60))

    def rounds(first, count):
        for i in range(first, first + count):
            for step, idx in zip(runners, orders):
                step.run(ds.train_x, ds.train_y, idx[i], idx[i + 1])
        for step in runners:
            step.synchronize()

    rounds(0, 40)  # warm-up: the graphs captured, the clocks up
    t0 = time.perf_counter()
    rounds(40, steps)
    return (time.perf_counter() - t0) * 1e6 / (steps * k)


def one_batch(ds, batch: int, steps: int) -> float:
    """(b)'s bound: us per step of one model at `batch`, as dev/time_step.py times it (GPU events)."""
    from mnist_cuda import cuda, reference
    from mnist_cuda.nets import Parameters, make_net
    from mnist_cuda.step import Step

    cp = cuda.require_gpu()
    params = Parameters()
    params.load_state_dict(reference.init_state_dict(0))
    step = Step(make_net(params, batch), 0.05)
    idx = _indices(len(ds.train_x), batch, 0, steps + 60)
    for i in range(40):
        step.run(ds.train_x, ds.train_y, idx[i], idx[i + 1])
    step.synchronize()
    return float(np.median(window_means(cp, step, ds, idx, 40, steps)))


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if max(args.models) * args.batch > MAX_BATCH:
        p.fail("--models", f"{max(args.models)} models of {args.batch} images make more than {MAX_BATCH} in one batch")
    refuse_clashes(p, inputs=data_inputs("mnist", args.data_dir), outputs=[("--json", args.json)])
    from mnist_cuda import cuda, data

    try:
        cp = cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    rows, alone = [], streams(ds, 1, args.batch, args.steps)  # one model stepped alone: the baseline
    print(f"K models of batch {args.batch}: us per model-step and model-steps per second")
    print(f"{'K':>4} {'(a) streams':>12} {'per s':>9} {'x K=1':>6} {'(b) bound':>10} {'per s':>9} {'x K=1':>6}")
    for k in args.models:
        a = streams(ds, k, args.batch, args.steps)
        b = one_batch(ds, k * args.batch, args.steps) / k
        rows.append({"models": k, "streams_us": a, "one_batch_us": b, "alone_us": alone})
        print(
            f"{k:4d} {a:12.1f} {1e6 / a:9.0f} {alone / a:5.2f}x {b:10.1f} {1e6 / b:9.0f} {alone / b:5.2f}x", flush=True
        )
    if args.json:
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        write_json(args.json, {"device": device, "batch": args.batch, "steps": args.steps, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
