#!/usr/bin/env python3
"""A ladder of kernels for one op, from the naive kernel towards the fast one (llm.c's dev/cuda and SGEMM_CUDA's
manner): every rung checked against the float64 reference, then timed.

    PYTHONPATH=. python dev/ladder.py conv2_forward                               # batch 64, 512 and 4096
    PYTHONPATH=. python dev/ladder.py conv2_forward --batch-sizes 512 --json out.json

A rung is a numbered file of dev/ladder/OP/ (NN_name.cu: one kernel, its header saying what it adds over the rung
below) and its launch function here, which holds the rung's grid, block and -D options. Each rung is checked at
the op's check shapes (odd sizes that fill no tile, other layers' geometry, the network's) against the reference with
kernel_cases' fp32 tolerance, then timed at the network's geometry for each batch size (CUDA graphs of launches,
an event pair around each replay, after warm-up replays; the median), and the table gives each rung's time, the
fraction of the op's floor that time reaches, and its speed-up over the rung above (dev/ladder/README.md). A rung
that fails its check is not timed; the exit status is then 1.

An op is an entry of OPS: its rungs, the shapes to check and to time, its inputs and outputs, its reference and
its count of FLOPs and bytes.
"""

# (no `from __future__ import annotations`: the tests load this file by conftest.load_script, outside sys.modules,
# where dataclasses cannot look string annotations up)
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_kernels import add_timing_arguments, time_case

from mnist_cuda import cuda
from mnist_cuda import reference as ref
from mnist_cuda.cli import Parser, batch_sizes, gpu_or_exit, output_path, write_json
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import FP32_TOL, rel_err
from mnist_cuda.sizes import GRID_LIMIT

PROG = "ladder.py"
LADDER = Path(__file__).resolve().parent / "ladder"
# The op's floor: its FLOPs at the fp32 CUDA-core peak, or its bytes at the HBM bandwidth, whichever takes longer.
# NVIDIA's H200 SXM datasheet: FP32 67 TFLOP/s, GPU memory bandwidth 4.8 TB/s (docs/performance.md, section 1,
# takes the same). The rungs below the tensor-core ones run on the CUDA cores, so fp32's is the peak they can reach.
FP32_PEAK_FLOPS = 67e12
HBM_BYTES_PER_S = 4.8e12


@dataclasses.dataclass(frozen=True)
class Rung:
    file: str  # NN_name.cu in dev/ladder/<op>/
    kernel: str  # its extern "C" kernel
    launch: Callable  # launch(kernel, shape, *inputs, *outputs): the rung's grid, block and arguments
    defines: dict = dataclasses.field(default_factory=dict)  # its -D options

    @property
    def name(self) -> str:
        return self.file.removesuffix(".cu")


@dataclasses.dataclass(frozen=True)
class Op:
    rungs: tuple[Rung, ...]
    geometry: str  # the network's shapes, in words
    check_shapes: tuple  # the shapes every rung is checked at
    network_shape: Callable  # network_shape(batch): the shape it is timed at
    inputs: Callable  # inputs(rng, shape) -> {name: float32 host array}, in the launch's order
    outputs: Callable  # outputs(shape) -> {name: shape of the array}, in the launch's order
    reference: Callable  # reference(**float64 inputs) -> {name: float64 array}
    work: Callable  # work(shape) -> (FLOPs, fewest bytes moved)


# ---- conv2_forward --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Conv:
    """A 3x3 convolution, stride 1, zero padding 1: x [n, c, h, w], w [k, c, 3, 3] -> y [n, k, h, w]."""

    n: int
    c: int
    k: int
    h: int
    w: int

    def __str__(self):
        return f"N={self.n},C={self.c},K={self.k},{self.h}x{self.w}"

    def ints(self) -> tuple:
        return tuple(np.int32(v) for v in (self.n, self.c, self.k, self.h, self.w))


def _image_tile_grid(s: Conv, tile_h: int, tile_w: int, tile_k: int) -> tuple[int, int, int]:
    """(the image's spatial tiles, row by row; the output channels' tiles; the images): rungs 02 and 03's grid."""
    if s.n > GRID_LIMIT:
        raise ValueError(f"{s.n} images: the images go in grid z, which takes at most {GRID_LIMIT}")
    return ceil_div(s.h, tile_h) * ceil_div(s.w, tile_w), ceil_div(s.k, tile_k), s.n


def launch_naive(kernel, s: Conv, x, w, y):
    """Rung 01: a thread per element of y, blocks of 256 (mnist_cuda.ops.naive.conv2d_forward's contract)."""
    kernel.launch_1d(s.n * s.k * s.h * s.w, x, w, y, *s.ints())


SHARED_TILES = {"TILE_H": 8, "TILE_W": 16, "TILE_K": 4, "CHUNK_C": 8}


