#!/usr/bin/env python3
"""What it costs to wait for the whole grid: barrier designs for a persistent step kernel, against the
launch gap they would replace.

A persistent kernel keeps a batch's activations on chip and waits for the whole grid only where the math
needs the whole batch (BatchNorm's statistics, the weight-gradient sums, fc1). Each such wait replaces a
kernel boundary of today's step graph, so a design pays only if its barrier costs less than a launch gap.
Timed here, per barrier or per launch (median of --repeats, CUDA events):

  graph launch     empty kernels back to back in one CUDA graph (the step graph's boundaries), per kernel;
  cooperative      cooperative_groups::this_grid().sync() (a cooperative launch, one block per SM and more);
  counter          thread 0 of each block adds to one counter; the last to arrive bumps a generation word
                   that the others spin on (acquire/release at GPU scope);
  flags            each block raises its own flag; block 0 waits for all of them (a thread per flag), then
                   bumps the generation word;
  cluster          the thread-block cluster's hardware barrier only (a local sync, not the grid's);
  cluster+counter  hierarchical: cluster barrier, one block per cluster at the counter, cluster barrier.

Every grid-wide barrier is also checked: before it each block writes the round number, after it each
block reads another block's word, which must hold that round or a later one (a broken barrier counts an
error). The cluster-only row times the cluster's own barrier and is not checked: it waits for no block
outside its cluster.

    PYTHONPATH=. python dev/grid_barrier.py --out barriers.json
"""
from __future__ import annotations

import sys

import numpy as np

from mnist_cuda.cli import Parser, int_in_range, output_path, write_json, gpu_or_exit
from mnist_cuda.sizes import MAX_BLOCK_THREADS, MAX_TIMED

PROG = "grid_barrier.py"
SOURCE = r"""
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned add_acq_rel(unsigned* p, unsigned v) {
    unsigned old; asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// sync[0]: arrivals, sync[1]: generation, sync[2 + b]: block b's flag. `blocks` take part (all, or one
// block per cluster in the hierarchical form).
__device__ void counter_barrier(unsigned* sync, unsigned blocks) {
    const unsigned gen = load_acquire(sync + 1);
    if (add_acq_rel(sync, 1) == blocks - 1) {
        sync[0] = 0;
        store_release(sync + 1, gen + 1);
    } else {
        while (load_acquire(sync + 1) == gen) {}
    }
}

__device__ void flags_barrier(unsigned* sync, unsigned round) {
    const unsigned b = blockIdx.x;
    if (threadIdx.x == 0) store_release(sync + 2 + b, round);
    if (b == 0) {
        for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x)
            while (load_acquire(sync + 2 + i) != round) {}
        __syncthreads();
        if (threadIdx.x == 0) store_release(sync + 1, round);
    }
    if (threadIdx.x == 0) while (load_acquire(sync + 1) != round) {}
}

__device__ __forceinline__ void check(unsigned* words, unsigned round, unsigned* errors) {
    if (threadIdx.x == 0) {
        const unsigned other = (blockIdx.x + gridDim.x / 2 + 1) % gridDim.x;
        if (load_acquire(words + other) < round) atomicAdd(errors, 1);
    }
}

#define ROUNDS_BEGIN for (unsigned r = 1; r <= rounds; ++r) { \
    if (threadIdx.x == 0) store_release(words + blockIdx.x, r);
#define ROUNDS_END check(words, r, errors); }

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void counter_rounds(unsigned rounds, unsigned* sync, unsigned* words, unsigned* errors) {
    ROUNDS_BEGIN
    __syncthreads();
    if (threadIdx.x == 0) counter_barrier(sync, gridDim.x);
    __syncthreads();
    ROUNDS_END
}

extern "C" __global__ void flags_rounds(unsigned rounds, unsigned* sync, unsigned* words, unsigned* errors) {
    ROUNDS_BEGIN
    __syncthreads();
    flags_barrier(sync, r);
    __syncthreads();
    ROUNDS_END
}

// the cluster's hardware barrier (every thread of every block of the cluster), as cluster_group::sync()
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}

// cluster size CLUSTER set at compile time (one module per size)
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1)
cluster_rounds(unsigned rounds, unsigned* sync, unsigned* words, unsigned* errors) {
    for (unsigned r = 1; r <= rounds; ++r) cluster_sync();
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1)
cluster_counter_rounds(unsigned rounds, unsigned* sync, unsigned* words, unsigned* errors) {
    ROUNDS_BEGIN
    cluster_sync();
    if (cluster_rank() == 0 && threadIdx.x == 0) counter_barrier(sync, gridDim.x / CLUSTER);
    cluster_sync();
    ROUNDS_END
}
"""
# cooperative_groups' grid barrier, which needs a cooperative launch and the CUDA headers (CuPy finds them)
COOPERATIVE_SOURCE = "#include <cooperative_groups.h>\n" + SOURCE + r"""
extern "C" __global__ void cooperative_rounds(unsigned rounds, unsigned* sync, unsigned* words, unsigned* errors) {
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    ROUNDS_BEGIN grid.sync(); ROUNDS_END
}
"""


