#!/usr/bin/env python3
"""Search the recipes of `python -m mnist_cuda.train --recipe fast|best` on the GPU, 5 seeds each.

    python scripts/sweep_recipes.py --data-dir data/mnist --json benchmarks/results/recipes-h200.json

Each candidate is a batch size, a learning rate, SGD's options, a schedule, the augmentation's shift (the
trainer's --augment) and a number of epochs; it trains
through the trainer's own pieces (training.plan and training.run_chunk: a CUDA graph per step, the trainer's
shuffling and initialisation) for seeds 0-4 and evaluates the test set after every epoch. The training
time of an epoch is the trainer's (wall clock from its first step's launch to the end of its last step,
the step graph's capture in the first epoch included); evaluation is timed apart and not counted.

    fast   the candidate whose every seed reaches TARGET accuracy, with the fewest mean seconds of
           training to the first epoch that reaches it
    best   the candidate with the highest mean test accuracy after its last epoch (at most 20 epochs)
"""

from __future__ import annotations

import sys
import time

import numpy as np

from mnist_cuda import cuda, data, optim, reference
from mnist_cuda.cli import Parser, data_inputs, existing_dir, output_path, refuse_clashes, write_json
from mnist_cuda.nets import Parameters, make_net
from mnist_cuda.step import Step
from mnist_cuda.training import DEFAULTS, Position, TrainingDiverged, plan, run_chunk

PROG = "sweep_recipes.py"
SEEDS = (0, 1, 2, 3, 4)
TARGET = 0.99
NESTEROV = {"momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}

# (name, batch, lr, options, epochs): the one-cycle schedule warms up and anneals within the run's steps
FAST = [
    (f"fast-b{b}-lr{lr}-e{e}", b, lr, {**NESTEROV, "schedule": "onecycle"}, e)
    for b, lrs, epochs in (
        (96, (0.05, 0.1), (2, 3)),
        (128, (0.05, 0.1, 0.15), (2, 3, 4)),
        (192, (0.1, 0.15), (3, 4)),
        (256, (0.1, 0.2), (3, 4)),
    )
    for lr in lrs
    for e in epochs
]
BEST = [
    (f"best-b{b}-lr{lr}-{s}-e{e}" + (f"-shift{a}" if a else ""), b, lr, {**NESTEROV, "schedule": s, "augment": a}, e)
    for b, lr, s, e, a in (
        (128, 0.1, "onecycle", 20, 0),
        (128, 0.05, "cosine", 20, 0),
        (64, 0.05, "onecycle", 20, 0),
        (256, 0.2, "onecycle", 20, 0),
        (64, 0.05, "onecycle", 20, 1),
        (64, 0.05, "onecycle", 20, 2),
        (128, 0.1, "onecycle", 20, 2),
    )
]


def run(ds, batch, lr, options: dict, epochs: int, seed: int) -> dict:
    """Accuracy and training seconds after each epoch of one run, as the trainer trains it."""
    params = Parameters(DEFAULTS["channels"], DEFAULTS["hidden"])
    params.load_state_dict(reference.init_state_dict(seed, DEFAULTS["channels"], DEFAULTS["hidden"]))
    steps = epochs * (len(ds.train_x) // batch)
    step = Step(
        make_net(params, batch, "fast"),
        optim.options_from(options, lr, steps),
        augment=options.get("augment", 0),
        seed=seed,
    )
    accuracy, seconds, eval_seconds = [], [], 0.0
    for chunk in plan(len(ds.train_x), batch, seed, True, Position(), steps):
        t0 = time.perf_counter()
        try:
            run_chunk(step, ds, chunk)
        except TrainingDiverged:
            return {
                "accuracy": accuracy + [0.0],
                "train_seconds": np.cumsum(seconds).tolist() + [None],
                "eval_seconds": eval_seconds,
                "diverged": True,
            }
        seconds.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        accuracy.append(step.evaluate(ds.test_x, ds.test_y))
        eval_seconds += time.perf_counter() - t1
    return {"accuracy": accuracy, "train_seconds": np.cumsum(seconds).tolist(), "eval_seconds": eval_seconds}


def time_to(r: dict, target: float):
    """Training seconds to the end of the first epoch at or above target, or None."""
    for acc, secs in zip(r["accuracy"], r["train_seconds"]):
        if acc >= target:
            return secs
    return None


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-dir",
        type=existing_dir,
        default=None,
        help="the MNIST files (else $MNIST_DATA_DIR, then the cache, then a download)",
    )
    p.add_argument("--which", choices=("fast", "best", "both"), default="both", help="which recipe to search")
    p.add_argument("--json", type=output_path, default=None, metavar="PATH", help="write every run's figures here")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_clashes(parser, inputs=data_inputs("mnist", args.data_dir), outputs=[("--json", args.json)])
    try:
        cuda.require_gpu()
        ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    except (cuda.GPUUnavailable, data.DataError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    run(ds, 128, 0.1, {"schedule": "onecycle"}, 1, 0)  # compile every kernel before anything is timed
    candidates = (FAST if args.which != "best" else []) + (BEST if args.which != "fast" else [])
    results = []
    for name, batch, lr, options, epochs in candidates:
        runs = [run(ds, batch, lr, options, epochs, seed) for seed in SEEDS]
        times = [time_to(r, TARGET) for r in runs]
        final = [r["accuracy"][-1] for r in runs]
        row = {
            "name": name,
            "batch_size": batch,
            "lr": lr,
            "options": options,
            "epochs": epochs,
            "seeds": list(SEEDS),
            "runs": runs,
            "time_to_target": times,
            "all_reach_target": all(t is not None for t in times),
            "mean_final_accuracy": float(np.mean(final)),
        }
        if row["all_reach_target"]:
            row["mean_time_to_target"] = float(np.mean(times))
        results.append(row)
        print(
            f"{name:28s} final {' '.join(f'{100 * a:.2f}' for a in final)} (mean {100 * np.mean(final):.3f})  "
            f"to {100 * TARGET:.1f}%: "
            + (
                f"{row['mean_time_to_target']:.3f} s"
                if row["all_reach_target"]
                else f"{sum(t is not None for t in times)} of {len(SEEDS)} seeds"
            ),
            flush=True,
        )
    reaching = [r for r in results if r["all_reach_target"] and r["name"].startswith("fast")]
    best = [r for r in results if r["name"].startswith("best")]
    chosen = {}
    if reaching:
        chosen["fast"] = min(reaching, key=lambda r: r["mean_time_to_target"])["name"]
    if best:
        chosen["best"] = max(best, key=lambda r: r["mean_final_accuracy"])["name"]
    print("chosen: " + ", ".join(f"{k} = {v}" for k, v in chosen.items()))
    if args.json:
        write_json(
            args.json,
            {
                "device": cuda.require_gpu().cuda.runtime.getDeviceProperties(0)["name"].decode(),
                "target": TARGET,
                "chosen": chosen,
                "candidates": results,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
