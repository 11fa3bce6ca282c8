#!/usr/bin/env python3
"""Programmatic dependent launch in the step graph: does letting each kernel start while the one before it on
its stream drains hide part of the launch gaps?

Every kernel is compiled with `griddepcontrol.wait` before its first read of global memory (it waits there until
the kernels it depends on have finished and their writes are visible, so every kernel computes what it did; with
no programmatic dependency it returns at once). The kernels of the step's main stream are launched through the
driver's cuLaunchKernelEx with the programmatic-stream-serialization attribute (CuPy's launch takes no attributes),
so the step graph captures programmatic edges into them: from the kernel before on the stream, and from the side
streams' last kernels where they are joined (conv2's weight staging into conv2's forward, the branches into the
update). The side streams' kernels launch as they are (with the attribute there, the capture ends with its side
streams unjoined).
Variants, each timed as dev/time_step.py times the step:
- plain: the kernels and launches as the product has them;
- wait: the wait and the attribute; a kernel lets the next one launch when its blocks exit (the implicit trigger);
- wait+trigger: also `griddepcontrol.launch_dependents` right after the wait, so the next kernel's blocks may be
  resident, waiting, while this one runs;
- prologue: the wait after each kernel's independent prologue (PROLOGUES: work that reads no global memory a
  kernel of the step writes), first in the kernels that have none; the implicit trigger;
- trigger+prologue: also `launch_dependents` first in every kernel, so the next kernel's prologue may run while
  this one does.
Each variant's weights after --check-steps steps from the same start are compared with plain's, byte for byte.

    PYTHONPATH=. python dev/pdl_probe.py --data-dir data/mnist --batch-sizes 64,512,4096 [--repeats 2] [--json F]
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time

import numpy as np

# (dev/: this file's folder is first on sys.path when run as a script)
from step_launch_costs import gpu_or_exit
from step_timeline import with_first_statements
from time_step import WINDOW, window_means

from mnist_cuda import cuda
from mnist_cuda.cli import (
    Parser,
    add_precision_arguments,
    batch_sizes,
    data_inputs,
    existing_dir,
    int_in_range,
    output_path,
    refuse_clashes,
    write_json,
)

PROG = "pdl_probe.py"
WAIT = ' asm volatile("griddepcontrol.wait;" ::: "memory");'
TRIGGER = ' asm volatile("griddepcontrol.launch_dependents;" ::: "memory");'
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
PROGRAMMATIC_DEPENDENCY = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


_SCALARS = {
    np.int32: ctypes.c_int32,
    np.uint32: ctypes.c_uint32,
    np.int64: ctypes.c_int64,
    np.float32: ctypes.c_float,
    np.float64: ctypes.c_double,
}


def _argument(a):
    if type(a) in _SCALARS:
        return _SCALARS[type(a)](a.item())
    return ctypes.c_void_p(a.data.ptr)  # a CuPy array (Kernel.launch checked the types)


def programmatic_launcher(cp):
    """A cuda.launch_hook that launches each kernel of the step's main stream (cuda.capture's) by cuLaunchKernelEx
    with programmatic stream serialization; the side streams' kernels (cuda.SideStream, registered from now on)
    as they are."""
    launch_ex = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    launch_ex.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    launch_ex.restype = ctypes.c_int
    attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value[0] = 1

    side_streams = set()  # every cuda.SideStream's stream: the step's branches
    make_side = cuda.SideStream.__init__

    def registered(self, cp_):
        make_side(self, cp_)
        side_streams.add(self.stream.ptr)

    cuda.SideStream.__init__ = registered

    def hook(kernel, grid, block, args, shared_mem, launch):
        if cp.cuda.get_current_stream().ptr in side_streams:  # a branch: its launches as they are
            launch()
            return
        values = [_argument(a) for a in args]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        config = _Config(
            (ctypes.c_uint * 3)(*(list(grid) + [1, 1])[:3]),
            (ctypes.c_uint * 3)(*(list(block) + [1, 1])[:3]),
            shared_mem,
            cp.cuda.get_current_stream().ptr,
            ctypes.pointer(attribute),
            1,
        )
        status = launch_ex(ctypes.byref(config), kernel.function().kernel.ptr, params, None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx of {kernel.name}: CUresult {status}")

    return hook


def first_statement(statement: str):
    """The cuda.transform_sources fn that puts statement first in every kernel's body."""
    return lambda path, text: with_first_statements(text, lambda name: statement)


