"""What each launch of the training step costs inside the whole-step CUDA graph.

For every launch of one step (the copy of the next batch on the graph's side branch, each kernel, in
order), the step is captured again with
that launch done twice, and the graph's replay time is compared with the plain step's: the difference
is the launch's cost where it sits, gaps and contention with the other graph branch included (a kernel
off the critical path costs little). Also times host-to-device copies of a batch's size in a graph.

    python scripts/step_launch_costs.py --batch-sizes 64,512 --out launch-costs.json

Random images and labels, the default model, lr 0 (the parameters do not drift between replays).
The second launch of a kernel repeats its work on the same data, so its cost is what that kernel takes,
not what a changed kernel would take.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mnist_cuda import kernels, reference  # noqa: E402
from mnist_cuda import model as model_module  # noqa: E402
from mnist_cuda.train import int_at_least  # noqa: E402


class DoublingLaunches:
    """Wraps kernels.launch (every kernel launch goes through it: model.py's, launch_1d's and the launch
    helpers' in kernels.py) and Model.load: records each launch's name in step order and repeats the
    launch whose index is `double_at`."""

    def __init__(self):
        self.names, self.double_at = [], None
        self._launch, self._load = kernels.launch, model_module.Model.load
        kernels.launch = model_module.launch = self._wrap(self._launch)
        load = self._wrap(lambda name, *a: self._load(*a))
        model_module.Model.load = lambda model, ws, slot, n: load("load (host-to-device copy)", model, ws, slot, n)

    def _wrap(self, fn):
        def wrapped(name, *args, **kw):
            index = len(self.names)
            self.names.append(name)
            fn(name, *args, **kw)
            if index == self.double_at:
                fn(name, *args, **kw)
        return wrapped

    def capture(self, model, ws, double_at=None):
        self.names, self.double_at = [], double_at
        return model.capture_train_step(ws, 0, 0.0)


def replay_us(cp, graph, stream, reps, rounds=5):
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


def parse_batch_sizes(p: argparse.ArgumentParser, text: str) -> list[int]:
    """--batch-sizes as integers (a usage error, exit 2, if they are not positive integers)."""
    try:
        batch_sizes = [int(b) for b in text.split(",")]
        if min(batch_sizes) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--batch-sizes: expected positive integers separated by commas, got {text!r}")
    return batch_sizes


def gpu_or_exit():
    """CuPy, or exit with the reason and the advice (no traceback) where there is no usable GPU."""
    try:
        return kernels.require_gpu()
    except kernels.GPUUnavailable as e:
        sys.exit(f"error: {e}")


def random_batches(model, batch: int, stream):
    """The model's workspace for `batch` with random images and labels staged and loaded in both slots
    (the step graph computes on device buffer 0 and copies the next batch into buffer 1)."""
    ws = model.workspace(batch)
    rng = np.random.default_rng(0)
    for slot in range(ws.STAGING_SLOTS):
        ws.stage_x[slot][...] = rng.integers(0, 256, ws.stage_x[slot].shape, dtype=np.uint8)
        ws.stage_y[slot][...] = rng.integers(0, 10, batch)
    with stream:
        for slot in range(ws.STAGING_SLOTS):
            model.load(ws, slot, batch)
    stream.synchronize()
    return ws


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-sizes", default="64,512", help="comma-separated")
    p.add_argument("--reps", type=int_at_least(10), default=200, help="replays per timing round")
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--tf32", action="store_true", help="conv2's products in plain TF32 (train --tf32)")
    args = p.parse_args(argv)
    batch_sizes, cp = parse_batch_sizes(p, args.batch_sizes), gpu_or_exit()

    doubling = DoublingLaunches()
    model = model_module.Model(kernels_version="fast", tf32=args.tf32)
    model.load_state_dict(reference.init_state_dict(0, model.channels, model.hidden))
    kernels.preload()
    stream = cp.cuda.Stream(non_blocking=True)
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "batch_sizes": {}}
    for batch in batch_sizes:
        ws = random_batches(model, batch, stream)
        plain = doubling.capture(model, ws)
        names = list(doubling.names)
        baseline, rows = [replay_us(cp, plain, stream, args.reps)], []
        for i, name in enumerate(names):
            t = replay_us(cp, doubling.capture(model, ws, i), stream, args.reps)
            rows.append({"index": i, "launch": name, "doubled_us": t})
            if i % 6 == 5:  # the plain step again now and then: its drift bounds the differences' accuracy
                baseline.append(replay_us(cp, plain, stream, args.reps))
        baseline.append(replay_us(cp, plain, stream, args.reps))
        step = float(np.median(baseline))
        for r in rows:
            r["cost_us"] = r["doubled_us"] - step
        result["batch_sizes"][batch] = {"step_us": step, "step_runs_us": baseline, "launches": rows}
        print(f"batch {batch}: step {step:.1f} us (plain step's runs: {', '.join(f'{b:.1f}' for b in baseline)})")
        for r in rows:
            print(f"  {r['index']:2d} {r['launch']:34s} {r['cost_us']:+7.1f} us")

    copies, rt = {}, cp.cuda.runtime
    for batch in batch_sizes:
        for label, nbytes in (("uint8 images + labels", batch * 788), ("float32 images + labels", batch * 3140)):
            host = kernels.pinned_empty((nbytes,), np.uint8)
            device = cp.empty(nbytes, cp.uint8)
            with stream:
                stream.begin_capture()
                rt.memcpyAsync(device.data.ptr, host.ctypes.data, nbytes, rt.memcpyHostToDevice, stream.ptr)
                graph = stream.end_capture()
            copies[f"{batch}: {label}"] = {"bytes": nbytes, "us": replay_us(cp, graph, stream, args.reps)}
            print(f"copy of batch {batch}'s {label} ({nbytes:,} B) in a graph: "
                  f"{copies[f'{batch}: {label}']['us']:.2f} us")
    result["copies"] = copies
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"result: {args.out}")


if __name__ == "__main__":
    main()
