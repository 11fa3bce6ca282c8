"""Training curves: the loss per step and the test accuracy per epoch, from the trainer's metrics.

    python -m mnist_cuda.curves run.jsonl --out run.png      (or the trainer's own --plot PNG)

The metrics are the JSON lines `python -m mnist_cuda.train --metrics` writes: {"step", "epoch", "loss"} per
step and {"step", "epoch", "test_accuracy"} per epoch, each with "model" and "group" in a run of several
models (drawn a curve per model, a colour per group). A run continued with --init appends to the same file,
so one file draws the whole run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import warnings
from array import array
from pathlib import Path

import numpy as np

from . import cli

SMOOTH_STEPS = 50  # the loss of one batch is noisy; the curve also shows its running mean over this many
# host memory a drawn step takes at most: its step and loss as float64 while they are read, and matplotlib's
# copies of the points as it draws the line and the running mean
BYTES_PER_POINT = 64
SHORTEST_RECORD = 36  # bytes of the shortest step record the trainer writes, '{"step": 1, "epoch": 1, "loss": 1.0}'


@dataclasses.dataclass
class Curves:
    """A run's curves: every step's loss and each epoch's test accuracy, as (step, epoch, accuracy)."""

    steps: np.ndarray
    losses: np.ndarray
    evals: list


def read_metrics(path: Path) -> dict:
    """The curves of a metrics file, {model: (group, Curves)}: one entry, model None, for a single run's; one
    per model for a run of several models, whose records name their model and group. ValueError naming the
    line for anything else."""
    runs: dict = {}  # model -> (group, steps, losses, evals)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                assert isinstance(record, dict) and type(record.get("step")) is int
                assert type(record.get("epoch")) is int
                assert ("loss" in record) != ("test_accuracy" in record)
                assert all(type(record.get(k, 0.0)) in (int, float) for k in ("loss", "test_accuracy"))
                # a loss is finite and >= 0 (the trainer stops before it writes another), an accuracy a fraction
                assert math.isfinite(record.get("loss", 0.0)) and record.get("loss", 0.0) >= 0
                assert 0 <= record.get("test_accuracy", 0.0) <= 1
                model, group = record.get("model"), record.get("group", "all")
                assert model is None or (type(model) is str and type(group) is str)
                assert (model is None) == (None in runs) or not runs
            except (json.JSONDecodeError, AssertionError):
                raise ValueError(f"{path} line {n} is not a metrics record of mnist_cuda.train --metrics") from None
            _, steps, losses, evals = runs.setdefault(model, (group, array("q"), array("d"), []))
            if "loss" in record:
                steps.append(record["step"])
                losses.append(record["loss"])
            else:
                evals.append((record["step"], record["epoch"], record["test_accuracy"]))
    if not runs or not any(len(steps) for _, steps, _, _ in runs.values()):
        raise ValueError(f"{path} holds no step losses (is it a --metrics file of mnist_cuda.train?)")
    return {
        model: (group, Curves(np.frombuffer(steps, np.int64), np.frombuffer(losses, np.float64), evals))
        for model, (group, steps, losses, evals) in runs.items()
    }


def plot_bytes(points: int) -> int:
    """Host memory that drawing `points` steps takes at most."""
    return BYTES_PER_POINT * points


def plot_training(curves: Curves, path: Path, title: str | None = None) -> None:
    """Two panels, the loss per step (log scale, with its running mean) and the test accuracy per epoch."""
    with warnings.catch_warnings():
        # matplotlib's notes on what it draws anyway (a layout that does not quite fit, a log scale with nothing
        # above 0 to show) are not the user's concern
        warnings.simplefilter("ignore", UserWarning)
        _draw(curves, path, title)


