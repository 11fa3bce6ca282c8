#!/usr/bin/env python3
"""What holds conv2's 3xTF32 forward tiles: the kernel alone, timed with parts of each tile left out.

conv2_forward_fast<Precision::Fp32> (kernels/fast/2_conv2_image_tile.cuh, conv3x3_image_tile) gives each block one
tile: it stages the tile's first chunk, then for each chunk issues its products, stages the next chunk's image while
they run, waits for them and refills the chunk's weights (one buffer in this form), and after the last chunk stores
its output through shared memory. dev/wgmma_rate.py times the products alone; this times the real kernel with each
other part left out in turn (its call guarded by a condition that never holds, so the products still run on whatever
the buffers hold):
- store: the output's store after the products;
- refill: the weights' refill between chunks;
- staging: the next chunk's image, staged while the products run;
- first loads: the first chunk's image and weights.
The numbers the kernel computes are wrong in every variant but the first; only its time is measured: launches on
random inputs, the median of 7 samples of --launches launches each, per variant and round.

    PYTHONPATH=. python dev/conv2_tile_ablation.py [--batch-size 4096] [--rounds 2] [--json F]
"""

from __future__ import annotations

import sys

import numpy as np

# (dev/: this file's folder is first on sys.path when run as a script)
from step_launch_costs import gpu_or_exit

from mnist_cuda import cuda
from mnist_cuda.cli import Parser, int_in_range, output_path, refuse_clashes, write_json

PROG = "conv2_tile_ablation.py"
C_IN, C_OUT, SAMPLES = 32, 64, 7
DENSE_TF32_TFLOPS = 494.7  # NVIDIA's dense TF32 figure for the H100 and H200 SXM
FIRST = (
    "    staging.fetch_image(0);\n    staging.fetch_weights(0);\n"
    "    __syncthreads();  // the zeros are written before any stash\n    staging.stash(0);"
)
# each part: (its text in conv3x3_image_tile, that text guarded so that it never runs)
PARTS = {
    "store": (
        "    store_image_tile<FORM, 1>(acc, in_s, out, Cout, img, n0, r0, tid, warp, g, t, none);\n}",
        "    if (Cout < 0) store_image_tile<FORM, 1>(acc, in_s, out, Cout, img, n0, r0, tid, warp, g, t, none);\n}",
    ),
    "refill": (
        "        if (weight_buffers<FORM> == 1 && chunk + 1 < chunks) {",
        "        if (Cout < 0 && weight_buffers<FORM> == 1 && chunk + 1 < chunks) {",
    ),
    "staging": (
        "        staging.stage_next(chunk, chunks, buffer);\n        wait_chunk_products();",
        "        if (Cout < 0) staging.stage_next(chunk, chunks, buffer);\n        wait_chunk_products();",
    ),
    "first loads": (FIRST, "    if (Cout < 0) {\n" + FIRST + "\n    }"),
}
VARIANTS = {
    "as is": (),
    "no store": ("store",),
    "no refill": ("refill",),
    "no staging": ("staging",),
    "no refill or staging": ("refill", "staging"),
    "no refill, staging or store": ("refill", "staging", "store"),
    "products only": ("refill", "staging", "store", "first loads"),
}


def leave_out(parts):
    """A cuda.transform_sources function: the image-tile source with `parts` guarded off. Each part's text must
    occur once in it (else the kernel changed under this probe, which says so)."""

    def transform(path: str, text: str) -> str:
        if "conv3x3_image_tile(" not in text:
            return text
        for part in parts:
            original, guarded = PARTS[part]
            if text.count(original) != 1:
                raise RuntimeError(f"{PROG}: the {part} of conv3x3_image_tile is not where this probe expects it")
            text = text.replace(original, guarded)
        return text

    return transform


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int_in_range(64, 8192), default=4096, help="images (default 4096)")
    p.add_argument("--rounds", type=int_in_range(1, 10), default=2, help="passes over the variants (default 2)")
    p.add_argument("--launches", type=int_in_range(1, 1000), default=10, help="launches per timed sample")
    p.add_argument("--json", type=output_path, default=None, help="also write the times here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_clashes(p, outputs=[("--json", args.json)])
    cp = gpu_or_exit(PROG)
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    n, rng = args.batch_size, np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((n, C_IN, 14, 14), dtype=np.float32))
    y = cp.empty((n, C_OUT, 14, 14), np.float32)
    w = cp.asarray(rng.standard_normal((C_OUT, C_IN, 3, 3), dtype=np.float32) * 0.1)
    forward_quads = cp.empty((conv2.weight_quads(C_IN, C_OUT, "fp32", "forward"), 4), np.float32)
    input_grad_quads = cp.empty((conv2.weight_quads(C_OUT, C_IN, "fp32", "backward_input"), 4), np.float32)
    flops = 3 * 2 * n * 14 * 16 * C_OUT * C_IN * 9  # 3xTF32's three products over 16 columns per 14 pixels
    times = {name: [] for name in VARIANTS}
    try:
        for _ in range(args.rounds):
            for name, parts in VARIANTS.items():
                cuda.transform_sources(leave_out(parts))
                conv2.stage_weights(w, C_IN, C_OUT, forward_quads, input_grad_quads, "fp32")
                launch = lambda: conv2.forward(x, forward_quads, y, n, C_IN, C_OUT, "fp32", persistent=False)
                us = median_launch_us(cp, launch, args.launches)
                times[name].append(round(us, 1))
                rate = flops / us / 1e6
                print(f"{name:28s} {us:7.1f} us  {rate:6.1f} TFLOP/s ({100 * rate / DENSE_TF32_TFLOPS:4.1f}% of dense)")
    finally:
        cuda.transform_sources(None)
    if args.json:
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        write_json(args.json, {"device": device, "batch_size": n, "launches": args.launches, "us": times})
    return 0


def median_launch_us(cp, launch, launches: int) -> float:
    """us per launch: the median of SAMPLES samples of `launches` launches each, after one untimed."""
    launch()
    samples = []
    for _ in range(SAMPLES):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(launches):
            launch()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1000 / launches)
    return float(np.median(samples))


if __name__ == "__main__":
    sys.exit(main())
