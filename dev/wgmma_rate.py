#!/usr/bin/env python3
"""How fast can conv2's instruction stream run on Hopper's tensor cores, with nothing else in the way?

conv2's image tiles (kernels/fast/2_conv2_image_tile.cuh) issue `wgmma` m64n112 products whose operands both come
from shared memory in wgmma's unswizzled layout: A (the weights) [tap][channel quad][row][16 bytes], B (the staged
image) a plane of 16-byte pixels per channel quad, each tap's B the same planes from a start shifted by whole pixels.
A chunk's products (27 in 3xTF32's apart form: 9 taps x 3 parts; 9 in bf16) go out as one group, and the warpgroup
waits for all of them before it stages the next chunk. With its staging left out the forward still runs at ~62% of
the dense TF32 rate (docs/performance.md, section 2). A warp-specialised kernel (a producer staging for consumer
warpgroups, as CUTLASS's Hopper kernels are built) takes the staging off the consumers and lets a group stay in
flight while the next is issued; it cannot make the products themselves faster than this stream runs alone.

This probe times that stream alone: every block (one per SM) fills its shared memory once, then each of its
warpgroups issues `--groups` groups of products, as conv2's chunks would, into one set of accumulators. Variants:
- swizzle: none (conv2's layout; B's start moved by 16 bytes per pixel of a tap's shift) or 128-byte (K-major rows
  of 128 bytes, the layout TMA writes and CUTLASS's kernels read; a tap's shift moves the start by 128-byte rows);
- warpgroups per SM: 1 to 4 (conv2's image tiles run four blocks of one warpgroup per SM);
- in flight: 0 (wait for each group before the next, as conv2's tiles do) or 1 (the group before still running
  while the next is issued, as a consumer fed by a producer may);
- N: 112 columns (conv2's half image) or 224 (the whole image in one instruction).
The values are arbitrary and the results discarded: this measures the rate alone, in TFLOP/s and as a share of the
dense rate (`--dense-tflops`, the H100/H200 SXM figures by default).

    PYTHONPATH=. python dev/wgmma_rate.py [--groups 2000] [--repeat 5] [--json F]
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

# (dev/: this file's folder is first on sys.path when run as a script)
from step_launch_costs import gpu_or_exit

from mnist_cuda import cuda
from mnist_cuda.cli import Parser, int_in_range, output_path, refuse_clashes, write_json

PROG = "wgmma_rate.py"
# (type name, PTX type, k per instruction, products per group as a chunk of conv2's issues them, dense TFLOP/s)
TYPES = {"tf32": ("tf32", 8, 27, 494.7), "bf16": ("bf16", 16, 9, 989.4)}
COLUMNS = (112, 224)
SWIZZLES = {"none": 0, "128B": 1}
WARPGROUPS = (1, 2, 3, 4)
IN_FLIGHT = (0, 1)

SOURCE = r"""
// One warpgroup's products, as conv2's image tiles issue them (dev/wgmma_rate.py says what each variant is).
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading, unsigned stride, int swz) {
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (unsigned long long)(leading >> 4) << 16 |
           (unsigned long long)(stride >> 4) << 32 | (unsigned long long)swz << 62;
}
WGMMA_FUNCTIONS
// The accumulators stay in their registers across the loop (no copies the compiler might place between a group's
// issue and its wait, which would serialise the products), as CUTLASS's warpgroup_fence_operand keeps them.
template <int COUNT>
__device__ __forceinline__ void pin(float (&d)[COUNT]) {
#pragma unroll
    for (int i = 0; i < COUNT; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <int N, int TYPE, int SWZ, int WARPGROUPS, int IN_FLIGHT>
__global__ void __launch_bounds__(128 * WARPGROUPS, 1) wgmma_rate(int groups, int a_bytes, int b_bytes, float* sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    constexpr int PER_GROUP = TYPE == 0 ? 27 : 9;
    const int wg = threadIdx.x / 128;
    for (int i = threadIdx.x; i < (a_bytes + WARPGROUPS * b_bytes) / 4; i += blockDim.x)
        reinterpret_cast<float*>(smem)[i] = 1.0f + (i & 7) * 0.125f;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);  // the weights, shared as consumers would share them
    const unsigned b = (unsigned)__cvta_generic_to_shared(smem + a_bytes + wg * b_bytes);
    // each product's descriptors are these plus its operands' offsets in 16-byte units (the address field's)
    const unsigned long long a0 = SWZ ? descriptor(a, 16, 1024, 1) : descriptor(a, 1024, 128, 0);
    const unsigned long long b0 = SWZ ? descriptor(b, 16, 1024, 1) : descriptor(b, STAGED_PIXELS * 16, 128, 0);
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
    for (int g = 0; g < groups; g++) {
        pin(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // as each chunk's products start in conv2's tiles
#pragma unroll
        for (int i = 0; i < PER_GROUP; i++) {
            const int tap = i % 9, part = i / 9, shift = 16 * (tap / 3) + tap % 3, at = tap * 3 + part;
            // conv2's layout: A [tap][part][quad][64 rows][16 B], B [quad][pixel][16 B]; swizzled: rows of 128 bytes
            // (4 k-steps), 8-row groups 1,024 bytes apart (the values are arbitrary: a start inside a group keeps base
            // offset 0)
            const unsigned long long da = a0 + (SWZ ? at / 4 * 512 + at % 4 * 2 : at * 128);
            const unsigned long long db = b0 + (SWZ ? shift * 8 + tap % 4 * 2 : shift);
            product(d, da, db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(IN_FLIGHT) : "memory");
        pin(d);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N / 2; i++) s += d[i];
    if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the products live
}
"""


def product_function(n: int, kind: str) -> str:
    """`product(d, a, b)`: one wgmma m64n{n} of `kind` into d, both operands from shared memory."""
    ptx, k, _, _ = TYPES[kind]
    count = n // 2
    regs = ",".join(f"%{i}" for i in range(count))
    scale = " 1, 1, 1" + (", 0, 0" if kind == "bf16" else "")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(count))
    return (
        f"__device__ __forceinline__ void product(float (&d)[{n // 2}], unsigned long long a, unsigned long long b) "
        f'{{ asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx}.{ptx} {{{regs}}}, %{count}, '
        f'%{count + 1},{scale};" : {outs} : "l"(a), "l"(b)); }}'
    )


def staged_pixels(n: int) -> int:
    """The pixels of a staged image tile of n columns: its grid rows and a border row above and below, 16 wide, and
    the 2 past them that the last tap reads (2_conv2_tile_forms.cuh: staged_pixels)."""
    return (n // 16 + 2) * 16 + 2


def region_bytes(swizzle: int, n: int) -> tuple[int, int]:
    """Shared memory of the block's A (its warpgroups share it) and of one warpgroup's B, as the kernel addresses
    them (1,024-byte multiples)."""
    if swizzle == 0:
        a, b = 27 * 2048, 2 * staged_pixels(n) * 16
    else:
        a, b = 7 * 8192, (staged_pixels(n) + 1) * 128
    return tuple(-(-x // 1024) * 1024 for x in (a, b))


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int_in_range(10, 100_000), default=2000, help="groups of products per warpgroup")
    p.add_argument("--repeat", type=int_in_range(1, 50), default=5, help="timed launches per variant (median)")
    p.add_argument("--json", type=output_path, default=None, help="also write the table here")
    return p


def variants():
    for kind, n, swz, wgs, depth in itertools.product(TYPES, COLUMNS, SWIZZLES, WARPGROUPS, IN_FLIGHT):
        if n == 224 and wgs > 2:  # 112 accumulators a thread: two warpgroups' registers fill an SM at most
            continue
        yield kind, n, swz, wgs, depth


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_clashes(p, outputs=[("--json", args.json)])
    cp = gpu_or_exit(PROG)
    if not cuda.arch_specific():
        print(f"{PROG}: wgmma needs a Hopper GPU (sm_90a)", file=sys.stderr)
        return 2
    names = {v: f"wgmma_rate<{v[1]}, {list(TYPES).index(v[0])}, {SWIZZLES[v[2]]}, {v[3]}, {v[4]}>" for v in variants()}
    modules = {}
    for kind, n in itertools.product(TYPES, COLUMNS):
        text = SOURCE.replace("WGMMA_FUNCTIONS", product_function(n, kind)).replace(
            "STAGED_PIXELS", str(staged_pixels(n))
        )
        exprs = [name for v, name in names.items() if v[:2] == (kind, n)]
        modules[kind, n] = cp.RawModule(code=text, options=("--std=c++17", "-arch=sm_90a"), name_expressions=exprs)
    sink = cp.zeros(512, np.float32)
    sms, rows = cuda.sm_count(), []
    for v, name in names.items():
        kind, n, swz, wgs, depth = v
        fn = modules[kind, n].get_function(name)
        a_bytes, b_bytes = region_bytes(SWIZZLES[swz], n)
        shared = a_bytes + wgs * b_bytes
        fn.max_dynamic_shared_size_bytes = shared
        launch = lambda: fn(
            (sms,), (128 * wgs,), (np.int32(args.groups), np.int32(a_bytes), np.int32(b_bytes), sink), shared_mem=shared
        )
        launch()
        times = []
        for _ in range(args.repeat):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
        _, k, per_group, dense = TYPES[kind]
        flops = 2 * 64 * n * k * per_group * args.groups * wgs * sms
        tflops = flops / float(np.median(times)) / 1e12
        row = {
            "type": kind,
            "n": n,
            "swizzle": swz,
            "warpgroups_per_sm": wgs,
            "in_flight": depth,
            "tflops": round(tflops, 1),
            "of_dense": round(tflops / dense, 3),
        }
        rows.append(row)
        print(
            f"{kind} m64n{n} swizzle {swz:>4}, {wgs} warpgroups/SM, {depth} in flight: "
            f"{tflops:6.1f} TFLOP/s, {100 * tflops / dense:5.1f}% of dense"
        )
    if args.json:
        write_json(args.json, {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
