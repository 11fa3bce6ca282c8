"""The flags of `python -m mnist_cuda.train`: its parser (build_parser) and the argument types of its own
(--channels). What the flags mean together, and their checks, are mnist_cuda.train_setup's."""

from __future__ import annotations

import argparse

from . import cli, data, sizes
from .nets import KERNEL_VERSIONS
from .training import DEFAULTS, RECIPES


def _channels(text):
    parts = text.split(",")
    try:
        c = tuple(int(p) for p in parts)
    except ValueError:
        c = ()
    if len(c) != 2 or min(c) < 1:
        raise argparse.ArgumentTypeError(
            f"expected two positive whole numbers C1,C2 (e.g. 32,64), got {cli.shorten(text)!r}"
        )
    if max(c) > sizes.MAX_CHANNELS:
        raise argparse.ArgumentTypeError(
            f"at most {sizes.MAX_CHANNELS:,} channels (BatchNorm's groups of 8 channels "
            f"fill at most 65535 rows of CUDA's grid), got {cli.shorten(text)}"
        )
    return c


STEP_COUNTER = "the GPU's step counter is 32-bit"


def build_parser() -> cli.Parser:
    d = DEFAULTS
    from_init = ", or the --init checkpoint's"
    p = cli.Parser(
        prog=cli.prog_name("mnist_cuda.train"),
        formatter_class=argparse.HelpFormatter,
        description="Train the MNIST CNN (conv-bn-relu-pool x2, fc-relu-fc, log-softmax/NLL, SGD: plain by default) "
        "on the GPU with hand-written CUDA kernels.",
        epilog="With --init, the flags marked 'or the --init checkpoint's' default to what the checkpoint "
        "recorded, and training continues where it stopped: the step count, the epoch and its shuffled "
        "order, so 4 epochs and then --init with 6 more train the same steps as 10 at once.",
    )
    p.add_argument(
        "--dataset",
        choices=sorted(data.DATASETS),
        default=None,
        help=f"training and test set (default: {d['dataset']}{from_init})",
    )
    p.add_argument(
        "--data-dir",
        type=cli.existing_dir,
        default=None,
        metavar="DIR",
        help="the folder holding the four IDX files (.gz or raw), the only place looked in when given "
        "(default: $MNIST_DATA_DIR if set, else the cache ./data/<dataset>, else a verified download)",
    )
    p.add_argument(
        "--epochs",
        type=cli.one_value(cli.int_in_range(1, sizes.MAX_STEPS, STEP_COUNTER)),
        default=None,
        help=f"epochs to train in this run, counted from where --init stopped (default: {d['epochs']})",
    )
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=None,
        help="a named set of the flags below (batch size, lr, epochs, SGD's options, schedule; given "
        "flags win): fast, the fewest seconds to 99.0%% test accuracy (with --target-accuracy "
        "99); best, the highest mean accuracy within 20 epochs",
    )
    p.add_argument(
        "--target-accuracy",
        type=cli.one_value(cli.number_between(0, 100, low_included=False)),
        default=None,
        metavar="PERCENT",
        help="stop after the first epoch whose test accuracy reaches PERCENT and report the training "
        "time to there (evaluation timed apart)",
    )
    p.add_argument(
        "--batch-size",
        type=cli.one_value(cli.int_in_range(1, sizes.MAX_BATCH, "the largest training set")),
        default=None,
        help=f"samples per training step; evaluation uses the same (default: {d['batch_size']}{from_init})",
    )
    p.add_argument(
        "--lr",
        type=cli.value_list(cli.learning_rate),
        default=None,
        help=f"SGD learning rate (default: {d['lr']}{from_init}); a list A,B,... trains a model per rate",
    )
    p.add_argument(
        "--seed",
        type=cli.value_list(cli.seed, ranges=True),
        default=None,
        help=f"seeds the initialisation, the shuffling and the augmentation; 0 to {cli.SEED_MAX} (default: "
        f"{d['seed']}{from_init}); a list trains a model per seed: 0,3,7 or 0-15",
    )
    p.add_argument(
        "--channels",
        type=_channels,
        default=None,
        metavar="C1,C2",
        help="output channels of conv1 and conv2 (default: 32,64, or the --init checkpoint's)",
    )
    p.add_argument(
        "--hidden",
        type=cli.one_value(
            cli.int_in_range(
                1,
                sizes.MAX_HIDDEN,
                "fc1's weight gradient in tiles of 64 outputs fills at most 65535 rows of CUDA's grid",
            )
        ),
        default=None,
        help=f"fc1 width (default: {d['hidden']}, or the --init checkpoint's)",
    )
    p.add_argument(
        "--save",
        type=cli.output_path,
        default=None,
        metavar="PATH",
        help="write a checkpoint (.npz) here after every epoch, replacing the last one atomically; with several "
        "models, one per model named after its flags (run.npz: run-seed3-lr0.02.npz)",
    )
    p.add_argument(
        "--init",
        type=cli.input_file,
        nargs="+",
        default=None,
        metavar="PATH",
        help="start from this checkpoint (written by --save) and continue where it stopped; several "
        "checkpoints continue a run of several models, a model each",
    )
    p.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a new permutation of the training set every epoch; --no-shuffle: file order "
        "(default: shuffle, or the --init checkpoint's)",
    )
    p.add_argument(
        "--steps",
        type=cli.one_value(cli.int_in_range(0, sizes.MAX_STEPS, STEP_COUNTER)),
        default=None,
        metavar="N",
        help="train N steps instead of --epochs (0: only write the initial checkpoint to --save)",
    )
    p.add_argument(
        "--metrics",
        type=cli.output_path,
        default=None,
        metavar="PATH",
        help="JSON lines: every step's loss, every epoch's test accuracy (appended to with --init, "
        "so one file holds a continued run); with several models, each record names its model",
    )
    p.add_argument(
        "--plot",
        type=cli.output_path,
        default=None,
        metavar="PNG",
        help="draw this run's loss per step and test accuracy per epoch here, every model's with several, a "
        "colour per group of hyperparameters (needs matplotlib)",
    )
    p.add_argument(
        "--augment",
        type=cli.value_list(
            cli.int_in_range(
                0, data.IMAGE_SIZE - 1, "more moves every image out of its 28x28 field; a few (1-3) is the usual"
            )
        ),
        default=None,
        metavar="PIXELS",
        help="move each training image by up to PIXELS pixels each way, offsets drawn per step from "
        "the seed and done on the GPU as the batch is loaded (default: 0, or the --init checkpoint's)",
    )
    p.add_argument(
        "--kernels",
        choices=KERNEL_VERSIONS,
        default=None,
        help="kernel version: the readable one-thread-per-output kernels, or the fused tiled ones "
        f"(default: {d['kernels']}{from_init})",
    )
    cli.add_precision_arguments(p, f"default: {d['precision']}{from_init}")
    p.add_argument(
        "--eager",
        action="store_true",
        help="launch the kernels one by one instead of replaying a CUDA graph of the step",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--ensemble",
        action="store_true",
        help="with several models: at the end, the test accuracy of their ensemble (the mean of the models' "
        "probabilities)",
    )
    cli.add_optimizer_arguments(p, lists=True)
    return p
