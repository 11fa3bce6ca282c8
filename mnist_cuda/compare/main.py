"""Our CUDA kernels against PyTorch: same model, weights, batches, learning rate and batch size.

    python scripts/compare_pytorch.py                  # timing at batch 64, 512 and 4096, then the parity run
    python scripts/compare_pytorch.py --show FILE.json # print the tables of a saved result
    python scripts/compare_pytorch.py --show FILE.json --png FILE.png  # and draw its plot again (no GPU)
    python scripts/compare_pytorch.py --recipe fast    # train's recipe on both sides, seeds 0-4 (also: best)

(From a checkout without installing the package: PYTHONPATH=. python scripts/compare_pytorch.py ...)

PyTorch at its best: every candidate of compare.candidates (eager; the whole step as one CUDA graph;
torch.compile inside it, also with channels_last and with inductor's max-autotune), each compiled for its
batch size alone and checked not to recompile while timed; the headline is ours against the fastest
candidate, named, and the JSON keeps every candidate. --no-autotune skips the autotuned candidates (they
take minutes to compile) for quick runs only.

Timing, per batch size, after --warmup steps (the whole-step loops: and --warmup-seconds), over --steps
steps (median and mean): per phase (load, forward + loss, backward, update, zero-grad, with CUDA events
between them and one synchronisation per step); as whole-step loops with no synchronisation inside and a
timing event every --timing-window steps (each window's mean step is one sample); as one shuffled epoch's
wall clock. Each side's fastest mode is timed once more at the end ("again"): earlier work in the process
can slow our step graph for the rest of it, and "again" shows by how much.

Parity: both sides train --parity-steps steps from identical weights on identical batches at --parity-lr,
PyTorch with TF32 off (so both compute in fp32); PASS needs every loss within 1e-4 over the first 50 steps
and 1e-3 over all of them (compare.parity says why the rate is lower). Exit status 1 on FAIL.

--precision tf32 (or --tf32): our conv2 products in plain TF32 too, the precision PyTorch's timed modes allow
their convolutions; the parity run allows TF32 convolutions on both sides. --precision bf16: our conv2 and
fc1 products on bf16 operands, and PyTorch's every candidate under torch.autocast(dtype=torch.bfloat16).
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from .. import cuda, data, optim, reference
from ..cli import (
    Parser,
    add_optimizer_arguments,
    add_precision_arguments,
    batch_sizes,
    data_inputs,
    existing_dir,
    fits_gpu_or_exit,
    input_file,
    int_in_range,
    learning_rate,
    model_fits_or_fail,
    non_negative_at_most,
    output_path,
    refuse_clashes,
    require_matplotlib,
    seed,
    write_json,
)
from ..nets import KERNEL_VERSIONS, LOSS_CAPACITY
from ..sizes import DEFAULT_CHANNELS, DEFAULT_HIDDEN, MAX_SECONDS, MAX_TIMED
from ..training import DEFAULTS, RECIPES
from .parity import parity_options, run_parity
from .recipes import RECIPE_SEEDS, RECIPE_TORCH_MODES, format_recipe, recipe_modes, recipe_seeds, run_recipe
from .report import (
    SCHEMA,
    Unavailable,
    environment,
    format_tables,
    parity_words,
    require_torch_and_gpu,
    validate_result,
)
from .timing import RunFailed, run_timing

PROG = "compare_pytorch.py"
# the default --out: the checkout's benchmarks/results/ (an installed package has none: --out is needed)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
CHANNELS, HIDDEN = DEFAULT_CHANNELS, DEFAULT_HIDDEN  # the design's network, on both sides


def build_parser():
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
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


def show(args) -> int:
    try:
        result = json.loads(args.show.read_text())
        validate_result(result)
    except UnicodeDecodeError:
        return _fail(f"cannot show {args.show}: not a text file")
    except (OSError, ValueError) as e:
        return _fail(f"cannot show {args.show}: {e}")
    print(format_tables(result))
    if args.png is not None:
        from .plot import plot

        try:
            plot(result, args.png)
        except OSError as e:
            return _fail(f"cannot write {args.png}: {e}")
        print(f"\nplot: {args.png}")
    return 0


def _fail(message: str, status: int = 2) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return status


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def save_result(out: Path, result: dict) -> Path | None:
    """Write the result; where that fails, keep the run in a file of the system's temporary folder and say
    where (a measurement of minutes is never lost to a full disk or a folder removed meanwhile)."""
    import tempfile

    try:
        write_json(out, result, announce=False)
        return out
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix=f"{out.stem}-", suffix=".json")
        with open(fd, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")
        print(f"{PROG}: cannot write {out} ({e}); the result is kept in {spare}", file=sys.stderr)
        return None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.show is not None:
        if args.png is not None:
            require_matplotlib(parser, "--png")  # before reading: a missing matplotlib is a usage error
        return show(args)
    try:
        torch = require_torch_and_gpu()
    except Unavailable as e:
        return _fail(str(e))
    if args.steps < 100 or args.warmup < 20 or args.no_autotune or args.no_compile:
        print(
            f"{PROG}: note: fewer than 100 timed or 20 warm-up steps, or candidates skipped: a quick run, not a "
            "benchmark",
            file=sys.stderr,
        )
    channels, hidden = CHANNELS, HIDDEN
    for batch in args.batch_sizes:
        fits_gpu_or_exit(parser, channels, hidden, batch, args.kernels, args.precision, batch_flag="--batch-sizes")
    try:
        ds = data.load(args.dataset, args.data_dir, empty=cuda.pinned_empty)
    except data.DataError as e:
        return _fail(str(e), 1)
    ds.train_y64 = ds.train_y.astype(np.int64)  # torch's nll_loss wants int64 labels
    state = reference.init_state_dict(args.seed, channels, hidden)
    env = environment(torch)
    result = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python scripts/compare_pytorch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "env": env,
        "config": {
            "lr": args.lr,
            "seed": args.seed,
            "dataset": args.dataset,
            "steps": args.steps,
            "timing_window": args.timing_window,
            "warmup": args.warmup,
            "warmup_seconds": args.warmup_seconds,
            "kernels": args.kernels,
            "precision": args.precision,
            "channels": list(channels),
            "hidden": hidden,
            "batch_sizes": args.batch_sizes,
            "no_autotune": args.no_autotune,
            "no_compile": args.no_compile,
        },
        "batch_sizes": {},
        "parity": None,
    }
    if args.recipe:
        return _recipe(torch, ds, args, channels, hidden, env, result)
    if args.parity_only:
        return _parity_only(torch, ds, state, args, channels, hidden)
    out = args.out or RESULTS / f"compare-{_slug(env['device'])}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    try:
        for batch in args.batch_sizes:
            result["batch_sizes"][str(batch)] = run_timing(
                torch, ds, state, args, channels, hidden, batch, log, env["device"]
            )
    except RunFailed as e:  # the batch sizes done are kept
        result["failed"] = str(e)
        if result["batch_sizes"]:
            save_result(out, result)
        return _fail(
            f"{e}; nothing more was timed" + (f" (the batch sizes before it: {out})" if result["batch_sizes"] else ""),
            1,
        )
    if args.parity_steps:  # after the timed runs: its eager steps on a net of their own would slow ours
        log(f"parity: {args.parity_steps} steps at batch {args.batch_sizes[0]}")
        result["parity"] = run_parity(torch, ds, state, args, channels, hidden)
    print(format_tables(result))
    if (written := save_result(out, result)) is not None:
        print(f"\nresult: {written}")
    if not args.no_png and written is not None:
        _plot(result, args.png or out.with_suffix(".png"))
    if result["parity"] is not None and not result["parity"]["pass"]:
        return _fail("parity FAILED", 1)
    return 0 if written is not None else 1


def _plot(result, png):
    try:
        from .plot import plot

        plot(result, png)
        print(f"plot:   {png}")
    except ImportError:
        print("plot:   skipped (matplotlib not installed: pip install 'mnist-cuda[plot]')")
    except OSError as e:
        print(f"plot:   not written ({png}: {e})")


def _recipe(torch, ds, args, channels, hidden, env, result) -> int:
    result["recipe"] = run_recipe(torch, ds, args, channels, hidden, log)
    print(format_recipe(result["recipe"]))
    dataset = "" if args.dataset == "mnist" else f"-{args.dataset}"
    out = args.out or RESULTS / f"recipe-{args.recipe}{dataset}-{_slug(env['device'])}.json"
    if (written := save_result(out, result)) is None:
        return 1
    print(f"result: {written}")
    return 0


def _parity_only(torch, ds, state, args, channels, hidden) -> int:
    par = run_parity(torch, ds, state, args, channels, hidden)
    o = par["optimizer"]
    extra = (
        "".join(f", {k} {o[k]}" for k in ("momentum", "dampening", "weight_decay") if o[k])
        + (", nesterov" if o["nesterov"] else "")
        + (f", {o['schedule']} schedule" if o["schedule"] != "constant" else "")
    )
    print(
        f"parity ({par['steps']} steps, batch {par['batch_size']}, lr {par['lr']}{extra}, kernels {args.kernels}, "
        f"{parity_words(par)}): max |loss diff| first 50 {par['max_loss_diff_first_50']:.2e}, all "
        f"{par['max_loss_diff']:.2e} -> {'PASS' if par['pass'] else 'FAIL'}"
    )
    return 0 if par["pass"] else 1
