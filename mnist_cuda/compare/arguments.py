"""compare_pytorch.py's flags: the parser, and every combination of flags that cannot work, refused as one
line and exit 2 before any work."""

from __future__ import annotations

from pathlib import Path

from .. import data, optim
from ..cli import (
    Parser,
    add_optimizer_arguments,
    add_precision_arguments,
    batch_sizes,
    data_inputs,
    existing_dir,
    input_file,
    int_in_range,
    learning_rate,
    model_fits_or_fail,
    non_negative_at_most,
    output_path,
    refuse_clashes,
    seed,
)
from ..nets import KERNEL_VERSIONS, LOSS_CAPACITY
from ..sizes import DEFAULT_CHANNELS, DEFAULT_HIDDEN, MAX_SECONDS, MAX_TIMED
from ..training import DEFAULTS, RECIPES
from .parity import parity_options
from .recipes import RECIPE_SEEDS, RECIPE_TORCH_MODES, recipe_modes, recipe_seeds

PROG = "compare_pytorch.py"
# the default --out: the checkout's benchmarks/results/ (an installed package has none: --out is needed)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
CHANNELS, HIDDEN = DEFAULT_CHANNELS, DEFAULT_HIDDEN  # the design's network, on both sides


def build_parser(description: str):
    p = Parser(prog=PROG, description=description)
    p.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default="64,512,4096",
        help="comma-separated batch sizes to time; the first is also the parity run's",
    )
    p.add_argument(
        "--steps", type=int_in_range(1, MAX_TIMED), default=500, help="timed steps per measurement (method: >= 100)"
    )
    p.add_argument(
        "--timing-window",
        type=int_in_range(1, MAX_TIMED),
        default=10,
        help="whole-step loops: steps between timing events (1: an event per step)",
    )
    p.add_argument("--warmup", type=int_in_range(0, MAX_TIMED), default=20, help="untimed steps first (method: >= 20)")
    p.add_argument(
        "--warmup-seconds",
        type=non_negative_at_most(MAX_SECONDS),
        default=1.0,
        help="the whole-step loops' warm-up lasts at least this long as well (the GPU's clocks settle)",
    )
    p.add_argument("--parity-steps", type=int_in_range(0, LOSS_CAPACITY), default=200, help="0 skips the parity run")
    p.add_argument("--lr", type=learning_rate, default=DEFAULTS["lr"], help="learning rate of the timed runs")
    p.add_argument(
        "--parity-lr",
        type=learning_rate,
        default=0.002,
        help="learning rate of the parity run, low enough that float32 rounding cannot snowball (at the "
        "training rate this network's fp32 trajectory is chaotic: PyTorch's fp32 and fp64 runs part "
        "within 50 steps); with --momentum M the run uses this x (1 - M), steps of the same size",
    )
    p.add_argument("--seed", type=seed, default=0, help="seeds the initial weights and the batches' order")
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default="mnist", help="training set of both sides")
    p.add_argument(
        "--data-dir",
        type=existing_dir,
        default=None,
        help="directory holding the IDX files (else $MNIST_DATA_DIR, then ./data, then download)",
    )
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default="fast", help="our kernel version")
    add_precision_arguments(
        p,
        "default: fp32; tf32 as PyTorch's convolutions by default, bf16 against PyTorch "
        "under autocast(bfloat16) in every candidate and in the parity run",
    )
    p.set_defaults(precision="fp32")
    p.add_argument(
        "--no-autotune",
        action="store_true",
        help="skip PyTorch's max-autotune candidates (minutes of compiling): a quick run, not a benchmark",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="skip every torch.compile candidate (eager and graphs only): a smoke run, not a benchmark",
    )
    p.add_argument("--compile", action="store_true", help="also time torch.compile without a CUDA graph")
    p.add_argument("--no-epoch", action="store_true", help="skip the whole-epoch wall-clock runs")
    p.add_argument("--parity-only", action="store_true", help="only the parity run (no timing, no files)")
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=None,
        help="instead of the step timings: train's --recipe on both sides: fast, the training time to "
        "its target accuracy; best, the accuracy after its epochs and their training time",
    )
    p.add_argument(
        "--recipe-torch-modes",
        type=recipe_modes,
        default=RECIPE_TORCH_MODES,
        metavar="MODES",
        help="with --recipe: PyTorch's modes, comma-separated: any candidate, as eager,graph,"
        f"compiled+graph,channels_last (default: {','.join(RECIPE_TORCH_MODES)})",
    )
    p.add_argument(
        "--recipe-seeds",
        type=recipe_seeds,
        default=RECIPE_SEEDS,
        metavar="SEEDS",
        help="with --recipe: the seeds, as 0,1,2 or 0-4 (default: 0-4)",
    )
    p.add_argument(
        "--out",
        type=output_path,
        default=None,
        help="result JSON (default: benchmarks/results/compare-<gpu>-<time>.json, or recipe-<name>-<gpu>"
        ".json with --recipe); its folder must exist",
    )
    p.add_argument(
        "--png",
        type=output_path,
        default=None,
        help="plot (default: the JSON's path with .png; with --show: draw the saved result's plot here)",
    )
    p.add_argument("--no-png", action="store_true", help="write no plot")
    p.add_argument(
        "--show",
        type=input_file,
        default=None,
        metavar="JSON",
        help="print a saved result and exit (no GPU or torch needed)",
    )
    add_optimizer_arguments(p)
    return p


