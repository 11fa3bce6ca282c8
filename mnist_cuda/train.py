"""Train the MNIST CNN on the GPU with our kernels:  python -m mnist_cuda.train [--help]

Every step (load, forward, loss, backward, SGD update, zero-grad) runs our CUDA kernels; by default the
whole step is one CUDA graph replayed per batch. Every PHASE_SAMPLE_EVERY-th step runs the same kernels
launched one by one with CUDA events between the phases, which gives the per-phase times of the summary.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from . import checkpoint, cuda, data, reference
from .nets import KERNEL_VERSIONS

PHASE_SAMPLE_EVERY = 50
LOG_EVERY = 100  # read the loss log (one sync) this often for the progress bar and the NaN check

# batch size and learning rate as scripts/sweep_hparams.py chose them (README, Results)
DEFAULTS = dict(dataset="mnist", epochs=10, batch_size=64, lr=0.05, seed=0, channels="32,64", hidden=128)


class TrainingDiverged(Exception):
    pass


def int_at_least(minimum):
    """An argparse type: a whole number >= minimum (the error names the flag via argparse)."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {v}")
        return v
    return parse


def learning_rate(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return v


def _channels(text):
    parts = text.split(",")
    try:
        c = tuple(int(p) for p in parts)
    except ValueError:
        c = ()
    if len(c) != 2 or min(c) < 1:
        raise argparse.ArgumentTypeError(f"expected two positive whole numbers C1,C2 (e.g. 32,64), got {text!r}")
    return c


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = argparse.ArgumentParser(
        prog="python -m mnist_cuda.train",
        description="Train the MNIST CNN (conv-bn-relu-pool x2, fc-relu-fc, log-softmax/NLL, plain "
                    "SGD) on the GPU with hand-written CUDA kernels.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default=d["dataset"])
    p.add_argument("--data-dir", type=Path, default=None,
                   help="directory holding the IDX files (else $MNIST_DATA_DIR, then ./data, then download)")
    p.add_argument("--epochs", type=int_at_least(1), default=d["epochs"])
    p.add_argument("--batch-size", type=int_at_least(1), default=d["batch_size"])
    p.add_argument("--lr", type=learning_rate, default=d["lr"], help="SGD learning rate")
    p.add_argument("--seed", type=int, default=d["seed"], help="seeds initialisation and shuffling")
    p.add_argument("--channels", type=_channels, default=_channels(d["channels"]), metavar="C1,C2",
                   help="output channels of conv1 and conv2")
    p.add_argument("--hidden", type=int_at_least(1), default=d["hidden"], help="fc1 width")
    p.add_argument("--save", type=Path, default=None, metavar="PATH",
                   help="write a checkpoint (.npz) here after every epoch and at the end")
    p.add_argument("--init", type=Path, default=None, metavar="PATH", help="start from this checkpoint")
    p.add_argument("--no-shuffle", action="store_true", help="visit the training set in file order")
    p.add_argument("--steps", type=int_at_least(0), default=None, metavar="N",
                   help="stop after N steps in all (0: only write the initial checkpoint to --save)")
    p.add_argument("--metrics", type=Path, default=None, metavar="PATH",
                   help="JSON lines: every step's loss, every epoch's test accuracy")
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default="fast",
                   help="kernel version: the readable one-thread-per-output kernels, or the fused tiled ones")
    p.add_argument("--tf32", action="store_true",
                   help="conv2's products in plain TF32, as PyTorch's cuDNN convolutions by default (faster; "
                        "~3e-4 relative error instead of fp32's ~1e-6; fast kernels only)")
    p.add_argument("--eager", action="store_true",
                   help="launch the kernels one by one instead of replaying a CUDA graph of the step")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def initial_state(args, parser):
    """The starting state_dict: --init (checked against the model's shapes) or a seeded init."""
    spec = reference.state_dict_spec(args.channels, args.hidden)
    if args.init is None:
        return reference.init_state_dict(args.seed, args.channels, args.hidden), {}
    try:
        return checkpoint.load_checkpoint(args.init, spec)
    except checkpoint.CheckpointError as e:
        parser.error(f"argument --init: {e} (model: --channels {args.channels[0]},{args.channels[1]} "
                     f"--hidden {args.hidden})")


def train(args, parser) -> int:
    if args.tf32 and args.kernels != "fast":
        parser.error("argument --tf32: needs --kernels fast (the naive kernels compute in plain fp32)")
    state, init_meta = initial_state(args, parser)
    meta = {"dataset": args.dataset, "channels": list(args.channels), "hidden": args.hidden,
            "seed": args.seed, "lr": args.lr, "batch_size": args.batch_size, "kernels": args.kernels,
            "tf32": args.tf32}
    if args.steps == 0:
        if args.save is None:
            parser.error("argument --steps: 0 only writes the initial checkpoint, so it needs --save")
        checkpoint.save_checkpoint(args.save, state, {**meta, "step": int(init_meta.get("step", 0))})
        print(f"wrote the initial checkpoint to {args.save}")
        return 0

    try:
        cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"mnist_cuda.train: {e}", file=sys.stderr)
        return 2
    from .nets import Parameters, make_net
    from .step import PHASES, Step, phase_times_ms

    try:
        ds = data.load(args.dataset, args.data_dir, empty=cuda.pinned_empty, progress=not args.quiet)
    except data.DataError as e:
        print(f"mnist_cuda.train: {e}", file=sys.stderr)
        return 1

    params = Parameters(args.channels, args.hidden)
    cp = params.cp
    params.load_state_dict(state)
    step = Step(make_net(params, args.batch_size, args.kernels, args.tf32), args.lr,
                mode="eager" if args.eager else "graph")
    phase_events = []  # one list of len(PHASES) + 1 events per sampled step
    start_step = int(init_meta.get("step", 0))
    steps_per_epoch = len(ds.train_x) // args.batch_size
    if steps_per_epoch == 0:
        parser.error(f"argument --batch-size: {args.batch_size} is larger than the training set")
    total_steps = args.epochs * steps_per_epoch if args.steps is None else args.steps
    epochs = math.ceil(total_steps / steps_per_epoch)
    metrics = open(args.metrics, "w") if args.metrics else None
    from tqdm import tqdm

    train_seconds, accuracy, done = 0.0, float("nan"), 0
    try:
        for epoch in range(1, epochs + 1):
            order = data.epoch_order(len(ds.train_x), args.seed, epoch - 1, shuffle=not args.no_shuffle)
            steps = min(steps_per_epoch, total_steps - done)
            step.losses(reset=True)
            bar = tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", unit="step", disable=args.quiet,
                       leave=True, dynamic_ncols=True)
            t0 = time.perf_counter()
            losses = np.zeros(0, np.float32)
            batches = list(data.batch_indices(order, args.batch_size, drop_last=True))[:steps]
            for i, (idx, next_idx) in enumerate(data.with_next(batches)):
                events = None
                if step.count % PHASE_SAMPLE_EVERY == 0:  # this step eagerly, with events between its phases
                    events = [cp.cuda.Event() for _ in range(len(PHASES) + 1)]
                    phase_events.append(events)
                step.run(ds.train_x, ds.train_y, idx, next_idx, mode="eager" if events else None, events=events)
                if (i + 1) % LOG_EVERY == 0 or i + 1 == steps:
                    losses = step.losses()
                    _check_finite(losses, start_step + done)
                    elapsed = time.perf_counter() - t0
                    bar.set_postfix(loss=f"{losses[-1]:.4f}", img_s=f"{(i + 1) * args.batch_size / elapsed:,.0f}")
                    bar.update(i + 1 - bar.n)
            step.synchronize()
            epoch_seconds = time.perf_counter() - t0
            train_seconds += epoch_seconds
            bar.close()
            if metrics:
                for j, v in enumerate(losses):
                    metrics.write(json.dumps({"step": start_step + done + j + 1, "epoch": epoch,
                                              "loss": float(v)}) + "\n")
            done += steps
            accuracy = step.evaluate(ds.test_x, ds.test_y)
            print(f"epoch {epoch}: test accuracy {accuracy * 100:.2f}%  loss {losses[-1]:.4f}  "
                  f"{steps * args.batch_size / epoch_seconds:,.0f} img/s")
            if metrics:
                metrics.write(json.dumps({"step": start_step + done, "epoch": epoch,
                                          "test_accuracy": accuracy}) + "\n")
                metrics.flush()
            if args.save:
                checkpoint.save_checkpoint(args.save, params.state_dict(),
                                           {**meta, "step": start_step + done, "epoch": epoch,
                                            "test_accuracy": accuracy})
    except TrainingDiverged as e:
        print(f"mnist_cuda.train: {e}; stopping."
              + (f" The last good checkpoint in {args.save} was left as it was." if args.save else ""),
              file=sys.stderr)
        return 1
    finally:
        if metrics:
            metrics.close()

    times = phase_times_ms(phase_events)
    phases = dict(zip(PHASES, times.mean(axis=0).tolist())) if len(times) else {}
    print(f"\ntest accuracy {accuracy * 100:.2f}% after {done} steps ({args.dataset}, batch {args.batch_size}, "
          f"lr {args.lr}, seed {args.seed}{', conv2 in TF32' if args.tf32 else ''})")
    print(f"training wall time {train_seconds:.2f} s, {done * args.batch_size / train_seconds:,.0f} img/s "
          f"({'eager launches' if args.eager else 'CUDA graph per step'})")
    if phases:
        print(f"per-phase mean, {len(phase_events)} sampled steps, eager launches with CUDA events: "
              + ", ".join(f"{k} {v * 1000:.1f} us" for k, v in phases.items())
              + (" (fast kernels: zero-grad is fused into the update)" if args.kernels == "fast" else ""))
    if args.save:
        print(f"checkpoint: {args.save}")
    return 0


def _check_finite(losses, steps_before):
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        raise TrainingDiverged(f"the loss became {losses[bad[0]]} at step {steps_before + int(bad[0]) + 1}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return train(args, parser)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
