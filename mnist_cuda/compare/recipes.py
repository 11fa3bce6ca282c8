"""train's --recipe on both sides: the same initial weights, the same batches (training.plan), the same
optimizer and schedule, the images shifted by the same offsets where the recipe augments.

PyTorch runs in each mode asked for: eager and compiled with torch's scheduler stepped on the host, and as
one captured whole-step graph (graph, compiled+graph, ...) with the rate on the device, filled inside the
graph from a table of the scheduler's own rates (compare.torch_side): PyTorch's fastest way to run a
schedule. Every mode is compiled and captured once, before anything is timed, and restarted per seed.
"""

from __future__ import annotations

import time
from argparse import ArgumentTypeError

import numpy as np

from .. import data, optim, reference
from .candidates import BY_NAME
from .timing import speed_defaults

RECIPE_SEEDS = (0, 1, 2, 3, 4)
RECIPE_TORCH_MODES = ("eager", "compiled", "graph", "compiled+graph", "compiled+graph, channels_last")


def recipe_modes(text: str) -> tuple:
    """Candidate names, comma-separated; a ", channels_last" belongs to the name before it (the candidates'
    own names carry it)."""
    modes = []
    for part in (m.strip() for m in text.split(",")):
        if part == "channels_last" and modes:
            modes[-1] += ", channels_last"
        else:
            modes.append(part)
    bad = [m for m in modes if m not in BY_NAME]
    if bad or not modes or len(set(modes)) != len(modes):
        raise ArgumentTypeError(f"want distinct PyTorch modes of {'; '.join(BY_NAME)}, got {text!r}")
    return tuple(modes)


MAX_RECIPE_SEEDS = 100  # each seed trains the recipe on both sides in every mode


def recipe_seeds(text: str) -> tuple:
    """Seeds as a comma-separated list or a range A-B: distinct, 0 to 2^32 - 1, at most MAX_RECIPE_SEEDS."""
    try:
        if "-" in text:
            low, high = (int(v) for v in text.split("-"))
            count = high - low + 1
        else:
            values = [int(v) for v in text.split(",")]
            low, high, count = min(values), max(values), len(values)
    except ValueError:
        low = high = count = None
    if count is None or count < 1 or low < 0 or high >= 2**32 or count > MAX_RECIPE_SEEDS:
        raise ArgumentTypeError(
            f"want 1 to {MAX_RECIPE_SEEDS} distinct seeds from 0 to 4294967295 as A,B,C or A-B, got {text[:40]!r}"
        )
    seeds = tuple(range(low, high + 1)) if "-" in text else tuple(values)
    if len(set(seeds)) != len(seeds):
        raise ArgumentTypeError(f"want distinct seeds, got {text[:40]!r}")
    return seeds