# The independent prologues: (the kernels, the text where their prologue ends, that text with the wait placed).
# Before the wait a kernel may touch only what no kernel of the step writes, nor any it depends on: conv2's staged
# weights are written in the step (their staging's join into conv2's forward is a programmatic edge too), and each
# other kernel's first loads are of what the kernel before it wrote, or interleave the parameters with it in one
# copy pipeline. What is left: conv2's image tiles write the zero border of their staged image's buffers in shared
# memory. (conv1's forward is the first kernel on its stream: no programmatic edge reaches it.)
_TILE_KERNELS = (
    "conv2_forward_fast",
    "conv2_forward_tile_moments_fast",
    "conv2_forward_stacked_fast",
    "conv2_backward_input_fast",
    "conv2_backward_input_paired_fast",
)
PROLOGUES = (
    (
        _TILE_KERNELS,
        "    staging.fetch_image(0);\n    staging.fetch_weights(0);\n",
        WAIT + "\n    staging.fetch_image(0);\n    staging.fetch_weights(0);\n",
    ),
    (
        ("conv2_forward_persistent_fast",),
        "    staging.fetch_image(0);\n    staging.fetch_weights(0, 0);\n",
        WAIT + "\n    staging.fetch_image(0);\n    staging.fetch_weights(0, 0);\n",
    ),
)
PROLOGUE_KERNELS = frozenset(name for kernels, _, _ in PROLOGUES for name in kernels)


def after_prologues(trigger: bool):
    """The cuda.transform_sources fn that puts the wait where each kernel's independent prologue ends (PROLOGUES),
    first in every other kernel, and with trigger `launch_dependents` first in every kernel."""

    def transform(path, text: str) -> str:
        names = set(cuda.entry_points(text))
        first = TRIGGER if trigger else ""
        text = with_first_statements(text, lambda name: first + ("" if name in PROLOGUE_KERNELS else WAIT))
        for kernels, end, placed in PROLOGUES:
            if names.isdisjoint(kernels):
                continue
            if text.count(end) != 1:  # PROLOGUES names an end the source does not have once
                raise RuntimeError(f"{path}: the end of {kernels[0]}'s prologue is not found once")
            text = text.replace(end, placed)
        return text

    return transform


VARIANTS = {
    "plain": None,
    "wait": first_statement(WAIT),
    "wait+trigger": first_statement(WAIT + TRIGGER),
    "prologue": after_prologues(False),
    "trigger+prologue": after_prologues(True),
}


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [
        ("from_port", ctypes.c_ubyte),
        ("to_port", ctypes.c_ubyte),
        ("type", ctypes.c_ubyte),
        ("pad", ctypes.c_ubyte * 5),
    ]


