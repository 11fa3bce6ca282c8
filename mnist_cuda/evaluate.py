"""Evaluate a checkpoint, or an ensemble of several, on the test set with our kernels on the GPU:
python -m mnist_cuda.evaluate CHECKPOINT [CHECKPOINT ...]

Prints the test accuracy, the loss, the accuracy of each class and the confusion matrix (`--json`: the same
as one JSON object); `--png` draws the confusion matrix and the worst misclassified test images. Given several
checkpoints (one architecture, one test set), it evaluates each, then their ensemble: the mean of the models'
probabilities, whose largest is its class; the report is the ensemble's, after a line per model.

The network runs in evaluation mode (BatchNorm's running statistics) with the kernel version, precision
and batch size the checkpoint was trained with, unless flags say otherwise, so the accuracy is the one the
trainer printed at the end of that epoch. The accuracy is counted on the GPU as the trainer counts it; the
per-class figures, the confusion matrix and the loss come from the same logits, copied to the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from . import checkpoint, cli, cuda, data, sizes
from .nets import KERNEL_VERSIONS, PRECISIONS

WORST = 16  # misclassified test images in the --png grid


class Inference:
    """A checkpoint's network on the GPU in evaluation mode, for evaluate and predict."""

    def __init__(self, state, channels, hidden, batch_size: int, kernels: str, precision: str):
        from .nets import Parameters, make_net
        from .step import Step

        params = Parameters(channels, hidden)
        params.load_state_dict(state)
        self.step = Step(make_net(params, batch_size, kernels, precision), 0.0)  # a rate of 0: no training step runs

    def accuracy(self, x, y) -> float:
        return self.step.evaluate(x, y)

    def logits(self, x, y=None) -> np.ndarray:
        return self.step.logits(x, y)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of float32 logits."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def ensemble_log_probs(logits: list[np.ndarray]) -> np.ndarray:
    """float64 log of the mean of the models' probabilities (each the softmax of its logits): the ensemble's
    scores, a valid input to report() (whose log-softmax leaves log-probabilities as they are)."""
    probs = np.mean([np.exp(log_softmax(z)) for z in logits], axis=0)
    return np.log(probs)


