#!/usr/bin/env python3
"""When each launch of the training step runs inside the whole-step CUDA graph: a timeline.

Every kernel is compiled with a stamp at the top of its body: thread 0 of each block reads %globaltimer
when the block starts and again when thread 0 leaves the kernel (a destructor), and stores both with
plain stores in a slot chosen by how many times that block index of that kernel has run (no atomics, no
barrier: a few instructions per block). The step graphs are replayed back to back (--steps of them), and
for the step before the last one the script prints, per launch in step order: its stream, blocks, when
its first block started, when its last block started, and when its last block's thread 0 left, in us
after the previous step's last kernel (the update) ended. The gaps between a kernel's end and the next
one's start are the launch latencies that removal probes cannot separate from the work.

    PYTHONPATH=. python dev/step_timeline.py --batch-sizes 64,512 --precision tf32 --out timeline.json

Random images and labels, the default model and the fast kernels, lr 0. The stamps make the step a few
us longer at batch 64 than unstamped.
"""

from __future__ import annotations

import re
import sys

import numpy as np

# (dev/step_launch_costs.py: this file's folder is first on sys.path when run as a script)
from step_launch_costs import default_params, fast_nets, gpu_or_exit, random_batches

from mnist_cuda import cuda
from mnist_cuda.cli import Parser, add_precision_arguments, batch_sizes, int_in_range, output_path, write_json
from mnist_cuda.sizes import MAX_TIMED
from mnist_cuda.step import SLOTS, Step