def programmatic_edges(graph) -> tuple[int, int]:
    """(programmatic edges, all edges) of a captured cupy Graph: whether the launches' attribute reached it."""
    get_edges = ctypes.CDLL("libcuda.so.1").cuGraphGetEdges_v2
    get_edges.restype = ctypes.c_int
    count = ctypes.c_size_t(0)
    if get_edges(ctypes.c_void_p(graph.graph), None, None, None, ctypes.byref(count)):
        raise RuntimeError("cuGraphGetEdges_v2 failed")
    n = count.value
    starts, ends, data = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (_EdgeData * n)()
    if get_edges(ctypes.c_void_p(graph.graph), starts, ends, data, ctypes.byref(count)):
        raise RuntimeError("cuGraphGetEdges_v2 failed")
    return sum(d.type == PROGRAMMATIC_DEPENDENCY for d in data), n


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=existing_dir, default=None, help="the MNIST files (default: the cache)")
    p.add_argument("--batch-sizes", type=batch_sizes, default="64,512,4096", help="comma-separated")
    p.add_argument("--steps", type=int_in_range(WINDOW, 100_000), default=500, help="timed steps per measurement")
    p.add_argument("--repeats", type=int_in_range(1, 10), default=2, help="rounds over the variants (interleaved)")
    p.add_argument("--check-steps", type=int_in_range(1, 1000), default=30, help="steps of the byte-for-byte check")
    add_precision_arguments(p, "default: fp32")
    p.add_argument("--json", type=output_path, default=None, help="write the figures here")
    return p


def make_step(batch: int, precision: str):
    from mnist_cuda import reference
    from mnist_cuda.nets import Parameters, make_net
    from mnist_cuda.step import Step

    params = Parameters()
    params.load_state_dict(reference.init_state_dict(0))
    return params, Step(make_net(params, batch, "fast", precision), 0.05)


def measure(cp, ds, batch: int, precision: str, steps: int, check_steps: int, hook) -> tuple:
    """The median us per step (after a second of warm-up), the weights' bytes after check_steps steps and the
    step graph's (programmatic edges, edges)."""
    from mnist_cuda import data

    idxs = list(data.batch_indices(data.epoch_order(len(ds.train_x), 0, 0), batch, drop_last=True))
    idxs = idxs * (1 + (steps + check_steps + 5000) // len(idxs))
    with cuda.launch_hook(hook) if hook else contextlib.nullcontext():  # (the graph is captured on the first run)
        params, step = make_step(batch, precision)
        for i in range(check_steps):
            step.run(ds.train_x, ds.train_y, idxs[i], idxs[i + 1])
        step.synchronize()
        weights, edges = params.params.get().tobytes(), programmatic_edges(step.graphs[0])
        i, t0 = check_steps, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            step.run(ds.train_x, ds.train_y, idxs[i % len(idxs)], idxs[(i + 1) % len(idxs)])
            i += 1
        step.synchronize()
        return float(np.median(window_means(cp, step, ds, idxs, i, steps))), weights, edges


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_clashes(p, inputs=data_inputs("mnist", args.data_dir), outputs=[("--json", args.json)])
    cp = gpu_or_exit(PROG)
    from mnist_cuda import data

    ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    precision = args.precision or "fp32"
    hook = programmatic_launcher(cp)  # (before any step: it registers their side streams)
    times = {v: {b: [] for b in args.batch_sizes} for v in VARIANTS}
    same, graph_edges = {v: {} for v in VARIANTS}, {v: {} for v in VARIANTS}
    plain_weights = {}
    for _ in range(args.repeats):
        for variant, transform in VARIANTS.items():
            cuda.transform_sources(transform)
            for batch in args.batch_sizes:
                us, weights, (programmatic, edges) = measure(
                    cp, ds, batch, precision, args.steps, args.check_steps, None if transform is None else hook
                )
                times[variant][batch].append(us)
                plain_weights.setdefault(batch, weights)
                same[variant][batch] = same[variant].get(batch, True) and weights == plain_weights[batch]
                graph_edges[variant][batch] = {"programmatic": programmatic, "all": edges}
                print(
                    f"{variant:>13} batch {batch:5d}: {us:8.1f} us per step; weights as plain's: "
                    f"{same[variant][batch]}; {programmatic} of the graph's {edges} edges programmatic"
                )
    cuda.transform_sources(None)
    if args.json:
        write_json(
            args.json,
            {
                "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                "precision": precision,
                "median_us": times,
                "weights_as_plain": same,
                "graph_edges": graph_edges,
            },
        )
    return 0 if all(all(v.values()) for v in same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