def run_recipe(torch, ds, args, channels, hidden, log) -> dict:
    """The recipe for each seed of args.recipe_seeds on our side and on PyTorch's in each of
    args.recipe_torch_modes: training seconds to the end of the first epoch that reaches the recipe's target
    accuracy, or of every epoch for a recipe without a target (best); the test accuracy of each epoch;
    evaluation is not counted."""
    from ..nets import Parameters, make_net
    from ..step import Step
    from ..training import RECIPES, Position, plan, run_chunk
    from .torch_side import TorchSide

    flags = RECIPES[args.recipe]
    target = flags["target_accuracy"] / 100 if "target_accuracy" in flags else None
    batch, augment = flags["batch_size"], flags.get("augment", 0)
    steps = flags["epochs"] * (len(ds.train_x) // batch)
    options = optim.options_from(flags, flags["lr"], steps)
    speed_defaults(torch)
    sides = {}
    warm = list(data.batch_indices(np.arange(len(ds.train_x)), batch, drop_last=True))[:30]
    for mode in _build_order(args.recipe_torch_modes):
        log(f"recipe {args.recipe}: PyTorch {mode}, compiling and capturing")
        side = TorchSide(
            torch,
            reference.init_state_dict(0, channels, hidden),
            batch,
            BY_NAME[mode],
            channels,
            hidden,
            options,
            augment=augment,
        )
        side.prepare(ds.train_x, ds.train_y64, np.arange(len(ds.train_x)))
        for idx in warm:  # (and let cuDNN choose) before anything is timed
            side.step(ds.train_x, ds.train_y64, idx)
        side.synchronize()
        sides[mode] = side
    sides = {mode: sides[mode] for mode in args.recipe_torch_modes}  # (the order asked for, in the tables)
    out = {"recipe": args.recipe, "dataset": args.dataset, "flags": flags, "target": target, "seeds": {}}
    for run_seed in args.recipe_seeds:
        state = reference.init_state_dict(run_seed, channels, hidden)
        chunks = plan(len(ds.train_x), batch, run_seed, True, Position(), steps)
        params = Parameters(channels, hidden)
        params.load_state_dict(state)
        ours = Step(make_net(params, batch, "fast"), options, augment=augment, seed=run_seed)
        row = {
            "ours": _time_to_target(
                chunks,
                target,
                lambda c: run_chunk(ours, ds, c),
                ours.synchronize,
                lambda: ours.evaluate(ds.test_x, ds.test_y),
            )
        }
        for mode, side in sides.items():
            side.restart(state, options, run_seed)
            side.watch_recompiles()  # (over this side's steps alone: TorchDynamo's counters are the process's)
            run = lambda c, side=side: [side.step(ds.train_x, ds.train_y64, idx) for idx in c.batches]
            row[f"torch {mode}"] = _time_to_target(
                chunks, target, run, side.synchronize, lambda side=side: side.accuracy(ds.test_x, ds.test_y)
            )
            side.check_no_recompile("the recipe's steps")
        out["seeds"][str(run_seed)] = row
        log(f"recipe {args.recipe}, seed {run_seed}: {recipe_seed_line(row, target)}")
    return out


def _build_order(modes) -> list:
    """The modes in the order their sides are built: a compiled mode without a graph calls TorchDynamo's
    compiled code at every step, so it is built last, after every other side's torch._dynamo.reset()."""
    return sorted(modes, key=lambda m: BY_NAME[m].compiled and not BY_NAME[m].graph)


def _time_to_target(chunks, target, run, synchronize, accuracy) -> dict:
    seconds, accuracies, reached = 0.0, [], None
    for chunk in chunks:
        synchronize()
        t0 = time.perf_counter()
        run(chunk)
        synchronize()
        seconds += time.perf_counter() - t0
        accuracies.append(accuracy())
        if target is not None and accuracies[-1] >= target:
            reached = seconds
            break
    return {"accuracy": accuracies, "seconds_to_target": reached, "seconds": seconds}


def recipe_seed_line(row: dict, target) -> str:
    """One seed's sides in a line: the final accuracy and the training seconds, to the target where there
    is one (saying so where a side missed it)."""

    def side(name, v):
        if target is None:
            seconds = f"in {v['seconds']:.3f} s"
        elif v["seconds_to_target"] is None:
            seconds = f"did not reach {100 * target:.1f}% in {v['seconds']:.3f} s"
        else:
            seconds = f"reached {100 * target:.1f}% in {v['seconds_to_target']:.3f} s"
        return f"{name} {100 * v['accuracy'][-1]:.2f}% {seconds}"

    return ", ".join(side(name, v) for name, v in row.items())


def format_recipe(result: dict) -> str:
    """Per side, each seed's training seconds and final test accuracy: to the target where the recipe has
    one, else over all its epochs with the mean accuracy."""
    sides = list(next(iter(result["seeds"].values())))
    seeds = ", ".join(result["seeds"])
    dataset = f" on {result['dataset']}" if result.get("dataset", "mnist") != "mnist" else ""
    if result["target"] is not None:
        lines = [
            f"--recipe {result['recipe']}{dataset}: training seconds to {100 * result['target']:.1f}% test "
            f"accuracy (evaluation not counted), seeds {seeds}"
        ]
    else:
        lines = [
            f"--recipe {result['recipe']}{dataset}: test accuracy after {result['flags']['epochs']} epochs and "
            f"the training seconds (evaluation not counted), seeds {seeds}"
        ]
    width = max(16, *(len(s) for s in sides))
    for side in sides:
        runs = [r[side] for r in result["seeds"].values()]
        accuracy = "accuracy " + " ".join(f"{100 * r['accuracy'][-1]:.2f}" for r in runs)
        if result["target"] is None:
            seconds = [r["seconds"] for r in runs]
            lines.append(
                f"  {side:{width}s} {accuracy} (mean {100 * np.mean([r['accuracy'][-1] for r in runs]):.2f}%); "
                "seconds " + " ".join(f"{t:.2f}" for t in seconds) + f" (mean {np.mean(seconds):.2f} s)"
            )
            continue
        times = [r["seconds_to_target"] for r in runs]
        mean = f"mean {np.mean(times):.3f} s" if all(t is not None for t in times) else "not every seed reached it"
        lines.append(
            f"  {side:{width}s} "
            + " ".join(f"{t:.3f}" if t is not None else "-" for t in times)
            + f"  ({mean}); "
            + accuracy
        )
    return "\n".join(lines)
