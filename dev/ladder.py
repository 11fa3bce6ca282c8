#!/usr/bin/env python3
"""A ladder of kernels for one op, from the naive kernel towards the fast one (llm.c's dev/cuda and SGEMM_CUDA's
manner): every rung checked against the float64 reference, then timed.

    PYTHONPATH=. python dev/ladder.py conv2_forward                               # batch 64, 512 and 4096
    PYTHONPATH=. python dev/ladder.py conv2_forward --batch-sizes 512 --json out.json

An op is a folder dev/ladder/OP/: its rungs, numbered files NN_name.cu (one kernel each, its header saying what
it adds over the rung below), and op.py, whose OP (dev/ladder_op.Op) holds each rung's launch contract (grid,
block, -D options), the shapes to check and to time, the inputs and outputs, the float64 reference and the count of
FLOPs and bytes. The top rung is the product's fast kernel, launched through mnist_cuda.ops as the step launches it.

Each rung is checked at the op's check shapes (odd sizes that fill no tile, other layers' geometry, the network's;
the product rung at those it is built for) against the reference with its tolerance, then timed at the network's
geometry for each batch size (CUDA graphs of launches, an event pair around each replay, after warm-up replays; the
median), and the table gives each rung's time, the fraction of its floor that time reaches (FLOPs at the peak of
the units it runs on, or bytes at the bandwidth) and its speed-up over the rung above (dev/ladder/README.md). A rung
that fails its check is not timed; the exit status is then 1.
"""

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_kernels import add_timing_arguments, time_case
from ladder_op import HBM_BYTES_PER_S, PEAK_FLOPS, UNIT_WORDS, Op, ProductRung, Rung, floor_us

from mnist_cuda import cuda
from mnist_cuda.cli import Parser, batch_sizes, gpu_or_exit, output_path, write_json
from mnist_cuda.kernel_cases import rel_err

PROG = "ladder.py"
LADDER = Path(__file__).resolve().parent / "ladder"


