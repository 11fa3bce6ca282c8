#!/usr/bin/env python3
"""Train several (batch size, learning rate) settings for several seeds on the GPU and report the mean
test accuracy after every epoch: how train.py's defaults were chosen.

    python scripts/sweep_hparams.py --configs 64:0.05,32:0.02 --epochs 15 --seeds 0,1,2 --json sweep.json

Plain SGD as design.md fixes it; each run is the same code path as `python -m mnist_cuda.train`
(CUDA graph per step, the chosen --kernels), so a setting reproduces bit for bit there.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mnist_cuda import data, kernels, reference, train  # noqa: E402


def parse_configs(text):
    try:
        out = [(int(b), float(lr)) for b, lr in (c.split(":") for c in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCH:LR pairs like 64:0.05,32:0.02, got {text!r}") from None
    if not out or any(b < 1 or not lr > 0 for b, lr in out):
        raise argparse.ArgumentTypeError("batch sizes must be >= 1 and learning rates > 0")
    return out


def run(ds, batch, lr, seed, epochs, version):
    from mnist_cuda.model import Model
    model = Model((32, 64), 128, version)
    model.load_state_dict(reference.init_state_dict(seed))
    ws = model.workspace(batch)
    trainer = train.Trainer(model, ws, lr)
    accuracies = []
    for epoch in range(epochs):
        order = data.epoch_order(len(ds.train_x), seed, epoch)
        batches = list(data.batch_indices(order, batch, drop_last=True))
        for idx, next_idx in data.with_next(batches):
            trainer.run_step(ds.train_x, ds.train_y, idx, next_idx)
        ws.losses(reset=True)
        accuracies.append(train.evaluate(model, ws, ds.test_x, ds.test_y))
    return accuracies


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=parse_configs, default=parse_configs("64:0.05"))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default="mnist")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--kernels", choices=train.KERNEL_VERSIONS, default="fast")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        kernels.require_gpu()
        ds = data.load(args.dataset, args.data_dir, empty=kernels.pinned_empty, progress=False)
    except (kernels.GPUUnavailable, data.DataError) as e:
        print(f"sweep_hparams.py: {e}", file=sys.stderr)
        return 2
    results = []
    for batch, lr in args.configs:
        t0 = time.perf_counter()
        acc = np.array([run(ds, batch, lr, s, args.epochs, args.kernels) for s in seeds])  # [seeds, epochs]
        mean = acc.mean(axis=0)
        best = int(mean.argmax())
        results.append({"batch": batch, "lr": lr, "seeds": seeds, "accuracy": acc.tolist()})
        print(f"batch {batch:4d} lr {lr:<6g} mean test accuracy by epoch: "
              + " ".join(f"{100 * a:.2f}" for a in mean)
              + f" | best {100 * mean[best]:.2f}% at epoch {best + 1} | {time.perf_counter() - t0:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"dataset": args.dataset, "kernels": args.kernels, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