def report(logits: np.ndarray, labels: np.ndarray, class_names) -> dict:
    """Accuracy, mean NLL, per-class accuracy, the confusion matrix (rows: true class) and the misclassified
    samples from the most confident mistake down."""
    classes = len(class_names)
    log_p = log_softmax(logits)
    predicted = logits.argmax(axis=1)  # the first largest logit, as the GPU's count_correct takes it
    confusion = np.zeros((classes, classes), np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    per_class = confusion.diagonal() / np.maximum(confusion.sum(axis=1), 1)
    nll = -log_p[np.arange(len(labels)), labels]
    wrong = np.flatnonzero(predicted != labels)
    wrong = wrong[np.argsort(-nll[wrong], kind="stable")]
    return {
        "samples": int(len(labels)),
        "correct": int(confusion.trace()),
        "accuracy": float(confusion.trace() / len(labels)),
        "loss": float(nll.mean()),
        "per_class": {name: float(a) for name, a in zip(class_names, per_class)},
        "confusion": confusion.tolist(),
        "misclassified": [
            {
                "index": int(i),
                "label": class_names[labels[i]],
                "predicted": class_names[predicted[i]],
                "probability": float(np.exp(log_p[i, predicted[i]])),
            }
            for i in wrong
        ],
    }


def format_report(r: dict, header: str) -> str:
    names = list(r["per_class"])
    width = max(6, max(len(n) for n in names) + 1)
    lines = [
        header,
        f"test accuracy {100 * r['accuracy']:.2f}% ({r['correct']} of {r['samples']}), loss {r['loss']:.4f}",
        "",
        "accuracy per class:",
    ]
    lines += [f"  {name:<{width}} {100 * a:6.2f}%" for name, a in r["per_class"].items()]
    lines += [
        "",
        "confusion matrix (rows: true class, columns: predicted class):",
        " " * (width + 2) + "".join(f"{n[: width - 1]:>{width}}" for n in names),
    ]
    lines += [f"  {name:<{width}}" + "".join(f"{v:>{width}}" for v in row) for name, row in zip(names, r["confusion"])]
    return "\n".join(lines)


def plot_report(r: dict, images: np.ndarray, path, title: str) -> None:
    """The confusion matrix beside a grid of the WORST most confidently misclassified images."""
    with warnings.catch_warnings():
        # matplotlib's notes on what it draws anyway (a layout that does not quite fit) are not the user's concern
        warnings.simplefilter("ignore", UserWarning)
        _draw_report(r, images, path, title)


def _draw_report(r: dict, images: np.ndarray, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["per_class"])
    confusion = np.array(r["confusion"])
    fig = plt.figure(figsize=(13, 6))
    grid = fig.add_gridspec(4, 9)
    ax = fig.add_subplot(grid[:, :5])
    shown = np.log10(1 + confusion)  # the diagonal is ~100x the rest: a log scale shows the mistakes
    ax.imshow(shown, cmap="Blues")
    for (i, j), v in np.ndenumerate(confusion):
        ax.text(
            j,
            i,
            str(v),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if shown[i, j] > 0.6 * shown.max() else "black",
        )
    ax.set_xticks(range(len(names)), names, rotation=45 if max(map(len, names)) > 2 else 0, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"confusion matrix: {100 * r['accuracy']:.2f}% correct")
    for k, m in enumerate(r["misclassified"][:WORST]):
        a = fig.add_subplot(grid[k // 4, 5 + k % 4])
        a.imshow(images[m["index"]].reshape(data.IMAGE_SIZE, data.IMAGE_SIZE), cmap="gray_r")
        a.set_title(f"#{m['index']}: {m['label']} -> {m['predicted']}\n({100 * m['probability']:.0f}%)", fontsize=8)
        a.axis("off")
    fig.text(0.78, 0.97, "the most confident mistakes (true -> predicted)", ha="center", fontsize=10)
    fig.suptitle(title, x=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    cli.save_figure(fig, path)
    plt.close(fig)


def build_parser() -> cli.Parser:
    from_ckpt = "(default: the checkpoint's)"
    p = cli.Parser(
        prog=cli.prog_name("mnist_cuda.evaluate"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.HelpFormatter,
    )
    p.add_argument(
        "checkpoints",
        nargs="+",
        type=cli.input_file,
        metavar="CHECKPOINT",
        help="a checkpoint written by --save; several (of one architecture): each, then their ensemble",
    )
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default=None, help=f"whose test set {from_ckpt}")
    p.add_argument(
        "--data-dir",
        type=cli.existing_dir,
        default=None,
        metavar="DIR",
        help="the folder holding the IDX files, the only place looked in when given (default: "
        "$MNIST_DATA_DIR if set, else the cache ./data/<dataset>, else a verified download); "
        "only the two test files are needed",
    )
    p.add_argument(
        "--batch-size",
        type=cli.int_in_range(1, sizes.MAX_BATCH, "the largest training set"),
        default=None,
        help=f"samples per evaluation batch {from_ckpt}",
    )
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default=None, help=f"kernel version {from_ckpt}")
    cli.add_precision_arguments(p, from_ckpt.strip("()"))
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead")
    p.add_argument(
        "--png",
        type=cli.output_path,
        default=None,
        metavar="PATH",
        help="draw the confusion matrix and the worst misclassified images here (needs matplotlib)",
    )
    p.add_argument("--quiet", action="store_true", help="no download progress bars")
    return p


def resolve(args, parser, meta: dict) -> dict:
    """The dataset, batch size, kernels and precision: the flags, else what the checkpoint recorded."""
    pick = lambda flag, key, default: flag if flag is not None else meta.get(key, default)
    out = {
        "dataset": pick(args.dataset, "dataset", "mnist"),
        "batch_size": pick(args.batch_size, "batch_size", 64),
        "kernels": pick(args.kernels, "kernels", "fast"),
        "precision": args.precision or cli.precision_of(meta),
    }
    if out["dataset"] not in data.DATASETS:
        parser.fail("CHECKPOINT", f"it names an unknown dataset {out['dataset']!r}; give --dataset")
    if (
        out["kernels"] not in KERNEL_VERSIONS
        or type(out["batch_size"]) is not int
        or not 1 <= out["batch_size"] <= sizes.MAX_BATCH
    ):
        parser.fail(
            "CHECKPOINT", "its metadata names no valid kernel version and batch size; give --kernels and --batch-size"
        )
    if out["precision"] not in PRECISIONS:
        parser.fail("CHECKPOINT", f"its metadata names an unknown precision {out['precision']!r}; give --precision")
    if out["precision"] != "fp32" and out["kernels"] != "fast":
        parser.fail("--precision", f"{out['precision']} needs --kernels fast (the naive kernels compute in plain fp32)")
    return out


def fits_or_fail(parser, run: dict, channels, hidden) -> None:
    """The checkpoint's model at the evaluation batch size within what the kernels take (its weights are read
    already), before any data or GPU work. A model too large is the checkpoint's: no flag here changes it."""
    cli.model_fits_or_fail(
        parser, channels, hidden, run["batch_size"], (run["kernels"],), initialise=False, blame=sizes.CHECKPOINT
    )


def fits_gpu_or_exit(parser, run: dict, channels, hidden) -> None:
    cli.fits_gpu_or_exit(
        parser, channels, hidden, run["batch_size"], run["kernels"], run["precision"], blame=sizes.CHECKPOINT
    )


def load_checkpoint_or_fail(parser, path):
    try:
        return checkpoint.load_model(path)
    except checkpoint.CheckpointError as e:
        parser.fail("CHECKPOINT", str(e))


@dataclasses.dataclass
class Model:
    path: Path
    state: dict
    meta: dict
    channels: tuple
    hidden: int
    run: dict  # resolve()'s dataset, batch size, kernels and precision


def load_models_or_fail(args, parser) -> list[Model]:
    """Every checkpoint given, read and resolved against the flags; several must be distinct files of one
    architecture evaluated on one test set (an ensemble), all before any data or GPU work."""
    models = []
    for path in args.checkpoints:
        if any(cli.same_file(path, m.path) for m in models):
            parser.fail("CHECKPOINT", f"{path} is given twice: an ensemble takes each model once")
        state, meta, channels, hidden, _ = load_checkpoint_or_fail(parser, path)
        models.append(Model(path, state, meta, tuple(channels), hidden, resolve(args, parser, meta)))
        first = models[0]
        if (models[-1].channels, models[-1].hidden) != (first.channels, first.hidden):
            parser.fail(
                "CHECKPOINT",
                f"{path} is {_architecture(models[-1])} and {first.path} {_architecture(first)}: "
                "an ensemble takes models of one architecture",
            )
        if models[-1].run["dataset"] != first.run["dataset"]:
            parser.fail(
                "CHECKPOINT",
                f"{path} is evaluated on {models[-1].run['dataset']} and {first.path} on "
                f"{first.run['dataset']}: an ensemble takes one test set (give --dataset)",
            )
    for m in models:
        fits_or_fail(parser, m.run, m.channels, m.hidden)
    return models


def _architecture(m: Model) -> str:
    return f"a {m.channels[0]},{m.channels[1]} / {m.hidden} model"


def main(argv=None) -> int:
    return cli.run(build_parser(), evaluate, argv)


def evaluate(args, parser) -> int:
    models = load_models_or_fail(args, parser)
    dataset = models[0].run["dataset"]
    cli.refuse_clashes(
        parser,
        inputs=[("CHECKPOINT", [m.path for m in models])] + cli.data_inputs(dataset, args.data_dir, test_only=True),
        outputs=[("--png", args.png)],
    )
    if args.png is not None:
        cli.require_matplotlib(parser, "--png")
    cli.check_data_dir_or_exit(parser.prog, dataset, args.data_dir, test_only=True)
    cli.gpu_or_exit(parser.prog)  # before a download
    for m in models:  # one at a time on the GPU: the largest must fit
        fits_gpu_or_exit(parser, m.run, m.channels, m.hidden)
    arrays = cli.load_data_or_exit(parser.prog, dataset, args.data_dir, args.quiet or args.json, test_only=True)
    test_x, test_y = arrays[2], arrays[3].astype(np.int32)
    host = data.host_data(dataset, arrays, empty=cuda.pinned_empty)
    class_names = data.CLASS_NAMES[dataset]
    results = []
    for m in models:
        logits = model_logits(m, host, parser.prog)
        if logits is None:
            return 1
        results.append((m, logits, describe(m, report(logits, test_y, class_names))))
    if len(models) == 1:
        m, _, r = results[0]
        print_report(args, r, header(m))
    else:
        r = ensemble(results, test_y, class_names)
        print_ensemble(args, r)
    if args.png is not None:
        name = models[0].path.name if len(models) == 1 else f"an ensemble of {len(models)} models"
        plot_report(r, test_x, args.png, f"{name} on the {dataset} test set")
        if not args.json:
            print(f"plot: {args.png}")
    return 0


def model_logits(m: Model, host, prog: str) -> np.ndarray | None:
    """The model's test logits on the GPU, its accuracy counted there too: the two must agree (None if not)."""
    model = Inference(m.state, m.channels, m.hidden, m.run["batch_size"], m.run["kernels"], m.run["precision"])
    accuracy = model.accuracy(host.test_x, host.test_y)
    logits = model.logits(host.test_x, host.test_y)
    correct = int((logits.argmax(axis=1) == host.test_y[: len(logits)]).sum())
    if correct != round(accuracy * len(logits)):  # the same logits must give the same count
        print(
            f"{prog}: internal error: {m.path}: the GPU counted {accuracy:.4%} correct, the logits "
            f"{correct / len(logits):.4%}",
            file=sys.stderr,
        )
        return None
    return logits


def describe(m: Model, r: dict) -> dict:
    return {
        "checkpoint": str(m.path),
        "step": m.meta.get("step"),
        **m.run,
        "trained_on": m.meta.get("dataset"),
        "test_accuracy_at_save": m.meta.get("test_accuracy"),
        **r,
    }


def header(m: Model) -> str:
    run = m.run
    return (
        f"{m.path}: step {m.meta.get('step', '?')} of a {m.channels[0]},{m.channels[1]} / {m.hidden} model "
        f"trained on {m.meta.get('dataset', '?')}; evaluated on the {run['dataset']} test set with the "
        f"{run['kernels']} kernels{'' if run['precision'] == 'fp32' else ' (' + run['precision'] + ')'} "
        f"at batch {run['batch_size']}"
    )


def print_report(args, r: dict, title: str) -> None:
    if args.json:
        print(json.dumps(r, indent=1))
        return
    print(format_report(r, title))
    wrong = r["misclassified"]
    if wrong:
        print(
            "\nthe most confident mistakes (test index: true -> predicted, probability): "
            + ", ".join(f"#{m['index']}: {m['label']} -> {m['predicted']} ({m['probability']:.2f})" for m in wrong[:5])
        )


def ensemble(results, labels, class_names) -> dict:
    """The ensemble's report (the mean of the models' probabilities), with each model's figures under
    "models"."""
    r = report(ensemble_log_probs([logits for _, logits, _ in results]), labels, class_names)
    keep = ("checkpoint", "step", "dataset", "batch_size", "kernels", "precision", "trained_on", "samples")
    models = [
        {**{k: d[k] for k in keep}, "correct": d["correct"], "accuracy": d["accuracy"], "loss": d["loss"]}
        for _, _, d in results
    ]
    return {"ensemble_of": len(results), "dataset": results[0][2]["dataset"], "models": models, **r}


def print_ensemble(args, r: dict) -> None:
    if args.json:
        print(json.dumps(r, indent=1))
        return
    width = max(len(m["checkpoint"]) for m in r["models"])
    for m in r["models"]:
        print(
            f"{m['checkpoint']:<{width}}  test accuracy {100 * m['accuracy']:.2f}% ({m['correct']} of "
            f"{m['samples']}), loss {m['loss']:.4f}"
        )
    accuracies = [m["accuracy"] for m in r["models"]]
    title = (
        f"\nthe ensemble of {r['ensemble_of']} models (the mean of their probabilities) on the {r['dataset']} test "
        f"set; the models alone: mean {100 * np.mean(accuracies):.2f}%, best {100 * max(accuracies):.2f}%"
    )
    print_report(args, r, title)


if __name__ == "__main__":
    sys.exit(main())
