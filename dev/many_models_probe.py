#!/usr/bin/env python3
"""Two ways to train K models at once, measured before either is built into the trainer (docs/performance.md):

    PYTHONPATH=. python dev/many_models_probe.py --data-dir data/mnist [--batch 64] [--models 1,2,4,8,16,32,64]

(a) "streams": K independent step runners (mnist_cuda.step.Step, each its own net, weights from its own seed,
    its own CUDA graph and stream), stepped round-robin from one host thread, kernels unchanged: each model's
    numbers are exactly its single run's. The figure is the wall clock per model-step over --steps rounds of all
    K, after a warm-up, the host's batch staging included (as the trainer's loop pays it).
(c) "one graph": the K models' steps as K branches of one CUDA graph per round (each branch a model's whole
    step, its kernels unchanged, captured on a stream of its own), launched once per round after the host stages
    the K batches: the host launches once for K models, and the GPU runs the branches side by side. --check then
    compares every model's weights bit for bit with the same model trained alone for the same batches.
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
from mnist_cuda.sizes import MAX_TIMED, largest_batch

PROG = "many_models_probe.py"


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=existing_dir, default=None, help="MNIST's IDX files (default: ./data/mnist)")
    p.add_argument("--batch", type=int_in_range(1, 1024), default=64, help="images per model and step (default: 64)")
    p.add_argument("--models", type=batch_sizes, default="1,2,4,8,16,32,64", help="the K to measure, comma-separated")
    p.add_argument(
        "--steps", type=int_in_range(10, MAX_TIMED), default=200, help="timed rounds of all K models (default: 200)"
    )
    p.add_argument(
        "--check", action="store_true", help="(c): compare each model's weights with the model trained alone"
    )
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="also write the figures here")
    return p


def _indices(n_train: int, batch: int, seed: int, count: int) -> list:
    from mnist_cuda import data

    idxs = list(data.batch_indices(data.epoch_order(n_train, seed, 0), batch, drop_last=True))
    return idxs * (1 + count // len(idxs))


def streams(ds, k: int, batch: int, steps: int) -> float:
    """(a): us of wall clock per model-step, K step runners stepped round-robin."""
    runners, orders = _runners(ds, k, batch, steps + 60)

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


def _runners(ds, k: int, batch: int, count: int):
    from mnist_cuda import reference
    from mnist_cuda.nets import Parameters, make_net
    from mnist_cuda.step import Step

    runners, orders = [], []
    for seed in range(k):
        params = Parameters()
        params.load_state_dict(reference.init_state_dict(seed))
        runners.append(Step(make_net(params, batch), 0.05, seed=seed))
        orders.append(_indices(len(ds.train_x), batch, seed, count))
    return runners, orders


def _capture_round(cp, runners, slot: int):
    """One graph: each runner's whole step on its device slot `slot` (and its load of the next batch from pinned
    slot 1 - slot, as Step.capture_step), each on a stream of its own forked from and joined into one."""
    from mnist_cuda import cuda

    cuda.preload(runners[0].sources)
    main, streams, joins = cp.cuda.Stream(non_blocking=True), [], []
    with main:
        main.begin_capture()
        fork = cp.cuda.Event(disable_timing=True)
        fork.record(main)
        for st in runners:
            streams.append(cp.cuda.Stream(non_blocking=True))
            streams[-1].wait_event(fork)
            with streams[-1]:
                _, forward, backward, update, zero_grad = st.phases(slot)
                st.prefetch.run(lambda st=st: st.load(1 - slot, st.batch_size))
                for phase in (forward, backward, update, zero_grad, st.prefetch.join):
                    phase()
                joins.append(cp.cuda.Event(disable_timing=True))
                joins[-1].record(streams[-1])
        for e in joins:
            main.wait_event(e)
        graph = main.end_capture()
    return graph, main


def one_graph(ds, k: int, batch: int, steps: int, check: bool) -> tuple[float, bool | None]:
    """(c): us of wall clock per model-step, the K steps of a round as one graph; with check, whether every model's
    weights equal, bit for bit, those of the same model stepped alone through the same batches."""
    from mnist_cuda import cuda

    cp = cuda.require_gpu()
    runners, orders = _runners(ds, k, batch, steps + 60)
    graphs = [_capture_round(cp, runners, slot) for slot in range(2)]
    stream = graphs[0][1]
    with stream:
        for st, idx in zip(runners, orders):  # the first batch, loaded before the first round
            st.stage_batch(0, ds.train_x, ds.train_y, idx[0], 0)
            st.load(0, batch)
            st.stage_free[0].record(stream)

    def rounds(first, count):
        for i in range(first, first + count):
            slot, other = i % 2, 1 - i % 2
            for st, idx in zip(runners, orders):
                st.stage_batch(other, ds.train_x, ds.train_y, idx[i + 1], i + 1)
            graphs[slot][0].launch(stream)
            for st in runners:
                st.stage_free[other].record(stream)
        stream.synchronize()

    rounds(0, 40)
    t0 = time.perf_counter()
    rounds(40, steps)
    us = (time.perf_counter() - t0) * 1e6 / (steps * k)
    if not check:
        return us, None
    alone, _ = _runners(ds, k, batch, 0)
    same = True
    for st, lone, idx in zip(runners, alone, orders):
        for i in range(40 + steps):
            lone.run(ds.train_x, ds.train_y, idx[i], idx[i + 1])
        lone.synchronize()
        same &= bool(cp.array_equal(st.net.params.params, lone.net.params.params))
    return us, same


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
    largest = largest_batch((32, 64), 128, ("fast",))  # (b)'s bound steps one model at the K models' whole batch
    if max(args.models) * args.batch > largest:
        p.fail(
            "--models",
            f"{max(args.models)} models of {args.batch} images make a batch of {max(args.models) * args.batch:,} "
            f"for (b)'s bound, more than one model's step takes ({largest:,} images)",
        )
    refuse_clashes(p, inputs=data_inputs("mnist", args.data_dir), outputs=[("--json", args.json)])
    from mnist_cuda import cuda, data

    try:
        cp = cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    rows, alone = [], streams(ds, 1, args.batch, args.steps)  # one model stepped alone: the baseline
    print(f"K models of batch {args.batch}: us per model-step, and the speed-up over one model alone")
    print(f"{'K':>4} {'(a) streams':>12} {'':>6} {'(c) one graph':>14} {'':>6} {'(b) bound':>10} {'':>6}")
    for k in args.models:
        a = streams(ds, k, args.batch, args.steps)
        c, same = one_graph(ds, k, args.batch, args.steps, args.check)
        b = one_batch(ds, k * args.batch, args.steps) / k
        rows.append({"models": k, "streams_us": a, "one_graph_us": c, "one_batch_us": b, "alone_us": alone})
        if same is not None:
            rows[-1]["one_graph_bit_identical"] = same
        cells = [f"{v:12.1f} {alone / v:5.2f}x" for v in (a, c, b)]
        print(f"{k:4d} " + " ".join(cells) + ("" if same is None else f"  bit-identical: {same}"), flush=True)
    if args.json:
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        write_json(args.json, {"device": device, "batch": args.batch, "steps": args.steps, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