# What each way of running the script leaves unused: a flag given there changes nothing, so it is refused.
TIMING_FLAGS = (
    "steps",
    "timing_window",
    "warmup",
    "warmup_seconds",
    "no_autotune",
    "no_compile",
    "compile",
    "no_epoch",
)
UNUSED = {
    "recipe": TIMING_FLAGS
    + ("batch_sizes", "kernels", "lr", "parity_steps", "parity_lr", "seed", "png", "no_png", "parity_only"),
    "parity_only": TIMING_FLAGS + ("lr", "out", "png", "no_png", "recipe_torch_modes", "recipe_seeds"),
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def refuse_unused(parser, args):
    """A flag the chosen way of running ignores is a usage error naming what ignores it (--show reads a
    saved result: it takes --png alone)."""
    defaults = vars(parser.parse_args([]))  # (the defaults as the flags' types make them)
    dests = [dest for dest in defaults if dest not in ("show", "png")]
    for mode, unused in (("show", dests), *UNUSED.items()):
        if getattr(args, mode) in (None, False):
            continue
        for dest in unused:
            if dest != mode and getattr(args, dest) != defaults[dest]:
                parser.fail(_flag(dest), f"changes nothing with {_flag(mode)} (leave it out)")


def check_arguments(parser, args):
    """Every combination of flags that cannot work, as one line and exit 2, before any work."""
    refuse_unused(parser, args)
    if args.precision != "fp32" and args.kernels != "fast":
        parser.fail("--precision", f"{args.precision} needs --kernels fast (the naive kernels compute in plain fp32)")
    if args.parity_only and not args.parity_steps:
        parser.fail("--parity-only", "needs --parity-steps > 0")
    if args.recipe and args.precision != "fp32":
        parser.fail("--precision", "the recipes run in fp32 on both sides (train's --recipe); leave it out")
    if args.recipe and any(getattr(args, k) is not None for k in optim.ARGUMENTS):
        parser.error("a recipe sets SGD's options itself (train's --recipe); leave the optimizer's flags out")
    for flag, given in (
        ("--recipe-torch-modes", args.recipe_torch_modes != RECIPE_TORCH_MODES),
        ("--recipe-seeds", args.recipe_seeds != RECIPE_SEEDS),
    ):
        if given and not args.recipe:
            parser.fail(flag, "needs --recipe (the timed runs take every candidate)")
    if args.timing_window > args.steps:
        parser.fail(
            "--timing-window", f"{args.timing_window} is more than --steps {args.steps}: no window would be timed"
        )
    train_samples = data.TRAIN_SAMPLES[args.dataset]
    for batch in args.batch_sizes:
        if batch > train_samples:
            parser.fail(
                "--batch-sizes", f"{batch} is larger than the {args.dataset} training set ({train_samples} samples)"
            )
        model_fits_or_fail(
            parser, CHANNELS, HIDDEN, batch, kernels=(args.kernels,), batch_flag="--batch-sizes", initialise=False
        )
    inputs = [("--show", args.show)] + ([] if args.show else data_inputs(args.dataset, args.data_dir))
    refuse_clashes(parser, inputs=inputs, outputs=[("--out", args.out), ("--png", args.png)])
    if args.out is None and args.show is None and not args.parity_only and not RESULTS.is_dir():
        parser.fail(
            "--out", f"the default folder {RESULTS} does not exist (an installed copy has none); name the result file"
        )
    try:
        options = parity_options(args)
    except ValueError as e:
        parser.error(str(e))
    if not options.plain and not args.parity_only:
        parser.error(
            "the optimizer's options are compared in the parity run: give --parity-only (the timed "
            "runs train with plain SGD, the design's step)"
        )
