#!/usr/bin/env python3
"""What each launch of the training step costs inside the whole-step CUDA graph.

For every launch of one step (the copy of the next batch on the graph's side branch, each kernel, in
order), the step is captured again with that launch done twice, and the graph's replay time is compared
with the plain step's: the difference is the launch's cost where it sits, gaps and contention with the
other graph branches included (a kernel off the critical path costs little). Also times host-to-device
copies of a batch's size in a graph.

    PYTHONPATH=. python dev/step_launch_costs.py --batch-sizes 64,512 --out launch-costs.json

Random images and labels, the default model and the fast kernels, lr 0 (the parameters do not drift
between replays). The second launch of a kernel repeats its work on the same data, so its cost is what
that kernel takes, not what a changed kernel would take. The launches are seen through
mnist_cuda.cuda.launch_hook; the batch copy, which is no kernel, through Step.load.
"""

from __future__ import annotations

import sys

import numpy as np

from mnist_cuda import cuda, data, reference
from mnist_cuda.cli import Parser, add_precision_arguments, batch_sizes, int_in_range, output_path, write_json
from mnist_cuda.nets import Parameters, make_net
from mnist_cuda.sizes import MAX_TIMED
from mnist_cuda.step import SLOTS, Step

PROG = "step_launch_costs.py"
COPY = "load (host-to-device copy)"


class LaunchDoubler:
    """Names each launch of a step capture in order and does the one at index `double_at` twice. Kernels
    arrive through cuda.launch_hook (hook), the batch copy through RecordingStep.load (launch)."""

    def __init__(self):
        self.names, self.double_at = None, None  # names: None outside capture()

    def launch(self, name: str, launch):
        if self.names is None:
            launch()
            return
        index = len(self.names)
        self.names.append(name)
        launch()
        if index == self.double_at:
            launch()

    def hook(self, kernel, grid, block, args, shared_mem, launch):
        self.launch(kernel.name, launch)

    def capture(self, step: RecordingStep, double_at=None):
        """The step graph of slot 0 with launch number double_at done twice (None: the plain step); the
        launches' names are in self.last_names afterwards."""
        self.names, self.double_at = [], double_at
        try:
            with cuda.launch_hook(self.hook):
                return step.capture_step(0)
        finally:
            self.last_names, self.names = self.names, None


class RecordingStep(Step):
    """A Step at lr 0 whose batch loads report their host-to-device copy to a LaunchDoubler as a launch of
    its own (the copy is no kernel, so launch_hook does not see it)."""

    def __init__(self, net, doubler: LaunchDoubler):
        super().__init__(net, 0.0)
        self.doubler = doubler

    def load(self, slot: int, n: int, train: bool = True):
        calls = []

        def launch():
            if not calls:  # the copy, then the net's work on the images (launches the hook sees)
                Step.load(self, slot, n, train)
            else:  # the copy alone again: the net's kernels are launches of their own, doubled on their turn
                with cuda.launch_hook(lambda *_: None):
                    Step.load(self, slot, n, train)
            calls.append(1)

        self.doubler.launch(COPY, launch)


def replay_us(cp, graph, stream, reps: int, rounds: int = 5) -> float:
    """Median over rounds of the mean replay time of `reps` back-to-back replays."""
    for _ in range(20):
        graph.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(reps):
            graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1000 / reps)
    return float(np.median(times))


def gpu_or_exit(prog: str):
    """CuPy, or exit with status 2 and cuda.require_gpu's reason and advice (no traceback)."""
    try:
        return cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)


def fast_nets(parser, params: Parameters, sizes: list[int], precision: str) -> list:
    """The fast net at each batch size, all built before anything is measured (a usage error for a size
    the nets cannot take)."""
    try:
        return [make_net(params, batch, "fast", precision) for batch in sizes]
    except ValueError as e:
        parser.error(f"argument --batch-sizes: {e}")


def default_params() -> Parameters:
    """The default model's parameters, initialised as the trainer does for seed 0."""
    params = Parameters()
    params.load_state_dict(reference.init_state_dict(0, params.channels, params.hidden))
    return params


def random_batches(step: Step):
    """Random images and labels staged in both pinned slots and loaded into both device input buffers (the
    step graph of slot 0 computes on buffer 0 and copies the next batch, pinned slot 1, into buffer 1)."""
    rng = np.random.default_rng(0)
    for slot in range(SLOTS):
        step.stage_x[slot][...] = rng.integers(0, 256, step.stage_x[slot].shape, dtype=np.uint8)
        step.stage_y[slot][...] = rng.integers(0, data.NUM_CLASSES, step.batch_size)
    with step.stream:
        for slot in range(SLOTS):
            step.load(slot, step.batch_size)
    step.synchronize()


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", type=batch_sizes, default="64,512", help="comma-separated batch sizes")
    p.add_argument("--reps", type=int_in_range(10, MAX_TIMED), default=200, help="graph replays per timing round")
    p.add_argument("--out", type=output_path, default=None, metavar="PATH", help="write the figures as JSON here")
    add_precision_arguments(p, "default: fp32")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    cp = gpu_or_exit(PROG)
    doubler = LaunchDoubler()
    nets = fast_nets(p, default_params(), args.batch_sizes, args.precision or "fp32")
    result = {
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "precision": args.precision or "fp32",
        "batch_sizes": {},
    }
    for batch, net in zip(args.batch_sizes, nets):
        step = RecordingStep(net, doubler)
        random_batches(step)
        plain = doubler.capture(step)
        names = list(doubler.last_names)
        baseline, rows = [replay_us(cp, plain, step.stream, args.reps)], []
        for i, name in enumerate(names):
            t = replay_us(cp, doubler.capture(step, i), step.stream, args.reps)
            rows.append({"index": i, "launch": name, "doubled_us": t})
            if i % 6 == 5:  # the plain step again now and then: its drift bounds the differences' accuracy
                baseline.append(replay_us(cp, plain, step.stream, args.reps))
        baseline.append(replay_us(cp, plain, step.stream, args.reps))
        median = float(np.median(baseline))
        for r in rows:
            r["cost_us"] = r["doubled_us"] - median
        result["batch_sizes"][batch] = {"step_us": median, "step_runs_us": baseline, "launches": rows}
        print(f"batch {batch}: step {median:.1f} us (plain step's runs: {', '.join(f'{b:.1f}' for b in baseline)})")
        for r in rows:
            print(f"  {r['index']:2d} {r['launch']:44s} {r['cost_us']:+7.1f} us")

    copies, rt = {}, cp.cuda.runtime
    stream = cp.cuda.Stream(non_blocking=True)
    pixels = data.IMAGE_SIZE * data.IMAGE_SIZE
    for batch in args.batch_sizes:
        for label, nbytes in (
            ("uint8 images + labels", batch * (pixels + 4)),
            ("float32 images + labels", batch * (4 * pixels + 4)),
        ):
            host = cuda.pinned_empty((nbytes,), np.uint8)
            device = cp.empty(nbytes, cp.uint8)
            graph = cuda.capture(
                lambda: rt.memcpyAsync(
                    device.data.ptr, host.ctypes.data, nbytes, rt.memcpyHostToDevice, cp.cuda.get_current_stream().ptr
                )
            )
            copies[f"{batch}: {label}"] = {"bytes": nbytes, "us": replay_us(cp, graph, stream, args.reps)}
            print(
                f"copy of batch {batch}'s {label} ({nbytes:,} B) in a graph: {copies[f'{batch}: {label}']['us']:.2f} us"
            )
    result["copies"] = copies
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
