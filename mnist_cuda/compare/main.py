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

from .. import cuda, data, reference
from ..cli import (
    fits_gpu_or_exit,
    require_matplotlib,
    write_json,
)
from .arguments import CHANNELS, HIDDEN, PROG, RESULTS, check_arguments
from .arguments import build_parser as _build_parser
from .parity import run_parity
from .recipes import format_recipe, run_recipe
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


def build_parser():
    return _build_parser(__doc__.split("\n\n")[0])


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
