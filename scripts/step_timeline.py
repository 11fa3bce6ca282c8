"""When each launch of the training step runs inside the whole-step CUDA graph: a timeline.

Every kernel is compiled with a stamp at the top of its body: thread 0 of each block reads %globaltimer
when the block starts and again when thread 0 leaves the kernel (a destructor), and stores both with
plain stores in a slot chosen by how many times that block index of that kernel has run (no atomics, no
barrier: a few instructions per block). The step graphs are replayed back to back (--steps of them), and
for the step before the last one the script prints, per launch in step order: its stream, blocks, when
its first block started, when its last block started, and when its last block's thread 0 left, in us
after the previous step's last kernel (the update) ended. The gaps between a kernel's end and the next
one's start are the launch latencies that removal probes cannot separate from the work.

    python scripts/step_timeline.py --batch-sizes 64,512 --tf32 --out timeline.json

Random images and labels, the default model, lr 0. The stamps make the step ~3 us longer at batch 64
(H100, --tf32: 80.4 against 77.5-78.0 us unstamped).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from mnist_cuda import kernels, reference  # noqa: E402
from mnist_cuda import model as model_module  # noqa: E402
from mnist_cuda.train import int_at_least  # noqa: E402
from step_launch_costs import gpu_or_exit, parse_batch_sizes, random_batches  # noqa: E402

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
        unsigned long long *r = TL_RECORDS + (((size_t)(cell / TL_MAX_BLOCKS) * TL_RING + k %% TL_RING) * TL_MAX_BLOCKS +
                                              cell %% TL_MAX_BLOCKS) * 3;
        r[0] = start; r[1] = end; r[2] = gridDim.x * gridDim.y * gridDim.z;
        TL_COUNTS[cell] = k + 1;
    }
};
"""


def instrument(source: str, kernel_ids: dict[str, int], header: str) -> str:
    """source with header in front and `TimelineStamp` at the top of every extern "C" kernel's body
    (kernel_ids gains an index for each kernel it has not seen)."""
    out, pos = [header], 0
    for m in kernels._KERNEL.finditer(source):
        kid = kernel_ids.setdefault(m.group(1), len(kernel_ids))
        depth, i = 1, m.end()
        while depth:  # to the parameter list's closing parenthesis
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        brace = source.index("{", i)
        out.append(source[pos:brace + 1] + f" TimelineStamp timeline_stamp_({kid});")
        pos = brace + 1
    out.append(source[pos:])
    return "".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-sizes", default="64,512", help="comma-separated")
    p.add_argument("--tf32", action="store_true", help="conv2's products in plain TF32 (train --tf32)")
    p.add_argument("--rounds", type=int_at_least(1), default=20, help="bursts of steps; the figures are medians")
    p.add_argument("--steps", type=int_at_least(4), default=12, help="step graphs replayed back to back per round")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    batch_sizes, cp = parse_batch_sizes(p, args.batch_sizes), gpu_or_exit()

    ring, max_blocks = args.steps + 4, max(1024, 13 * max(batch_sizes))  # (conv2's BN pool: 12.25 blocks per image)
    ids: dict[str, int] = {}
    count = len(kernels._kernel_index())  # every kernel of every source file
    records = cp.zeros(count * SIZE_CLASSES * ring * max_blocks * 3, cp.uint64)
    counts = cp.zeros(count * SIZE_CLASSES * max_blocks, cp.uint32)
    header = STAMP % dict(ring=ring, max_blocks=max_blocks, classes=SIZE_CLASSES, records=records.data.ptr,
                          counts=counts.data.ptr)
    read = kernels.read_source
    kernels.read_source = lambda name: instrument(read(name), ids, header)
    launches = []  # (kernel, blocks, stream) in step order, recorded while capturing
    real_launch = kernels.launch

    def recording_launch(name, grid, block, *a, **kw):
        launches.append((name, int(np.prod(grid if isinstance(grid, tuple) else (grid,))),
                         cp.cuda.get_current_stream().ptr))
        real_launch(name, grid, block, *a, **kw)
    kernels.launch = model_module.launch = recording_launch

    model = model_module.Model(kernels_version="fast", tf32=args.tf32)
    model.load_state_dict(reference.init_state_dict(0, model.channels, model.hidden))
    kernels.preload()
    stream = cp.cuda.Stream(non_blocking=True)
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "tf32": args.tf32, "batch_sizes": {}}
    for batch in batch_sizes:
        ws = random_batches(model, batch, stream)
        graphs = []
        for slot in range(2):
            launches.clear()
            graphs.append(model.capture_train_step(ws, slot, 0.0))
        step = list(launches)
        names = {s: f"stream {i}" for i, s in enumerate(dict.fromkeys(s for _, _, s in step))}
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
            done = {}  # (kernel, blocks) -> [(starts, ends)] of its complete launches, by start
            for kernel, blocks in dict.fromkeys((n, b) for n, b, _ in step):
                cell = ids[kernel] * SIZE_CLASSES + blocks % SIZE_CLASSES
                size = ring * max_blocks * 3
                a = records[cell * size:(cell + 1) * size].get().reshape(ring, max_blocks, 3).astype(np.int64)
                a = a[:, :min(blocks, max_blocks)]
                full = [(r[:, 0], r[:, 1]) for r in a if (r[:, 2] == blocks).all()]
                done[(kernel, blocks)] = sorted(full, key=lambda se: se[0].min())
            updates = done[step[-1][:2]]  # the step's last kernel (SGD)
            if len(updates) < 3:
                continue
            lo, hi, t0 = updates[-3][0].min(), updates[-2][0].min(), updates[-3][1].max()
            periods.append((updates[-1][0].min() - updates[-2][0].min()) / 1e3)
            taken, row = {}, []
            for kernel, blocks, _ in step:  # the i-th launch of a (kernel, blocks) in the step is its i-th in time
                inside = [se for se in done[(kernel, blocks)] if lo < se[0].min() <= hi]
                i = taken[(kernel, blocks)] = taken.get((kernel, blocks), -1) + 1
                row.append(None if i >= len(inside) else
                           [(inside[i][0].min() - t0) / 1e3, (inside[i][0].max() - t0) / 1e3, (inside[i][1].max() - t0) / 1e3])
            rows.append(row)
        if not rows:
            sys.exit("error: no complete step was recorded (try more --steps)")
        table = []
        for i, (kernel, blocks, s) in enumerate(step):
            got = [r[i] for r in rows if r[i] is not None]
            first, last, end = (float(np.median([g[j] for g in got])) if got else float("nan") for j in range(3))
            table.append({"launch": kernel, "stream": names[s], "blocks": blocks, "first_start_us": first,
                          "last_start_us": last, "end_us": end, "rounds": len(got)})
        period = float(np.median(periods))
        result["batch_sizes"][batch] = {"step_us": period, "launches": table}
        print(f"batch {batch}{' --tf32' if args.tf32 else ''}: step {period:.1f} us (update to update, median of "
              f"{len(periods)} rounds); times in us after the step before ended")
        print(f"  {'launch':36s} {'stream':8s} {'blocks':>6s} {'first':>7s} {'last':>7s} {'end':>7s}")
        for r in table:
            print(f"  {r['launch']:36s} {r['stream']:8s} {r['blocks']:6d} {r['first_start_us']:7.2f} "
                  f"{r['last_start_us']:7.2f} {r['end_us']:7.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"result: {args.out}")


if __name__ == "__main__":
    main()
