#!/usr/bin/env python3
"""Train several (batch size, learning rate) settings for several seeds on the GPU and report the mean
test accuracy after every epoch: how train.py's defaults were chosen.

    python scripts/sweep_hparams.py --configs 64:0.05,32:0.02 --epochs 15 --seeds 0,1,2 --json sweep.json

Plain SGD as docs/design.md fixes it. Each run trains through the trainer's own pieces (mnist_cuda.step.Step
with a CUDA graph per step, the chosen --kernels, the trainer's shuffling and initialisation, Step.evaluate
on the test set after every epoch), so a setting reproduces bit for bit with `python -m mnist_cuda.train`.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from mnist_cuda import cuda, data, reference, sizes
from mnist_cuda.cli import (
    Parser,
    data_inputs,
    existing_dir,
    fail_on,
    fits_gpu_or_exit,
    int_in_range,
    learning_rate,
    output_path,
    refuse_clashes,
    seed,
    shorten,
    write_json,
)
from mnist_cuda.nets import KERNEL_VERSIONS, Parameters, make_net
from mnist_cuda.step import Step
from mnist_cuda.training import DEFAULTS, Position, plan, run_chunk

PROG = "sweep_hparams.py"
D = DEFAULTS
CHANNELS, HIDDEN = D["channels"], D["hidden"]  # the trainer's default model


def parse_configs(text):
    """BATCH:LR pairs, each checked as the trainer checks --batch-size and --lr."""
    try:
        pairs = [c.split(":") for c in text.split(",")]
        return [(int_in_range(1, sizes.MAX_BATCH)(b), learning_rate(lr)) for b, lr in pairs]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected BATCH:LR pairs like 64:0.05,32:0.02, got {shorten(text)!r}"
        ) from None
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{shorten(text)!r}: {e}") from None


def parse_seeds(text):
    try:
        return [seed(s) for s in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{shorten(text)!r}: {e}") from None


def run(ds, batch, lr, seed, epochs, version) -> list[float]:
    """Test accuracy after each epoch of one training run, as `python -m mnist_cuda.train --batch-size
    batch --lr lr --seed seed --kernels version` trains it."""
    params = Parameters(CHANNELS, HIDDEN)
    params.load_state_dict(reference.init_state_dict(seed, CHANNELS, HIDDEN))
    step = Step(make_net(params, batch, version), lr)
    steps_per_epoch = len(ds.train_x) // batch
    accuracies = []
    for chunk in plan(len(ds.train_x), batch, seed, True, Position(), epochs * steps_per_epoch):
        run_chunk(step, ds, chunk)
        accuracies.append(step.evaluate(ds.test_x, ds.test_y))
    return accuracies


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        type=parse_configs,
        default=f"{D['batch_size']}:{D['lr']}",
        metavar="B:LR,...",
        help="comma-separated BATCH:LR settings to train",
    )
    p.add_argument("--epochs", type=int_in_range(1, sizes.MAX_STEPS), default=D["epochs"], help="epochs per run")
    p.add_argument(
        "--seeds",
        type=parse_seeds,
        default="0,1,2",
        metavar="S,...",
        help="comma-separated seeds: one run of each setting per seed (initialisation and shuffling)",
    )
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default=D["dataset"], help="dataset to train on")
    p.add_argument(
        "--data-dir",
        type=existing_dir,
        default=None,
        help="directory holding the IDX files (else $MNIST_DATA_DIR, then ./data, then download)",
    )
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default="fast", help="kernel version")
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="also write the accuracies here")
    return p


def check(p: Parser, args) -> None:
    """Every setting checked before any work: a usage error now, not after the other settings' runs."""
    train_samples = data.TRAIN_SAMPLES[args.dataset]
    for batch, _ in args.configs:
        if batch > train_samples:
            p.fail("--configs", f"batch size {batch} is larger than the training set ({train_samples})")
        fail_on(p, sizes.batch_problem(CHANNELS, HIDDEN, batch, "--configs", (args.kernels,)))
        fail_on(p, sizes.steps_problem(0, args.epochs * (train_samples // batch), "--epochs", train_samples // batch))
    refuse_clashes(p, inputs=data_inputs(args.dataset, args.data_dir), outputs=[("--json", args.json)])


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    check(p, args)
    try:
        cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    for batch, _ in args.configs:
        fits_gpu_or_exit(p, CHANNELS, HIDDEN, batch, args.kernels, "fp32", batch_flag="--configs")
    try:
        ds = data.load(args.dataset, args.data_dir, empty=cuda.pinned_empty, progress=False)
    except data.DataError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    results = []
    for batch, lr in args.configs:
        t0 = time.perf_counter()
        acc = np.array([run(ds, batch, lr, s, args.epochs, args.kernels) for s in args.seeds])  # [seeds, epochs]
        mean = acc.mean(axis=0)
        best = int(mean.argmax())
        results.append({"batch": batch, "lr": lr, "seeds": args.seeds, "accuracy": acc.tolist()})
        print(
            f"batch {batch:4d} lr {lr:<6g} mean test accuracy by epoch: "
            + " ".join(f"{100 * a:.2f}" for a in mean)
            + f" | best {100 * mean[best]:.2f}% at epoch {best + 1} | {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    if args.json:
        write_json(args.json, {"dataset": args.dataset, "kernels": args.kernels, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