def load_ops() -> dict[str, Op]:
    """Every folder of dev/ladder/ with an op.py: its OP, by the folder's name."""
    ops = {}
    for folder in sorted(p for p in LADDER.iterdir() if (p / "op.py").is_file()):
        spec = importlib.util.spec_from_file_location(f"ladder_{folder.name}", folder / "op.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        ops[folder.name] = module.OP
    return ops


OPS = load_ops()


# ---- checking and timing any op ---------------------------------------------------------------------------------

_sources: dict[tuple[str, str], cuda.Source] = {}


def source(op: str, rung: Rung) -> cuda.Source:
    """The rung's file as a source with its -D options (one per rung, made on first use)."""
    if (op, rung.file) not in _sources:
        _sources[op, rung.file] = cuda.Source.from_file(LADDER / op / rung.file, rung.defines)
    return _sources[op, rung.file]


def kernel(op: str, rung: Rung):
    """The rung's kernel, or the tuple of its kernels where it launches several."""
    kernels = tuple(source(op, rung).kernel(name) for name in rung.kernels)
    return kernels[0] if len(kernels) == 1 else kernels


def sources(op: str, rung) -> list[cuda.Source] | None:
    """The sources the rung launches from, to load before a graph capture (None: every product source)."""
    return None if isinstance(rung, ProductRung) else [source(op, rung)]


@dataclasses.dataclass
class Prepared:
    run: Callable[[], None]  # launches the rung once on the current stream
    outputs: dict  # name -> device array, NaN until the rung writes it
    inputs: dict  # name -> float32 host array
    finish: Callable[[], None] | None = None  # after run, untimed: a bf16 product's outputs into `outputs`


def prepare(op: str, rung, shape, rng) -> Prepared:
    """Fresh random inputs on the device for one rung at one shape, and its outputs filled with NaN (an element
    the rung does not write fails the check), but those the op starts from given values (Op.initial)."""
    import cupy

    spec = OPS[op]
    inputs = spec.inputs(rng, shape)
    arrays = [cupy.asarray(a) for a in inputs.values()]
    outputs = {name: cupy.full(dims, np.nan, cupy.float32) for name, dims in spec.outputs(shape).items()}
    for name, start in (spec.initial(inputs) if spec.initial else {}).items():
        outputs[name][...] = cupy.asarray(start)
    arrays += outputs.values()
    arrays += [cupy.zeros(dims, cupy.float32) for dims in (spec.scratch(shape) if spec.scratch else {}).values()]
    finish = None
    if isinstance(rung, ProductRung):
        run = rung.prepare(shape, *arrays)
        if isinstance(run, tuple):
            run, finish = run
    else:
        k = kernel(op, rung)
        run = lambda: rung.launch(k, shape, *arrays)  # noqa: E731
    return Prepared(run, outputs, inputs, finish)


def check(op: str, rung, shape, rng) -> float:
    """The rung's largest relative error against the float64 reference over its outputs, at one shape."""
    prepared = prepare(op, rung, shape, rng)
    prepared.run()
    if prepared.finish:
        prepared.finish()
    want = OPS[op].reference(**{name: a.astype(np.float64) for name, a in prepared.inputs.items()})
    return max(rel_err(prepared.outputs[name].get(), want[name]) for name in want)


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


def check_rungs(op: str, rng) -> tuple[list, list[dict]]:
    """Every rung of the op at every check shape it accepts ("-" where it does not): (the rungs that pass, a row
    per rung and shape checked); prints a table."""
    spec = OPS[op]
    width, column = max(len(r.name) for r in spec.rungs), max(len(str(s)) for s in spec.check_shapes)
    print(f"\n{op}: relative error against the float64 reference (tolerance after the errors)")
    print(f"{'rung':{width}s} " + " ".join(f"{str(s):>{column}s}" for s in spec.check_shapes))
    passed, rows = [], []
    for rung in spec.rungs:
        shapes = [s for s in spec.check_shapes if rung.accepts(s)]
        errors = {s: check(op, rung, s, rng) for s in shapes}
        ok = all(e < rung.tolerance for e in errors.values())
        passed += [rung] if ok else []
        rows += [
            {"rung": rung.name, "kernel": rung.kernel, "shape": str(s), "rel_err": e, "ok": e < rung.tolerance}
            for s, e in errors.items()
        ]
        cells = [f"{errors[s]:{column}.1e}" if s in errors else f"{'-':>{column}s}" for s in spec.check_shapes]
        print(f"{rung.name:{width}s} " + " ".join(cells) + f"  {rung.tolerance:.0e}" + ("" if ok else "  FAIL"))
    return passed, rows


def _floors_header(op: str, batches: list[int]) -> str:
    spec = OPS[op]
    units = sorted({r.unit for r in spec.rungs}, key=list(PEAK_FLOPS).index)
    lines = [
        f"\n{op}, {spec.geometry}: us per launch; the fraction of its floor it reaches (its FLOPs at the peak of the "
        f"units it runs on, or its fewest bytes at {HBM_BYTES_PER_S / 1e12:.1f} TB/s); the speed-up over the rung above"
    ]
    for unit in units:
        rung = next(r for r in spec.rungs if r.unit == unit)
        floors = ", ".join(f"{floor_us(spec, rung, spec.network_shape(b)):.1f} us at N={b}" for b in batches)
        lines.append(f"  floor, {UNIT_WORDS[unit]} ({PEAK_FLOPS[unit] / 1e12:.0f} TFLOP/s): {floors}")
    return "\n".join(lines)


def time_rungs(op: str, rungs: list, batches: list[int], warmup: int, repeat: int, rng) -> list[dict]:
    """The rungs' median times at the network's shape for each batch size: a row per rung and batch size; prints
    a table of the time, the fraction of the rung's floor it reaches and the speed-up over the rung above (the one
    timed before it)."""
    spec = OPS[op]
    width = max(len(r.name) for r in spec.rungs)
    print(_floors_header(op, batches))
    print(f"{'':{width}s} " + " ".join(f"{f'N={b}':>30s}" for b in batches))
    print(f"{'rung':{width}s} " + " ".join(f"{'us':>12s} {'floor':>8s} {'speed-up':>8s}" for _ in batches))
    rows, previous = [], {}
    for rung in rungs:
        cells = []
        for batch in batches:
            shape = spec.network_shape(batch)
            us = time_case(prepare(op, rung, shape, rng), warmup, repeat, sources=sources(op, rung))
            floor = floor_us(spec, rung, shape)
            fraction, speedup = floor / us, previous[batch] / us if batch in previous else None
            previous[batch] = us
            rows.append(
                {
                    "rung": rung.name,
                    "kernel": rung.kernel,
                    "unit": rung.unit,
                    "batch": batch,
                    "us": us,
                    "floor_us": floor,
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
    cuda.preload([source(args.op, r) for r in rungs if isinstance(r, Rung)])
    passed, checks = check_rungs(args.op, rng)
    timings = time_rungs(args.op, passed, args.batch_sizes, args.warmup, args.repeat, rng)
    if args.json:
        write_json(
            args.json,
            {
                "op": args.op,
                "device": cuda.require_gpu().cuda.runtime.getDeviceProperties(0)["name"].decode(),
                "peaks": {"flops": PEAK_FLOPS, "hbm_bytes_per_s": HBM_BYTES_PER_S},
                "checks": checks,
                "timings": timings,
            },
        )
    return 0 if len(passed) == len(rungs) else 1


if __name__ == "__main__":
    sys.exit(main())