def build_parser():
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int_in_range(10, MAX_TIMED), default=2000, help="barriers per timed kernel")
    p.add_argument("--repeats", type=int_in_range(1, MAX_TIMED), default=15,
                   help="timed kernels per design; the median counts")
    p.add_argument("--threads", type=int_in_range(32, MAX_BLOCK_THREADS), default=256,
                   help="threads per block: a multiple of 32, at most 1024 (two blocks per SM must fit at once)")
    p.add_argument("--out", type=output_path, default=None, metavar="PATH", help="write the figures as JSON here")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads % 32 or args.threads > 1024:
        parser.fail("--threads", f"want a multiple of 32 up to 1024, got {args.threads}")
    gpu_or_exit(PROG)
    import cupy as cp
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    # a cooperative launch for grid.sync() alone; the spin barriers need only every block resident at once
    cooperative = cp.RawModule(code=COOPERATIVE_SOURCE, options=("-std=c++17", "-DCLUSTER=1"), enable_cooperative_groups=True)
    modules = {c: cp.RawModule(code=SOURCE, options=("-std=c++17", f"-DCLUSTER={c}")) for c in (1, 2, 4, 8)}
    module = modules.pop(1)
    sync = cp.zeros(2 + 16 * sms, np.uint32)
    words = cp.zeros(16 * sms, np.uint32)
    errors = cp.zeros(1, np.uint32)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def median_us(launch, rounds):
        times = []
        for _ in range(args.repeats):
            sync.fill(0), words.fill(0)
            start.record()
            launch(rounds)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
        return float(np.median(times))

    def per_barrier(kernel, blocks):
        launch = lambda rounds: kernel((blocks,), (args.threads,), (np.uint32(rounds), sync, words, errors))
        launch(10)  # load and warm up
        cp.cuda.Device().synchronize()
        errors.fill(0)
        full, none = median_us(launch, args.rounds), median_us(launch, 0)
        return {"blocks": blocks, "us_per_barrier": (full - none) / args.rounds, "kernel_us_without": none,
                "errors": int(errors.get()[0])}

    out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sms": sms,
           "threads": args.threads, "rounds": args.rounds}
    # graph launch gap: a graph of n empty kernels, per kernel
    empty = module.get_function("empty_kernel")
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = {}
    for n in (1, 101):
        with stream:
            stream.begin_capture()
            for _ in range(n):
                empty((1,), (32,), ())
            graphs[n] = stream.end_capture()
    def graph_us(n):
        times = []
        for _ in range(args.repeats):
            start.record(stream)
            for _ in range(10):
                graphs[n].launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 10)
        return float(np.median(times))
    graph_us(101)
    out["graph_launch_us_per_kernel"] = (graph_us(101) - graph_us(1)) / 100
    print(f"graph launch gap       {out['graph_launch_us_per_kernel']:6.2f} us per empty kernel (graph of 101 minus 1)")
    rows = []
    for per_sm in (1, 2):
        blocks = sms * per_sm
        rows.append({"design": "cooperative", **per_barrier(cooperative.get_function("cooperative_rounds"), blocks)})
        for name in ("counter_rounds", "flags_rounds"):
            rows.append({"design": name.replace("_rounds", ""), **per_barrier(module.get_function(name), blocks)})
    for c, m in modules.items():
        blocks = (sms // c) * c  # whole clusters
        rows.append({"design": f"cluster{c}", **per_barrier(m.get_function("cluster_rounds"), blocks)})
        rows.append({"design": f"cluster{c}+counter", **per_barrier(m.get_function("cluster_counter_rounds"), blocks)})
    for r in rows:
        print(f"{r['design']:18s} {r['blocks']:4d} blocks  {r['us_per_barrier']:6.2f} us per barrier"
              f"  (errors {r['errors']})")
    out["barriers"] = rows
    if args.out:
        write_json(args.out, out)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
