#!/usr/bin/env python3
"""How fast can conv2's instruction stream run on Hopper's tensor cores, with nothing else in the way?

conv2's image tiles (kernels/fast/2_conv2_image_tile.cuh) issue `wgmma` m64n112 products whose operands both come
from shared memory in wgmma's unswizzled layout: A (the weights) [tap][channel quad][row][16 bytes], B (the staged
image) a plane of 16-byte pixels per channel quad, each tap's B the same planes from a start shifted by whole pixels.
A chunk's products (27 in 3xTF32's apart form: each tap's small * B_big, big * B_small and big * B_big; 9 in bf16) go
out as one group, and the warpgroup waits for all of them before it stages the next chunk. docs/performance.md
(section 2) measures the forward with its staging left out; this probe measures the products with everything else
left out, which is as fast as a warp-specialised kernel (a producer staging for consumer warpgroups, as CUTLASS's
Hopper kernels are built) could issue them.

Each block fills its shared memory with random operands once, then each of its warpgroups issues `--groups` groups
of products into one set of accumulators, in the layouts and order of conv2's tiles. Variants:
- swizzle: none (conv2's layout; a tap's shift moves B's start by 16-byte pixels) or 128-byte (K-major rows of 128
  bytes, the layout TMA writes and CUTLASS's kernels read; a tap's shift moves the start by 128-byte rows);
- warpgroups per SM, 1 to 4, as one block of them ("block": they share A, as consumers would) or as that many blocks
  of one warpgroup ("blocks": conv2's image tiles run four per SM), where their shared memory fits;
- in flight: 0 (wait for each group before the next, as conv2's tiles do) or 1 (the group before still running
  while the next is issued, as a consumer fed by a producer may);
- N: 112 columns (conv2's half image) or 224 (the whole image in one instruction).
The results are discarded: the rate is reported in TFLOP/s and as a share of NVIDIA's dense figure for the H100 and
H200 SXM (494.7 TFLOP/s in TF32, 989.4 in bf16), with the GPU's maximum SM clock.

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
ARRANGEMENTS = ("block", "blocks")
IN_FLIGHT = (0, 1)
SHARED_PER_SM = 227 * 1024  # the most a Hopper SM gives its blocks

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

// Random finite operands: floats in [-1, 1), or in bf16 two such values' upper halves a word, so that the products'
// inputs vary as real weights and images do (a repeating pattern could run faster).
__device__ __forceinline__ unsigned random_word(unsigned i, int type) {
    auto hash = [](unsigned h) {
        h *= 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        return h ^ (h >> 13);
    };
    auto value = [](unsigned h) { return __float_as_uint((float)(h & 0xFFFFFF) * (1.0f / 8388608.0f) - 1.0f); };
    const unsigned first = value(hash(2 * i + 1)), second = value(hash(2 * i + 2));
    return type == 0 ? first : (first >> 16) | (second & 0xFFFF0000u);
}

// TYPE 0: 3xTF32's apart form, A [tap][quad][128 rows: big, then small][16 B], B [part][quad][pixel][16 B], three
// products a tap; TYPE 1: bf16, A [tap][quad][64 rows][16 B], B [quad][pixel][16 B], one. SWZ 1: A [4 taps][rows]
// [128 B], B [part][pixel][128 B], 8-row groups 1,024 bytes apart (the values are arbitrary, so the starts that a
// tap's shift puts inside a group keep base offset 0).
template <int N, int TYPE, int SWZ, int WARPGROUPS, int IN_FLIGHT>
__global__ void __launch_bounds__(128 * WARPGROUPS, 1) wgmma_rate(int groups, int a_bytes, int b_bytes, float* sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    constexpr int PER_GROUP = TYPE == 0 ? 27 : 9, ROWS = TYPE == 0 ? 128 : 64, PLANE = STAGED_PIXELS * 16;
    const int wg = threadIdx.x / 128;
    for (int i = threadIdx.x; i < (a_bytes + WARPGROUPS * b_bytes) / 4; i += blockDim.x)
        reinterpret_cast<unsigned*>(smem)[i] = random_word(blockIdx.x * 65536u + i, TYPE);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);  // the weights, shared as consumers would share them
    const unsigned b = (unsigned)__cvta_generic_to_shared(smem + a_bytes + wg * b_bytes);
    // each product's descriptors are these plus its operands' offsets in 16-byte units (the address field's)
    const unsigned long long a0 = SWZ ? descriptor(a, 16, 1024, 1) : descriptor(a, ROWS * 16, 128, 0);
    const unsigned long long b0 = SWZ ? descriptor(b, 16, 1024, 1) : descriptor(b, PLANE, 128, 0);
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
    for (int g = 0; g < groups; g++) {
        pin(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // as each chunk's products start in conv2's tiles
#pragma unroll
        for (int i = 0; i < PER_GROUP; i++) {
            const int tap = i / (PER_GROUP / 9), shift = 16 * (tap / 3) + tap % 3;
            const int part = i % (PER_GROUP / 9);  // 3xTF32: small * B_big, big * B_small, big * B_big
            const bool a_small = TYPE == 0 && part == 0, b_small = TYPE == 0 && part == 1;
            const unsigned long long da =
                a0 + (SWZ ? tap / 4 * ROWS * 8 + tap % 4 * 2 + a_small * 512 : tap * ROWS * 2 + a_small * 64);
            const unsigned long long db =
                b0 + (SWZ ? b_small * (STAGED_PIXELS + 1) * 8 + shift * 8 + tap % 4 * 2 : b_small * PLANE / 8 + shift);
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


def region_bytes(kind: str, swizzle: int, n: int) -> tuple[int, int]:
    """Shared memory of a block's A (its warpgroups share it) and of one warpgroup's B, as the kernel addresses them
    (1,024-byte multiples): 3xTF32's A has 128 rows (big and small parts) and two parts of B, bf16 one of each."""
    rows, parts = (128, 2) if kind == "tf32" else (64, 1)
    if swizzle == 0:
        a, b = 9 * 2 * rows * 16, parts * 2 * staged_pixels(n) * 16
    else:
        a, b = 3 * rows * 128, parts * (staged_pixels(n) + 1) * 128
    return tuple(-(-x // 1024) * 1024 for x in (a, b))


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int_in_range(10, 100_000), default=2000, help="groups of products per warpgroup")
    p.add_argument("--repeat", type=int_in_range(1, 50), default=5, help="timed launches per variant (median)")
    p.add_argument("--json", type=output_path, default=None, help="also write the table here")
    return p


def layout(kind: str, n: int, swz: str, wgs: int, arrangement: str) -> tuple[int, int, int]:
    """(warpgroups per block, blocks per SM, dynamic shared memory per block) of a variant."""
    per_block, blocks = (wgs, 1) if arrangement == "block" else (1, wgs)
    a_bytes, b_bytes = region_bytes(kind, SWIZZLES[swz], n)
    return per_block, blocks, a_bytes + per_block * b_bytes


def variants():
    """(type, N, swizzle, warpgroups per SM, arrangement, in flight) of every variant whose blocks fit an SM: at most
    two warpgroups of N = 224 (112 accumulators each), "blocks" only for more than one warpgroup."""
    for kind, n, swz, wgs, arrangement, depth in itertools.product(
        TYPES, COLUMNS, SWIZZLES, WARPGROUPS, ARRANGEMENTS, IN_FLIGHT
    ):
        _, blocks, shared = layout(kind, n, swz, wgs, arrangement)
        if (n == 224 and wgs > 2) or (arrangement == "blocks" and wgs == 1) or blocks * shared > SHARED_PER_SM:
            continue
        yield kind, n, swz, wgs, arrangement, depth


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_clashes(p, outputs=[("--json", args.json)])
    cp = gpu_or_exit(PROG)
    if not cuda.arch_specific():
        print(f"{PROG}: wgmma needs a Hopper GPU (sm_90a)", file=sys.stderr)
        return 2
    names = {
        v: f"wgmma_rate<{v[1]}, {list(TYPES).index(v[0])}, {SWIZZLES[v[2]]}, {layout(*v[:5])[0]}, {v[5]}>"
        for v in variants()
    }
    modules = {}
    for kind, n in itertools.product(TYPES, COLUMNS):
        text = SOURCE.replace("WGMMA_FUNCTIONS", product_function(n, kind)).replace(
            "STAGED_PIXELS", str(staged_pixels(n))
        )
        exprs = sorted({name for v, name in names.items() if v[:2] == (kind, n)})
        modules[kind, n] = cp.RawModule(code=text, options=("--std=c++17", "-arch=sm_90a"), name_expressions=exprs)
    sms, rows = cuda.sm_count(), []
    for v, name in names.items():
        rows.append(measure(cp, modules[v[:2]].get_function(name), v, sms, args))
    if args.json:
        clock = cp.cuda.Device().attributes["ClockRate"] // 1000
        write_json(
            args.json,
            {
                "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                "max_sm_clock_mhz": clock,
                "groups": args.groups,
                "repeat": args.repeat,
                "rows": rows,
            },
        )
    return 0


def measure(cp, fn, variant, sms: int, args) -> dict:
    """One variant's rate: the median of --repeat launches after one untimed."""
    kind, n, swz, wgs, arrangement, depth = variant
    per_block, blocks, shared = layout(kind, n, swz, wgs, arrangement)
    a_bytes, b_bytes = region_bytes(kind, SWIZZLES[swz], n)
    fn.max_dynamic_shared_size_bytes = shared
    sink = cp.zeros(128 * per_block, np.float32)
    grid, block = (sms * blocks,), (128 * per_block,)
    launch = lambda: fn(
        grid, block, (np.int32(args.groups), np.int32(a_bytes), np.int32(b_bytes), sink), shared_mem=shared
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
    tflops = 2 * 64 * n * k * per_group * args.groups * wgs * sms / float(np.median(times)) / 1e12
    print(
        f"{kind} m64n{n} swizzle {swz:>4}, {wgs} warpgroups/SM as {arrangement:6}, {depth} in flight: "
        f"{tflops:6.1f} TFLOP/s, {100 * tflops / dense:5.1f}% of dense"
    )
    return {
        "type": kind,
        "n": n,
        "swizzle": swz,
        "warpgroups_per_sm": wgs,
        "arrangement": arrangement,
        "in_flight": depth,
        "tflops": round(tflops, 1),
        "of_dense": round(tflops / dense, 3),
    }


if __name__ == "__main__":
    sys.exit(main())