def launch_shared_tiles(kernel, s: Conv, x, w, y):
    """Rung 02: a block per TILE_H x TILE_W output pixels of an image and TILE_K output channels, a thread per
    output; CHUNK_C input channels staged at a time (its shared memory is sized in the kernel, from these)."""
    t = SHARED_TILES
    grid = _image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    kernel.launch(grid, t["TILE_H"] * t["TILE_W"] * t["TILE_K"], x, w, y, *s.ints())


REGISTER_BLOCKING = {"TILE_H": 16, "TILE_W": 16, "TILE_K": 16, "KPT": 4, "CHUNK_C": 8}


def launch_register_blocking(kernel, s: Conv, x, w, y):
    """Rung 03: a block per TILE_H x TILE_W output pixels of an image and TILE_K output channels, a thread per
    2 x 2 pixels and KPT channels; CHUNK_C input channels staged at a time (shared memory sized in the kernel)."""
    t = REGISTER_BLOCKING
    grid = _image_tile_grid(s, t["TILE_H"], t["TILE_W"], t["TILE_K"])
    threads = (t["TILE_H"] // 2) * (t["TILE_W"] // 2) * (t["TILE_K"] // t["KPT"])
    kernel.launch(grid, threads, x, w, y, *s.ints())


def _conv_inputs(rng, s: Conv) -> dict:
    """x ~ N(0, 1) and w ~ N(0, 1 / (9 C)), as mnist_cuda.kernel_cases draws them."""
    x = rng.standard_normal((s.n, s.c, s.h, s.w)).astype(np.float32)
    w = (rng.standard_normal((s.k, s.c, 3, 3)) / np.sqrt(9 * s.c)).astype(np.float32)
    return {"x": x, "w": w}


def _conv_work(s: Conv) -> tuple[float, float]:
    """2 FLOPs per multiply-add; x and w read and y written once, as float32."""
    return 2.0 * s.n * s.k * s.h * s.w * s.c * 9, 4.0 * (s.n * s.c * s.h * s.w + s.k * s.c * 9 + s.n * s.k * s.h * s.w)


CONV2_FORWARD = Op(
    rungs=(
        Rung("01_naive.cu", "conv2d_forward_naive", launch_naive),
        Rung("02_shared_tiles.cu", "conv2_forward_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "conv2_forward_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
    ),
    geometry="x [N,32,14,14], w [64,32,3,3] -> y [N,64,14,14]",
    check_shapes=(
        Conv(3, 5, 7, 13, 13),  # odd sizes: no tile fits whole
        Conv(2, 9, 33, 17, 30),  # an oblong image: partial tiles at two edges, a partial chunk of C
        Conv(5, 1, 32, 28, 28),  # conv1's geometry: one input channel, 28 x 28
        Conv(64, 32, 64, 14, 14),  # conv2's, the network's
        Conv(512, 32, 64, 14, 14),
    ),
    network_shape=lambda batch: Conv(batch, 32, 64, 14, 14),
    inputs=_conv_inputs,
    outputs=lambda s: {"y": (s.n, s.k, s.h, s.w)},
    reference=lambda x, w: {"y": ref.conv2d_forward(x, w)},
    work=_conv_work,
)

OPS = {"conv2_forward": CONV2_FORWARD}


# ---- checking and timing any op ---------------------------------------------------------------------------------

_sources: dict[tuple[str, str], cuda.Source] = {}


def source(op: str, rung: Rung) -> cuda.Source:
    """The rung's file as a source with its -D options (one per rung, made on first use)."""
    if (op, rung.file) not in _sources:
        _sources[op, rung.file] = cuda.Source.from_file(LADDER / op / rung.file, rung.defines)
    return _sources[op, rung.file]


def kernel(op: str, rung: Rung) -> cuda.Kernel:
    return source(op, rung).kernel(rung.kernel)


@dataclasses.dataclass
class Prepared:
    run: Callable[[], None]  # launches the rung once on the current stream
    outputs: dict  # name -> device array, NaN until the rung writes it
    inputs: dict  # name -> float32 host array


def prepare(op: str, rung: Rung, shape, rng) -> Prepared:
    """Fresh random inputs on the device for one rung at one shape, and its outputs filled with NaN (an element
    the rung does not write fails the check)."""
    import cupy

    spec = OPS[op]
    inputs = spec.inputs(rng, shape)
    device_inputs = [cupy.asarray(a) for a in inputs.values()]
    outputs = {name: cupy.full(dims, np.nan, cupy.float32) for name, dims in spec.outputs(shape).items()}
    k = kernel(op, rung)
    return Prepared(lambda: rung.launch(k, shape, *device_inputs, *outputs.values()), outputs, inputs)


def check(op: str, rung: Rung, shape, rng) -> float:
    """The rung's largest relative error against the float64 reference over its outputs, at one shape."""
    prepared = prepare(op, rung, shape, rng)
    prepared.run()
    want = OPS[op].reference(**{name: a.astype(np.float64) for name, a in prepared.inputs.items()})
    return max(rel_err(prepared.outputs[name].get(), want[name]) for name in want)


def floor_us(op: str, shape) -> float:
    flops, nbytes = OPS[op].work(shape)
    return max(flops / FP32_PEAK_FLOPS, nbytes / HBM_BYTES_PER_S) * 1e6


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("op", metavar="OP", help=f"the op whose ladder to run, one of: {', '.join(OPS)}")
    p.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default="64,512,4096",
        help="comma-separated batch sizes to time at, in the network's geometry (default: 64,512,4096)",
    )
    add_timing_arguments(p, "rung")
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="also write the checks and the table")
    return p


