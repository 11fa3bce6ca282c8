"""Classify image files with a trained checkpoint:  python -m mnist_cuda.predict CHECKPOINT IMAGE...

Each image (PNG, JPEG or any format Pillow reads) is made into a 28x28 MNIST-style input the way MNIST
itself was made (mnist_cuda.preprocess: grayscale, inverted when the background is light, the ink fitted
into 20x20 and centred by its centre of mass), then run through our kernels on the GPU in evaluation mode,
as `mnist_cuda.evaluate` runs the test set. Prints each image's class and probabilities (`--json`: one JSON
object). Every image is read and checked before the GPU starts; a bad one is one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import numpy as np

from . import cli, data, sizes
from .evaluate import Inference, fits_gpu_or_exit, fits_or_fail, load_checkpoint_or_fail, log_softmax, resolve
from .nets import KERNEL_VERSIONS


def build_parser() -> cli.Parser:
    from_ckpt = "(default: the checkpoint's)"
    p = cli.Parser(
        prog=cli.prog_name("mnist_cuda.predict"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.HelpFormatter,
    )
    p.add_argument("checkpoint", type=cli.input_file, metavar="CHECKPOINT", help="a checkpoint written by --save")
    p.add_argument("images", type=cli.input_file, nargs="+", metavar="IMAGE", help="image files to classify")
    p.add_argument(
        "--dataset", choices=sorted(data.DATASETS), default=None, help=f"whose class names to print {from_ckpt}"
    )
    p.add_argument(
        "--batch-size",
        type=cli.int_in_range(1, sizes.MAX_BATCH, "the largest training set"),
        default=None,
        help=f"images per batch {from_ckpt}",
    )
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default=None, help=f"kernel version {from_ckpt}")
    cli.add_precision_arguments(p, from_ckpt.strip("()"))
    p.add_argument("--json", action="store_true", help="print one JSON object: every image's class and probabilities")
    return p


def read_images(parser, paths) -> np.ndarray:
    """uint8 [N, 1, 28, 28]; every unreadable image is reported (one line each) before exiting with 2."""
    try:
        importlib.import_module("PIL")  # Pillow is an optional extra
    except ImportError:
        parser.error("reading images needs Pillow: pip install '.[image]' in the source folder, or pip install Pillow")
    from . import preprocess

    images, problems = [], []
    for path in paths:
        try:
            images.append(preprocess.load_image(path))
        except preprocess.ImageError as e:
            problems.append(str(e))
    if problems:
        for problem in problems:
            print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return np.stack(images)[:, None]


def main(argv=None) -> int:
    return cli.run(build_parser(), predict, argv)


def predict(args, parser) -> int:
    state, meta, channels, hidden, _ = load_checkpoint_or_fail(parser, args.checkpoint)
    run = resolve(args, parser, meta)
    fits_or_fail(parser, run, channels, hidden)
    x = read_images(parser, args.images)
    cli.gpu_or_exit(parser.prog)
    fits_gpu_or_exit(parser, run, channels, hidden)
    from . import cuda

    pinned = cuda.pinned_empty(x.shape, np.uint8)
    pinned[...] = x
    model = Inference(state, channels, hidden, run["batch_size"], run["kernels"], run["precision"])
    logits = model.logits(pinned)
    probabilities = np.exp(log_softmax(logits))
    names = data.CLASS_NAMES[run["dataset"]]
    classes = logits.argmax(axis=1)  # the first largest logit, as evaluate and the trainer count
    results = [
        {
            "image": str(path),
            "class": names[c],
            "index": int(c),
            "probabilities": {name: float(v) for name, v in zip(names, p)},
        }
        for path, c, p in zip(args.images, classes, probabilities)
    ]
    if args.json:
        print(
            json.dumps(
                {"checkpoint": str(args.checkpoint), "dataset": run["dataset"], "predictions": results}, indent=1
            )
        )
        return 0
    width = max(len(str(p)) for p in args.images)
    for r, c, p in zip(results, classes, probabilities):
        others = [k for k in np.argsort(-p, kind="stable") if k != c][:2]
        print(
            f"{r['image']:<{width}}  {r['class']}  ({100 * p[c]:.1f}%)   then "
            + ", ".join(f"{names[k]} {100 * p[k]:.1f}%" for k in others)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