def _draw(curves: Curves, path: Path, title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses, evals = curves.steps, np.asarray(curves.losses, dtype=np.float64), curves.evals
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(steps, losses, lw=0.5, alpha=0.35, color="tab:blue", label="loss of each batch")
    if len(losses) >= SMOOTH_STEPS:
        mean = np.convolve(losses, np.ones(SMOOTH_STEPS) / SMOOTH_STEPS, mode="valid")
        ax_loss.plot(steps[SMOOTH_STEPS - 1 :], mean, color="tab:blue", label=f"mean of the last {SMOOTH_STEPS}")
    if (losses > 0).any():  # (a loss of exactly 0 everywhere has no log scale)
        ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (NLL)")
    ax_loss.legend(loc="upper right")
    ax_loss.grid(alpha=0.3, which="both")
    if evals:
        eval_steps, epochs, accuracy = (np.array(v) for v in zip(*evals))
        ax_acc.plot(epochs, 100 * accuracy, "o-", color="tab:green")
        for e, a in zip(epochs, accuracy):
            ax_acc.annotate(
                f"{100 * a:.2f}", (e, 100 * a), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8
            )
        ax_acc.set_xticks(epochs)
        low = min(100 * accuracy.min(), 99.0)
        ax_acc.set_ylim(low - 0.1 * (100.2 - low), 100.0)
    _finish(fig, ax_acc, path, title)


def _finish(fig, ax_acc, path, title) -> None:
    """The accuracy panel's labels, the title, and the figure written to path (PNG) and closed."""
    import matplotlib.pyplot as plt

    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy (%)")
    ax_acc.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    cli.save_figure(fig, path)
    plt.close(fig)


def plot_models(runs: list, path: Path, title: str | None = None) -> None:
    """The curves of several models, runs = [(name, group, Curves)]: each model's loss (its running mean) and
    test accuracy per epoch, a colour per group (the models of a group differ only in their seed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _draw_models(runs, path, title)


def _draw_models(runs, path, title):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(group for _, group, _ in runs))
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "viridis")
    colour = {g: colours(i if len(names) <= 10 else i / max(1, len(names) - 1)) for i, g in enumerate(names)}
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    labelled = set()
    for _, group, c in runs:
        losses = np.asarray(c.losses, dtype=np.float64)
        label = None if group in labelled else ("all models" if group == "all" else group)
        labelled.add(group)
        smooth = min(SMOOTH_STEPS, len(losses))
        mean = np.convolve(losses, np.ones(smooth) / smooth, mode="valid")
        ax_loss.plot(c.steps[smooth - 1 :], mean, lw=0.7, alpha=0.6, color=colour[group], label=label)
        if c.evals:
            _, epochs, accuracy = (np.array(v) for v in zip(*c.evals))
            ax_acc.plot(epochs, 100 * accuracy, "o-", ms=2, lw=0.7, alpha=0.6, color=colour[group])
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel(f"training loss (mean of the last {SMOOTH_STEPS} steps)")
    if len(names) <= 12:
        ax_loss.legend(loc="upper right", fontsize=8)
    ax_loss.grid(alpha=0.3, which="both")
    ax_acc.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    _finish(fig, ax_acc, path, title)


def build_parser() -> cli.Parser:
    p = cli.Parser(prog=cli.prog_name("mnist_cuda.curves"), description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", type=cli.input_file, metavar="METRICS", help="a --metrics file of mnist_cuda.train")
    p.add_argument(
        "--out", type=cli.output_path, default=None, metavar="PNG", help="where to draw (default: METRICS with .png)"
    )
    p.add_argument("--title", default=None, help="a title over the panels (default: the metrics file's name)")
    return p


def main(argv=None) -> int:
    return cli.run(build_parser(), draw, argv)


def draw(args, p) -> int:
    default = (
        args.metrics.with_name(args.metrics.name + ".png")
        if args.metrics.suffix == ".png"
        else args.metrics.with_suffix(".png")
    )  # never the metrics file itself (but maybe a link to it)
    try:
        out = args.out or cli.output_path(str(default))
    except argparse.ArgumentTypeError as e:
        p.fail("--out", f"the default {e}")
    cli.refuse_clashes(p, inputs=[("METRICS", args.metrics)], outputs=[("--out", out)])
    cli.fits_host_or_fail(
        p,
        "METRICS",
        plot_bytes(args.metrics.stat().st_size // SHORTEST_RECORD + 1),
        f"drawing {args.metrics} ({args.metrics.stat().st_size / 1e9:.1f} GB of records)",
    )
    try:
        runs = read_metrics(args.metrics)
    except UnicodeDecodeError:
        p.error(f"{args.metrics} is not a text file (a --metrics file of mnist_cuda.train is JSON lines)")
    except ValueError as e:
        p.error(str(e))
    cli.require_matplotlib(p, "--out")
    if list(runs) == [None]:
        plot_training(runs[None][1], out, args.title or args.metrics.name)
    else:
        plot_models([(m, g, c) for m, (g, c) in runs.items()], out, args.title or args.metrics.name)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