PROG = "step_timeline.py"
SIZE_CLASSES = 7  # launches of one kernel in a step are told apart by their block count % 7
STAMP = r"""
#define TL_RING %(ring)d
#define TL_MAX_BLOCKS %(max_blocks)d
#define TL_CLASSES %(classes)d
#define TL_RECORDS ((unsigned long long *)%(records)dULL)
#define TL_COUNTS ((unsigned int *)%(counts)dULL)
__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t));
    return t;
}
// Thread 0 of each block: start and end times in slot k %% TL_RING of its (kernel, size class, block),
// k = that block's launch count, read at the start and used at the end (no stall on the load).
struct TimelineStamp {
    unsigned long long start;
    unsigned int k, cell;
    bool on;
    __device__ TimelineStamp(int kernel) {
        on = threadIdx.x + threadIdx.y + threadIdx.z == 0;
        if (!on) return;
        start = tl_now();
        const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        const unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        on = b < TL_MAX_BLOCKS;
        cell = (kernel * TL_CLASSES + blocks %% TL_CLASSES) * TL_MAX_BLOCKS + b;
        if (on) k = *(volatile unsigned int *)(TL_COUNTS + cell);
    }
    __device__ ~TimelineStamp() {
        if (!on) return;
        const unsigned long long end = tl_now();
        const size_t slot = (size_t)(cell / TL_MAX_BLOCKS) * TL_RING + k %% TL_RING;
        unsigned long long *r = TL_RECORDS + (slot * TL_MAX_BLOCKS + cell %% TL_MAX_BLOCKS) * 3;
        r[0] = start; r[1] = end; r[2] = gridDim.x * gridDim.y * gridDim.z;
        TL_COUNTS[cell] = k + 1;
    }
};
"""
# A kernel's definition: `extern "C" __global__ void [__launch_bounds__(...)] name(` or, for a kernel template,
# `template <...> __global__ void [__launch_bounds__(...)] name(`; which names are kernels, cuda.entry_points says.
_DEFINITION = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(")


def kernel_name(launch_name: str) -> str:
    """The entry point of a launch: a template instantiation ("conv2_forward_fast<Precision::Tf32>") is
    stamped as its template, so both precisions share one id (a run uses one of them)."""
    return launch_name.split("<", 1)[0]


def instrument(source: str, kernel_ids: dict[str, int], header: str) -> str:
    """source with header in front and a TimelineStamp as the first statement of every kernel's body (the
    extern "C" kernels and the kernel templates that cuda.entry_points finds); kernel_ids gains an index
    for each kernel it has not seen."""
    stamp = lambda name: f" TimelineStamp timeline_stamp_({kernel_ids.setdefault(name, len(kernel_ids))});"
    return header + with_first_statements(source, stamp)


def with_first_statements(source: str, statement) -> str:
    """source with statement(name) as the first statement of the body of every kernel `name` that
    cuda.entry_points finds (dev/pdl_probe.py puts its grid-dependency wait there)."""
    kernels = set(cuda.entry_points(source))
    out, pos = [], 0
    for m in _DEFINITION.finditer(source):
        if m.group(1) not in kernels:
            continue
        depth, i = 1, m.end()
        while depth:  # to the parameter list's closing parenthesis
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        brace = source.index("{", i)
        if source[i:brace].strip():  # a declaration, not the definition
            continue
        out.append(source[pos : brace + 1] + statement(m.group(1)))
        pos = brace + 1
    out.append(source[pos:])
    return "".join(out)


def stamp_sources(header: str, kernel_ids: dict[str, int]):
    """From now on in this process, every kernel source compiles with the stamps (cuda.transform_sources:
    cuda.Source.compile_check sees the stamped text too)."""
    cuda.transform_sources(lambda path, text: instrument(text, kernel_ids, header))


def all_kernels() -> list[str]:
    """Every kernel of every declared source (the ops modules, imported by mnist_cuda.nets, declare them)."""
    return list(dict.fromkeys(name for s in cuda.sources() for name in cuda.entry_points(cuda.read_source(s.path))))


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", type=batch_sizes, default="64,512", help="comma-separated batch sizes")
    add_precision_arguments(p, "default: fp32")
    p.add_argument(
        "--rounds", type=int_in_range(1, MAX_TIMED), default=20, help="bursts of steps; the figures are medians"
    )
    p.add_argument(
        "--steps", type=int_in_range(4, MAX_TIMED), default=12, help="step graphs replayed back to back per round"
    )
    p.add_argument("--out", type=output_path, default=None, metavar="PATH", help="write the figures as JSON here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    cp = gpu_or_exit(PROG)
    nets = fast_nets(
        p, default_params(), args.batch_sizes, args.precision or "fp32"
    )  # (allocates; compiles nothing yet)

    # (the most blocks of a launch: batchnorm_relu_maxpool_fast's 12.25 per image at conv2's 64 channels)
    ring, max_blocks = args.steps + 4, max(1024, 13 * max(args.batch_sizes))
    ids = {name: i for i, name in enumerate(all_kernels())}
    records = cp.zeros(len(ids) * SIZE_CLASSES * ring * max_blocks * 3, cp.uint64)
    counts = cp.zeros(len(ids) * SIZE_CLASSES * max_blocks, cp.uint32)
    stamp_sources(
        STAMP
        % dict(
            ring=ring, max_blocks=max_blocks, classes=SIZE_CLASSES, records=records.data.ptr, counts=counts.data.ptr
        ),
        ids,
    )
    launches = []  # (launch name, blocks, stream) in step order, recorded while capturing

    def record(kernel, grid, block, args_, shared_mem, launch):
        launches.append((kernel.name, int(np.prod(grid)), cp.cuda.get_current_stream().ptr))
        launch()

    result = {
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "precision": args.precision or "fp32",
        "batch_sizes": {},
    }
    for batch, net in zip(args.batch_sizes, nets):
        step = Step(net, 0.0)
        stream = step.stream
        random_batches(step)
        graphs = []
        for slot in range(SLOTS):
            launches.clear()
            with cuda.launch_hook(record):
                graphs.append(step.capture_step(slot))
        in_step = list(launches)
        names = {s: f"stream {i}" for i, s in enumerate(dict.fromkeys(s for _, _, s in in_step))}
        for _ in range(50):
            for g in graphs:
                g.launch(stream)
        stream.synchronize()
        rows, periods = [], []
        for _ in range(args.rounds):
            records.fill(0)
            counts.fill(0)
            for k in range(args.steps):
                graphs[k % 2].launch(stream)
            stream.synchronize()
            done = {}  # (launch, blocks) -> [(starts, ends)] of its complete launches, by start
            for launch, blocks in dict.fromkeys((n, b) for n, b, _ in in_step):
                cell = ids[kernel_name(launch)] * SIZE_CLASSES + blocks % SIZE_CLASSES
                size = ring * max_blocks * 3
                a = records[cell * size : (cell + 1) * size].get().reshape(ring, max_blocks, 3).astype(np.int64)
                a = a[:, : min(blocks, max_blocks)]
                full = [(r[:, 0], r[:, 1]) for r in a if (r[:, 2] == blocks).all()]
                done[(launch, blocks)] = sorted(full, key=lambda se: se[0].min())
            updates = done[in_step[-1][:2]]  # the step's last kernel (the update)
            if len(updates) < 3:
                continue
            lo, hi, t0 = updates[-3][0].min(), updates[-2][0].min(), updates[-3][1].max()
            periods.append((updates[-1][0].min() - updates[-2][0].min()) / 1e3)
            taken, row = {}, []
            for launch, blocks, _ in in_step:  # the i-th launch of a (kernel, blocks) in the step is its i-th in time
                inside = [se for se in done[(launch, blocks)] if lo < se[0].min() <= hi]
                i = taken[(launch, blocks)] = taken.get((launch, blocks), -1) + 1
                row.append(
                    None
                    if i >= len(inside)
                    else [
                        (inside[i][0].min() - t0) / 1e3,
                        (inside[i][0].max() - t0) / 1e3,
                        (inside[i][1].max() - t0) / 1e3,
                    ]
                )
            rows.append(row)
        if not rows:
            print(f"{PROG}: no complete step was recorded (try more --steps)", file=sys.stderr)
            return 1
        table = []
        for i, (launch, blocks, s) in enumerate(in_step):
            got = [r[i] for r in rows if r[i] is not None]
            # None (null in the JSON) where no round recorded the launch, e.g. a side branch that outran the ring
            first, last, end = (float(np.median([g[j] for g in got])) if got else None for j in range(3))
            table.append(
                {
                    "launch": launch,
                    "stream": names[s],
                    "blocks": blocks,
                    "first_start_us": first,
                    "last_start_us": last,
                    "end_us": end,
                    "rounds": len(got),
                }
            )
        period = float(np.median(periods))
        result["batch_sizes"][batch] = {"step_us": period, "launches": table}
        print(
            f"batch {batch}{' --precision ' + args.precision if args.precision else ''}: "
            f"step {period:.1f} us (update to update, median of "
            f"{len(periods)} rounds); times in us after the step before ended"
        )
        print(f"  {'launch':44s} {'stream':8s} {'blocks':>6s} {'first':>7s} {'last':>7s} {'end':>7s}")
        for r in table:
            times = " ".join(
                "      -" if r[k] is None else f"{r[k]:7.2f}" for k in ("first_start_us", "last_start_us", "end_us")
            )
            print(f"  {r['launch']:44s} {r['stream']:8s} {r['blocks']:6d} {times}")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
