#!/usr/bin/env python3
"""Every version of each op: checked against the float64 reference, then timed (llm.c's dev/cuda manner).

    PYTHONPATH=. python dev/bench_kernels.py                       # every op, batch 64 and 512
    PYTHONPATH=. python dev/bench_kernels.py conv2d batchnorm      # these op families only
    PYTHONPATH=. python dev/bench_kernels.py conv2d --filter fast --batch-sizes 512 --json out.json

The cases come from mnist_cuda.kernel_cases.OPS, which groups them by op family: the naive kernel
of an op and the fast kernels that compute it (alone or fused with others). For each case and batch size:
the relative error against mnist_cuda.reference, then the median time per launch from CUDA graphs of
PER_GRAPH launches each (an event pair around each replay, after --warmup replays), and GFLOP/s and GB/s
against the case's own count of FLOPs and fewest bytes. A fused case belongs to several families and runs
once, under the first one named. Exit status 1 if a check fails.
"""

from __future__ import annotations

import sys

import numpy as np

from mnist_cuda import cuda
from mnist_cuda import kernel_cases as kc
from mnist_cuda.cli import Parser, batch_sizes, int_in_range, output_path, write_json
from mnist_cuda.sizes import MAX_TIMED

PROG = "bench_kernels.py"
PER_GRAPH = 20  # launches per timed graph: Python's launch overhead stays out of the figure


def time_case(prepared, warmup: int, repeat: int, per_graph: int = PER_GRAPH, sources=None) -> float:
    """Median GPU time of one run() in us: per_graph runs are captured in a CUDA graph whose replays are
    timed with events, so Python's launch overhead stays out of the figure. sources: the kernel sources run()
    launches from, loaded before the capture (default: every declared source)."""
    cp = cuda.require_gpu()
    graph = cuda.capture(*[prepared.run] * per_graph, sources=sources)
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(warmup):
        graph.launch(stream)
    times = []
    for _ in range(max(1, repeat // per_graph)):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1000.0 / per_graph)
    return float(np.median(times))


def add_timing_arguments(p: Parser, what: str):
    """--warmup and --repeat, time_case's arguments; `what` names the thing timed (a case, a rung)."""
    p.add_argument(
        "--warmup", type=int_in_range(0, MAX_TIMED), default=5, help="untimed graph replays before timing (default: 5)"
    )
    p.add_argument(
        "--repeat",
        type=int_in_range(1, MAX_TIMED),
        default=200,
        help=f"timed runs per {what} and batch size, in graphs of {PER_GRAPH} (default: 200)",
    )


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "ops",
        nargs="*",
        metavar="OP",
        help=f"op families to check and time, any of: {', '.join(kc.OPS)} (default: all of them)",
    )
    p.add_argument(
        "--batch-sizes", type=batch_sizes, default="64,512", help="comma-separated batch sizes (default: 64,512)"
    )
    p.add_argument(
        "--filter",
        default="",
        metavar="TEXT",
        help="only cases whose name contains TEXT, e.g. fast, naive or tf32 (default: every case)",
    )
    add_timing_arguments(p, "case")
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="also write the rows here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    unknown = [op for op in args.ops if op not in kc.OPS]
    if unknown:
        p.error(f"argument OP: unknown op {unknown[0]!r} (choose from {', '.join(kc.OPS)})")
    plan, seen = [], set()  # (op, its cases), each case once: a fused case belongs to several ops
    for op in dict.fromkeys(args.ops or kc.OPS):
        cases = [c for c in kc.OPS[op] if args.filter in c.name and c.name not in seen]
        seen.update(c.name for c in cases)
        if cases:
            plan.append((op, cases))
    if not plan:
        p.error(f"argument --filter: no case of the chosen ops has {args.filter!r} in its name")
    try:
        cp = cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    cuda.preload()
    rng = np.random.default_rng()
    rows, failed = [], 0
    width = max(len(c.name) for _, cases in plan for c in cases)
    for op, cases in plan:
        cases = [c for c in cases if kc.runnable(c)]  # (not the sm_90a-only forms on other GPUs)
        if not cases:
            continue
        print(f"\n{op}\n{'case':{width}s} {'batch':>5s} {'rel err':>9s} {'us':>9s} {'GFLOP/s':>9s} {'GB/s':>8s}")
        for case in cases:
            for batch in args.batch_sizes:
                dims = kc.Dims(batch, 32, 64, 128)
                errors = kc.check(case.make(rng, dims))  # a fresh instance for the check ...
                err = max(errors.values())
                prepared = case.make(rng, dims)  # ... and another for timing (running stats and logs mutate)
                us = time_case(prepared, args.warmup, args.repeat)
                flops, nbytes = prepared.work
                ok = err < case.tol
                failed += not ok
                rows.append(
                    {
                        "op": op,
                        "kernel": case.name,
                        "batch": batch,
                        "rel_err": err,
                        "us": us,
                        "gflops": flops / us / 1e3,
                        "gbs": nbytes / us / 1e3,
                        "ok": ok,
                    }
                )
                print(
                    f"{case.name:{width}s} {batch:5d} {err:9.1e} {us:9.1f} {flops / us / 1e3:9.0f} "
                    f"{nbytes / us / 1e3:8.0f}" + ("" if ok else "   FAIL"),
                    flush=True,
                )
    if args.json:
        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        write_json(args.json, {"device": name.decode() if isinstance(name, bytes) else name, "rows": rows})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
