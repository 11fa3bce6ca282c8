#!/usr/bin/env python3
"""Every kernel of every version: checked against the float64 reference, then timed (llm.c's dev/cuda
manner). For each kernel and batch size: relative error, median time per launch from CUDA
graphs of 20 launches each (events around each replay, after --warmup replays), GFLOP/s and GB/s against the kernel's own count of FLOPs and minimum bytes.

    python scripts/bench_kernels.py                      # batch 64 and 512, all kernels
    python scripts/bench_kernels.py --filter conv2d --batch-sizes 512 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mnist_cuda import kernel_checks as kc, kernels  # noqa: E402


def time_case(prepared, warmup, repeat, per_graph=20):
    """Median GPU time of one run(): per_graph runs are captured in a CUDA graph whose replays are
    timed with events, so Python's launch overhead stays out of the figure."""
    import cupy
    kernels.preload()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(per_graph):
            prepared.run()
        graph = stream.end_capture()
        for _ in range(warmup):
            graph.launch(stream)
        times = []
        for _ in range(max(1, repeat // per_graph)):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0 / per_graph)
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="64,512")
    p.add_argument("--filter", default="", help="only kernels whose name contains this")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=200, help="timed runs (in graphs of 20)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        kernels.require_gpu()
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except kernels.GPUUnavailable as e:
        print(f"bench_kernels.py: {e}", file=sys.stderr)
        return 2
    except ValueError:
        p.error("--batch-sizes takes whole numbers like 64,512")
    kernels.preload()
    rng = np.random.default_rng()
    rows, failed = [], 0
    print(f"{'kernel':46s} {'batch':>5s} {'rel err':>9s} {'us':>9s} {'GFLOP/s':>9s} {'GB/s':>8s}")
    for case in kc.all_cases():
        if args.filter not in case.name:
            continue
        for batch in batch_sizes:
            dims = kc.Dims(batch, 32, 64, 128)
            errors = kc.check(case.make(rng, dims))  # a fresh instance for the check ...
            err = max(errors.values())
            prepared = case.make(rng, dims)  # ... and another for timing (running stats and logs mutate)
            us = time_case(prepared, args.warmup, args.repeat)
            flops, nbytes = prepared.work
            ok = err < case.tol
            failed += not ok
            rows.append({"kernel": case.name, "batch": batch, "rel_err": err, "us": us,
                         "gflops": flops / us / 1e3, "gbs": nbytes / us / 1e3, "ok": ok})
            print(f"{case.name:46s} {batch:5d} {err:9.1e} {us:9.1f} {flops / us / 1e3:9.0f} {nbytes / us / 1e3:8.0f}"
                  + ("" if ok else "   FAIL"))
    if args.json:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        args.json.write_text(json.dumps({"device": name.decode() if isinstance(name, bytes) else name,
                                         "rows": rows}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