def check_rungs(op: str, rng) -> tuple[list[Rung], list[dict]]:
    """Every rung of the op at every check shape: (the rungs that pass, a row per rung and shape); prints a table."""
    spec = OPS[op]
    width, column = max(len(r.name) for r in spec.rungs), max(len(str(s)) for s in spec.check_shapes)
    print(f"\n{op}: relative error against the float64 reference (tolerance {FP32_TOL:.0e})")
    print(f"{'rung':{width}s} " + " ".join(f"{str(s):>{column}s}" for s in spec.check_shapes))
    passed, rows = [], []
    for rung in spec.rungs:
        errors = [check(op, rung, shape, rng) for shape in spec.check_shapes]
        ok = all(e < FP32_TOL for e in errors)
        passed += [rung] if ok else []
        rows += [
            {"rung": rung.name, "kernel": rung.kernel, "shape": str(s), "rel_err": e, "ok": e < FP32_TOL}
            for s, e in zip(spec.check_shapes, errors)
        ]
        print(
            f"{rung.name:{width}s} " + " ".join(f"{e:{column}.1e}" for e in errors) + ("" if ok else "   FAIL"),
            flush=True,
        )
    return passed, rows


def time_rungs(op: str, rungs: list[Rung], batches: list[int], warmup: int, repeat: int, rng) -> list[dict]:
    """The rungs' median times at the network's shape for each batch size: a row per rung and batch size; prints
    a table of the time, the fraction of the floor it reaches and the speed-up over the rung above (the one timed
    before it)."""
    spec = OPS[op]
    width = max(len(r.name) for r in spec.rungs)
    print(
        f"\n{op}, {spec.geometry}: us per launch, the fraction of the floor it reaches (FLOPs at "
        f"{FP32_PEAK_FLOPS / 1e12:.0f} TFLOP/s or bytes at {HBM_BYTES_PER_S / 1e12:.1f} TB/s), speed-up over the "
        "rung above"
    )
    floors = {batch: floor_us(op, spec.network_shape(batch)) for batch in batches}
    print(f"{'':{width}s} " + " ".join(f"{f'N={b} (floor {floors[b]:.1f} us)':>30s}" for b in batches))
    print(f"{'rung':{width}s} " + " ".join(f"{'us':>12s} {'floor':>8s} {'speed-up':>8s}" for _ in batches))
    rows, previous = [], {}
    for rung in rungs:
        cells = []
        for batch in batches:
            prepared = prepare(op, rung, spec.network_shape(batch), rng)
            us = time_case(prepared, warmup, repeat, sources=[source(op, rung)])
            fraction, speedup = floors[batch] / us, previous[batch] / us if batch in previous else None
            previous[batch] = us
            rows.append(
                {
                    "rung": rung.name,
                    "kernel": rung.kernel,
                    "batch": batch,
                    "us": us,
                    "floor_us": floors[batch],
                    "fraction_of_floor": fraction,
                    "speedup": speedup,
                }
            )
            cells.append(f"{us:12.1f} {fraction:8.1%} " + (f"{speedup:7.2f}x" if speedup else f"{'-':>8s}"))
        print(f"{rung.name:{width}s} " + " ".join(cells), flush=True)
    return rows


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.op not in OPS:
        p.error(f"argument OP: unknown op {args.op!r} (choose from {', '.join(OPS)})")
    gpu_or_exit(PROG)
    rungs, rng = OPS[args.op].rungs, np.random.default_rng()
    cuda.preload([kernel(args.op, rung).source for rung in rungs])
    passed, checks = check_rungs(args.op, rng)
    timings = time_rungs(args.op, passed, args.batch_sizes, args.warmup, args.repeat, rng)
    if args.json:
        write_json(
            args.json,
            {
                "op": args.op,
                "device": cuda.require_gpu().cuda.runtime.getDeviceProperties(0)["name"].decode(),
                "peaks": {"fp32_flops": FP32_PEAK_FLOPS, "hbm_bytes_per_s": HBM_BYTES_PER_S},
                "checks": checks,
                "timings": timings,
            },
        )
    return 0 if len(passed) == len(rungs) else 1


if __name__ == "__main__":
    sys.exit(main())
