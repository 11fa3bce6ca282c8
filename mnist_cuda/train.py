"""Train the MNIST CNN on the GPU with our kernels:  python -m mnist_cuda.train [--help]

Every step (load, forward, loss, backward, SGD update, zero-grad) runs our CUDA kernels; by default the
whole step is one CUDA graph replayed per batch. Every PHASE_SAMPLE_EVERY-th step runs the same kernels
launched one by one with CUDA events between the phases, which gives the per-phase times of the summary.
The plan of the batches and the loop over them are mnist_cuda.training's; this module is the command around
them: its flags and their checks, resuming from a checkpoint, and what a run writes and prints.

Every flag, output path, --init checkpoint and named data folder is checked before any work starts; a
mistake is one line and exit status 2. A checkpoint records where training stands (the step count, the
epoch and how far into its shuffled order), so `--init` from it continues exactly as one longer run would.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from . import checkpoint, cli, cuda, curves, data, nets, optim, reference, sizes
from .nets import KERNEL_VERSIONS
from .training import DEFAULTS, RECIPES, Position, TrainingDiverged, plan, run_chunk

# what a checkpoint records and --init takes as this run's default (the model's shape comes from its arrays)
RESUMED = ("dataset", "batch_size", "lr", "seed", "kernels", "precision", "shuffle", "augment")


# how the summary line names a precision other than the default
PRECISION_WORDS = {"fp32": "", "tf32": ", conv2 in TF32", "bf16": ", conv2 and fc1 in bf16"}


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
        type=cli.int_in_range(1, sizes.MAX_STEPS, STEP_COUNTER),
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
        type=cli.number_between(0, 100, low_included=False),
        default=None,
        metavar="PERCENT",
        help="stop after the first epoch whose test accuracy reaches PERCENT and report the training "
        "time to there (evaluation timed apart)",
    )
    p.add_argument(
        "--batch-size",
        type=cli.int_in_range(1, sizes.MAX_BATCH, "the largest training set"),
        default=None,
        help=f"samples per training step; evaluation uses the same (default: {d['batch_size']}{from_init})",
    )
    p.add_argument(
        "--lr", type=cli.learning_rate, default=None, help=f"SGD learning rate (default: {d['lr']}{from_init})"
    )
    p.add_argument(
        "--seed",
        type=cli.seed,
        default=None,
        help=f"seeds the initialisation and the shuffling; 0 to {cli.SEED_MAX} (default: {d['seed']}{from_init})",
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
        type=cli.int_in_range(
            1, sizes.MAX_HIDDEN, "fc1's weight gradient in tiles of 64 outputs fills at most 65535 rows of CUDA's grid"
        ),
        default=None,
        help=f"fc1 width (default: {d['hidden']}, or the --init checkpoint's)",
    )
    p.add_argument(
        "--save",
        type=cli.output_path,
        default=None,
        metavar="PATH",
        help="write a checkpoint (.npz) here after every epoch, replacing the last one atomically",
    )
    p.add_argument(
        "--init",
        type=cli.input_file,
        default=None,
        metavar="PATH",
        help="start from this checkpoint (written by --save) and continue where it stopped",
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
        type=cli.int_in_range(0, sizes.MAX_STEPS, STEP_COUNTER),
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
        "so one file holds a continued run)",
    )
    p.add_argument(
        "--plot",
        type=cli.output_path,
        default=None,
        metavar="PNG",
        help="draw this run's loss per step and test accuracy per epoch here (needs matplotlib)",
    )
    p.add_argument(
        "--augment",
        type=cli.int_in_range(
            0, data.IMAGE_SIZE - 1, "more moves every image out of its 28x28 field; a few (1-3) is the usual"
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
    cli.add_optimizer_arguments(p)
    return p


@dataclasses.dataclass
class Setup:
    """Everything a run needs, checked: the resolved hyperparameters, the initial state, where to start."""

    dataset: str
    batch_size: int
    lr: float
    seed: int
    kernels: str
    precision: str
    shuffle: bool
    augment: int
    channels: tuple
    hidden: int
    state: dict
    start: Position
    steps: int
    optimizer: optim.SGDOptions
    buffers: dict  # momentum buffers from --init


@dataclasses.dataclass
class Resumed:
    """What an --init checkpoint brings: its state, the flags it recorded and where it stopped."""

    state: dict | None = None
    buffers: dict = dataclasses.field(default_factory=dict)
    flags: dict = dataclasses.field(default_factory=dict)  # RESUMED's keys that the record holds
    optimizer: dict = dataclasses.field(default_factory=dict)
    start: Position = Position()


def check(args, parser: cli.Parser) -> Setup:
    """Every user mistake as a usage error (exit 2), before any data, GPU or training work: flags that cannot
    work together or change nothing, sizes the kernels or the machine cannot take, outputs that would replace
    an input."""
    given = {k: v for k, v in vars(args).items() if v is not None and v is not False}  # before a recipe fills the rest
    if args.recipe and args.init:
        parser.fail("--recipe", "starts a run; a run continued with --init takes its settings from the checkpoint")
    for key, value in RECIPES.get(args.recipe, {}).items():  # a recipe fills the flags not given
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.epochs is None:
        args.epochs = DEFAULTS["epochs"]
    _refuse_flags_without_effect(parser, args, given)
    r = _resume(args, parser) if args.init is not None else Resumed()
    explicit = {
        "dataset": args.dataset,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "kernels": args.kernels,
        "precision": args.precision,
        "shuffle": args.shuffle,
        "augment": args.augment,
    }
    value = {k: explicit[k] if explicit[k] is not None else r.flags.get(k, DEFAULTS[k]) for k in RESUMED}
    _check_flags(args, parser, r, value)
    channels = args.channels or DEFAULTS["channels"]
    hidden = args.hidden or DEFAULTS["hidden"]
    train_samples, batch = data.TRAIN_SAMPLES[value["dataset"]], value["batch_size"]
    if batch > train_samples:
        parser.fail("--batch-size", f"{batch} is larger than the training set ({train_samples} samples)")
    from . import sizes

    blame = sizes.FLAGS if r.state is None else sizes.Blame("--init", "the --init checkpoint's model")
    cli.model_fits_or_fail(
        parser, channels, hidden, batch, (value["kernels"],), initialise=r.state is None, blame=blame
    )
    steps_per_epoch = train_samples // batch
    steps = args.epochs * steps_per_epoch if args.steps is None else args.steps
    planned = steps or args.epochs * steps_per_epoch  # (--steps 0 records the schedule of a run of --epochs)
    by_epochs = args.steps is None or args.steps == 0  # (--steps 0 plans a run of --epochs for the schedule)
    cli.fail_on(
        parser,
        sizes.steps_problem(
            r.start.step, planned, "--epochs" if by_epochs else "--steps", steps_per_epoch if by_epochs else None
        ),
    )
    if args.plot is not None:
        cli.require_matplotlib(parser, "--plot")
        cli.fits_host_or_fail(
            parser, "--plot", curves.plot_bytes(steps), f"drawing {steps:,} steps (the plot keeps every step's loss)"
        )
    state = r.state if r.state is not None else reference.init_state_dict(value["seed"], channels, hidden)
    options = _optimizer(args, parser, r, given, value["lr"], start_step=r.start.step, steps=steps, planned=planned)
    return Setup(
        channels=tuple(channels),
        hidden=hidden,
        state=state,
        start=r.start,
        steps=steps,
        optimizer=options,
        buffers=r.buffers if options.momentum else {},
        **value,
    )


# flags that change nothing with --steps 0, which only writes the initial checkpoint
NOT_WITH_STEPS_0 = ("metrics", "plot", "target_accuracy", "eager", "data_dir")


def _refuse_flags_without_effect(parser, args, given: dict):
    """A flag that cannot change anything with the other flags given is a usage error (the README's rule)."""
    if args.steps == 0:
        for key in NOT_WITH_STEPS_0:
            if key in given:
                parser.fail(_flag(key), "changes nothing with --steps 0, which only writes the initial checkpoint")
    if args.steps and "epochs" in given:
        parser.fail(
            "--epochs",
            f"changes nothing with --steps {args.steps}, which trains {args.steps} steps instead; give one of them",
        )


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _resume(args, parser) -> Resumed:
    """The --init checkpoint, checked: its model against --channels and --hidden, its record of the run."""
    try:
        state, meta, channels, hidden, buffers = checkpoint.load_model(args.init)
    except checkpoint.CheckpointError as e:
        parser.fail("--init", str(e))
    for flag, value, theirs in (("--channels", args.channels, channels), ("--hidden", args.hidden, hidden)):
        if value is not None and value != theirs:
            parser.fail(
                flag,
                f"the --init checkpoint {args.init} holds a model with --channels "
                f"{channels[0]},{channels[1]} --hidden {hidden}; leave {flag} out to use it",
            )
    args.channels, args.hidden = channels, hidden
    resumed = {k: meta[k] for k in RESUMED if k in meta}
    problem = _bad_record(resumed, meta)
    if problem is None and "tf32" in meta:  # a checkpoint from before --precision
        resumed["precision"] = cli.precision_of(meta)
    if problem:
        parser.fail(
            "--init",
            f"{args.init}'s record of the run is damaged ({problem}); start from a checkpoint "
            f"that --save wrote, or without --init",
        )
    start = _position(
        meta,
        resumed.get("batch_size", DEFAULTS["batch_size"]),
        data.TRAIN_SAMPLES[resumed.get("dataset", DEFAULTS["dataset"])],
    )
    return Resumed(state, buffers, resumed, meta.get("optimizer", {}), start)


def _check_flags(args, parser, r: Resumed, value: dict):
    """The resolved flags against each other, the checkpoint and the files."""
    if r.start.sample:  # inside an epoch: its order must stay the one the checkpoint was trained on
        for k in ("seed", "shuffle", "dataset"):
            if value[k] != r.flags.get(k, DEFAULTS[k]):
                parser.fail(
                    _flag(k),
                    f"the --init checkpoint stopped inside epoch {r.start.epoch + 1}; another {k} "
                    f"would splice two sample orders: continue with the checkpoint's, or from one "
                    f"that ends an epoch",
                )
    if value["dataset"] not in data.DATASETS:
        parser.fail("--init", f"the checkpoint names an unknown dataset {value['dataset']!r}; give --dataset")
    if value["augment"] >= data.IMAGE_SIZE:
        parser.fail(
            "--augment",
            f"{value['augment']} pixels would move every image out of its {data.IMAGE_SIZE}x"
            f"{data.IMAGE_SIZE} field; a few (1-3) is the usual",
        )
    if value["precision"] != "fp32" and value["kernels"] != "fast":
        parser.fail(
            "--precision", f"{value['precision']} needs --kernels fast (the naive kernels compute in plain fp32)"
        )
    if args.steps == 0 and args.save is None:
        parser.fail("--steps", "0 only writes the initial checkpoint, so it needs --save")
    cli.refuse_clashes(
        parser,
        inputs=[("--init", args.init)] + cli.data_inputs(value["dataset"], args.data_dir),
        outputs=[("--save", args.save), ("--metrics", args.metrics), ("--plot", args.plot)],
        allowed=[("--save", "--init")],
    )


def _optimizer(
    args, parser, r: Resumed, given: dict, lr: float, start_step: int, steps: int, planned: int
) -> optim.SGDOptions:
    """SGD's options from the flags given, the recipe and the checkpoint's record; a flag given that changes
    nothing is a usage error, a recorded value that changes nothing under the new flags is dropped."""
    flags = {k: getattr(args, k) for k in optim.ARGUMENTS}
    resumed = r.optimizer
    if flags["schedule"] not in (None, resumed.get("schedule")):  # a new schedule: none of the old one's
        resumed = {k: v for k, v in resumed.items() if k not in optim.SCHEDULE_ARGUMENTS}
    values = {k: flags[k] if flags[k] is not None else resumed.get(k) for k in optim.ARGUMENTS}
    problem = optim.unused(values, [k for k in optim.ARGUMENTS if k in given])
    if problem:
        parser.error(problem)
    values = {k: None if optim.unused(values, [k]) else v for k, v in values.items()}
    # a schedule continued from --init keeps its length; a new one spans the steps trained so far and this run's
    keep_total = values["schedule"] == resumed.get("schedule") and flags["schedule"] is None
    total = resumed.get("schedule_total", 0) if keep_total else start_step + planned
    try:
        options = optim.options_from(values, lr, total)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    if options.schedule.kind in ("cosine", "onecycle") and start_step + steps > total:
        parser.fail(
            "--epochs" if args.steps is None else "--steps",
            f"the {options.schedule.kind} schedule of {args.init} ends at step {total}; this run would train "
            f"to step {start_step + steps}: train at most {total - start_step} steps more, or give "
            f"--schedule to start a new one",
        )
    if args.steps == 0 and "epochs" in given and (keep_total or options.schedule.kind not in ("cosine", "onecycle")):
        parser.fail(
            "--epochs", "changes nothing with --steps 0 unless it sets the length of a new cosine or onecycle schedule"
        )
    return options


def _bad_record(resumed: dict, meta: dict) -> str | None:
    """What is wrong with a checkpoint's record of the run, if anything."""
    kinds = {
        "dataset": lambda v: v in data.DATASETS,
        "kernels": lambda v: v in KERNEL_VERSIONS,
        "batch_size": lambda v: type(v) is int and v >= 1,
        "seed": lambda v: type(v) is int and 0 <= v <= cli.SEED_MAX,
        "lr": lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0,
        "precision": lambda v: v in nets.PRECISIONS,
        "shuffle": lambda v: type(v) is bool,
        "augment": lambda v: type(v) is int and 0 <= v < data.IMAGE_SIZE,
    }
    for key, ok in kinds.items():
        if key in resumed and not ok(resumed[key]):
            return f"{key} {resumed[key]!r}"
    if "tf32" in meta and type(meta["tf32"]) is not bool:  # a checkpoint from before --precision
        return f"tf32 {meta['tf32']!r}"
    for key in ("step", "epoch", "epoch_index", "epoch_sample"):
        if key in meta and not (type(meta[key]) is int and meta[key] >= 0):
            return f"{key} {meta[key]!r}"
    o = meta.get("optimizer", {})
    if not isinstance(o, dict):
        return "optimizer"
    for key, ok in (
        ("momentum", _number),
        ("dampening", _number),
        ("weight_decay", _number),
        ("gamma", _number),
        ("pct_start", _number),
        ("nesterov", lambda v: type(v) is bool),
        ("schedule", lambda v: v in optim.SCHEDULES),
        ("anneal", lambda v: v in optim.ANNEALS),
        ("step_size", lambda v: type(v) is int and v >= 1),
        ("schedule_total", lambda v: type(v) is int and v >= 0),
    ):
        if key in o and not ok(o[key]):
            return f"optimizer {key} {o[key]!r}"
    return None


def _number(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v >= 0


def _position(meta: dict, batch_size: int, train_samples: int) -> Position:
    """Where a checkpoint's run stood. A checkpoint that records only its step count (written before the
    epoch's place was recorded) was trained from step 0 at its batch size: the place follows from the count."""
    step = meta.get("step", 0)
    if "epoch_index" in meta:
        return Position(step, meta["epoch_index"], meta.get("epoch_sample", 0))
    steps_per_epoch = train_samples // batch_size
    return Position(step, step // steps_per_epoch, step % steps_per_epoch * batch_size)


def checkpoint_meta(s: Setup, at: Position, **extra) -> dict:
    return {
        "dataset": s.dataset,
        "channels": list(s.channels),
        "hidden": s.hidden,
        "seed": s.seed,
        "lr": s.lr,
        "batch_size": s.batch_size,
        "kernels": s.kernels,
        "precision": s.precision,
        "shuffle": s.shuffle,
        "augment": s.augment,
        "step": at.step,
        "epoch_index": at.epoch,
        "epoch_sample": at.sample,
        "optimizer": optim.describe(s.optimizer),
        **extra,
    }


def train(args, parser) -> int:
    s = check(args, parser)
    prog = parser.prog
    if args.steps == 0:
        checkpoint.save_checkpoint(
            args.save,
            {**s.state, **{checkpoint.MOMENTUM_PREFIX + k: v for k, v in s.buffers.items()}},
            checkpoint_meta(s, s.start),
        )
        print(f"wrote the initial checkpoint to {args.save}")
        return 0
    cli.check_data_dir_or_exit(prog, s.dataset, args.data_dir)
    cli.gpu_or_exit(prog)  # before a download
    cli.fits_gpu_or_exit(
        parser,
        s.channels,
        s.hidden,
        s.batch_size,
        s.kernels,
        s.precision,
        momentum=s.optimizer.momentum > 0,
        augment=s.augment > 0,
    )
    arrays = cli.load_data_or_exit(prog, s.dataset, args.data_dir, args.quiet)
    from .nets import Parameters, make_net
    from .step import PHASES, Step, phase_times_ms

    ds = data.host_data(s.dataset, arrays, empty=cuda.pinned_empty)
    params = Parameters(s.channels, s.hidden)
    params.load_state_dict(s.state)
    optimizer = optim.Optimizer(params, s.optimizer, s.start.step, s.buffers)
    step = Step(
        make_net(params, s.batch_size, s.kernels, s.precision),
        optimizer,
        mode="eager" if args.eager else "graph",
        augment=s.augment,
        seed=s.seed,
        first_step=s.start.step,
    )
    chunks = plan(len(ds.train_x), s.batch_size, s.seed, s.shuffle, s.start, s.steps)
    if args.metrics and args.init:
        _keep_metrics_until(args.metrics, s.start.step)
    metrics = open(args.metrics, "a" if args.init else "w") if args.metrics else None
    from tqdm import tqdm

    phase_events = []  # one list of len(PHASES) + 1 events per sampled step of the chunk in progress
    phase_sum, phase_count = np.zeros(len(PHASES)), 0  # the sampled steps' phase times so far, ms
    plotted = []  # (steps, losses) of each chunk, for --plot
    evals = []  # (step, epoch, test accuracy) of each epoch, for --plot
    at, saved = s.start, None  # where training stands; the last checkpoint written
    epoch = s.start.epoch  # the epoch in progress
    reached = None  # (epoch, training seconds, evaluation seconds) when --target-accuracy was reached
    train_seconds = eval_seconds = 0.0
    accuracy = float("nan")
    try:
        for chunk in chunks:
            first, epoch = chunk.first_step, chunk.epoch
            bar = tqdm(
                total=len(chunk.batches),
                desc=f"epoch {chunk.epoch + 1}",
                unit="step",
                disable=args.quiet,
                leave=True,
                dynamic_ncols=True,
            )
            t0 = time.perf_counter()

            def progress(done, losses):
                bar.set_postfix(
                    loss=f"{losses[-1]:.4f}", img_s=f"{done * s.batch_size / (time.perf_counter() - t0):,.0f}"
                )
                bar.update(done - bar.n)

            losses = run_chunk(step, ds, chunk, progress, phase_events)
            epoch_seconds = time.perf_counter() - t0
            times = phase_times_ms(phase_events)  # (the chunk's steps are done: this waits for nothing)
            phase_sum, phase_count = phase_sum + times.sum(axis=0), phase_count + len(times)
            phase_events.clear()
            train_seconds += epoch_seconds
            bar.close()
            at = chunk.end
            t1 = time.perf_counter()
            accuracy = step.evaluate(ds.test_x, ds.test_y)
            eval_seconds += time.perf_counter() - t1
            lines = [{"step": first + j + 1, "epoch": chunk.epoch + 1, "loss": float(v)} for j, v in enumerate(losses)]
            lines.append({"step": at.step, "epoch": chunk.epoch + 1, "test_accuracy": accuracy})
            if args.plot:
                plotted.append((np.arange(first + 1, first + len(losses) + 1), losses))
                evals.append((at.step, chunk.epoch + 1, accuracy))
            if metrics:
                metrics.write("".join(json.dumps(d) + "\n" for d in lines))
                metrics.flush()
            print(
                f"epoch {chunk.epoch + 1}: test accuracy {accuracy * 100:.2f}%  loss {losses[-1]:.4f}  "
                f"{len(chunk.batches) * s.batch_size / epoch_seconds:,.0f} img/s"
            )
            if args.save:
                checkpoint.save_checkpoint(
                    args.save,
                    {**params.state_dict(), **optimizer.buffer_state()},
                    checkpoint_meta(s, at, test_accuracy=accuracy),
                )
                saved = at
            if args.target_accuracy is not None and 100 * accuracy >= args.target_accuracy:
                reached = (epoch + 1, train_seconds, eval_seconds)
                break
    except TrainingDiverged as e:
        print(f"{prog}: {e}; stopping." + _where_saved(args, saved), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted in epoch {epoch + 1}." + _where_saved(args, saved), file=sys.stderr)
        return 130
    finally:
        if metrics:
            metrics.close()

    done = at.step - s.start.step
    phases = dict(zip(PHASES, (phase_sum / phase_count).tolist())) if phase_count else {}
    print(
        f"\ntest accuracy {accuracy * 100:.2f}% after {done} steps"
        f"{f' (step {at.step} in all)' if s.start.step else ''} "
        f"({s.dataset}, batch {s.batch_size}, lr {s.lr}{_optimizer_words(s.optimizer)}, seed {s.seed}"
        f"{f', images shifted by up to {s.augment} px' if s.augment else ''}"
        f"{PRECISION_WORDS[s.precision]})"
    )
    print(
        f"training wall time {train_seconds:.2f} s, {done * s.batch_size / train_seconds:,.0f} img/s "
        f"({'eager launches' if args.eager else 'CUDA graph per step'}); evaluation {eval_seconds:.2f} s"
    )
    if phases:
        print(
            f"per-phase mean, {phase_count} sampled steps, eager launches with CUDA events: "
            + ", ".join(f"{k} {v * 1000:.1f} us" for k, v in phases.items())
            + (" (fast kernels: zero-grad is fused into the update)" if s.kernels == "fast" else "")
        )
    if args.target_accuracy is not None:
        print(
            f"target {args.target_accuracy:g}%: "
            + (
                f"reached in epoch {reached[0]} after {reached[1]:.3f} s of training (evaluation {reached[2]:.3f} s "
                f"more, not counted)"
                if reached
                else "not reached"
            )
        )
    if args.save:
        print(f"checkpoint: {args.save}")
    if args.plot:
        run = curves.Curves(np.concatenate([st for st, _ in plotted]), np.concatenate([ls for _, ls in plotted]), evals)
        curves.plot_training(run, args.plot, title=f"{s.dataset}, batch {s.batch_size}, lr {s.lr}, seed {s.seed}")
        print(f"plot: {args.plot}")
    return 0


def _keep_metrics_until(path: Path, step: int):
    """A continued run appends to its metrics file: first drop the records of steps after the checkpoint (an
    earlier continuation, or an epoch interrupted after its records were written), atomically, a line at a
    time (the file may be long)."""
    if not path.is_file():
        return

    def copy_kept(out):
        with open(path, errors="replace") as lines:
            for line in lines:
                try:
                    keep = json.loads(line)["step"] <= step
                except (ValueError, KeyError, TypeError):
                    keep = True  # not ours to judge: leave it
                if keep:
                    out.write(line.encode())

    cli.write_atomic(path, copy_kept)


def _optimizer_words(o: optim.SGDOptions) -> str:
    words = [f"momentum {o.momentum:g}" + (" (Nesterov)" if o.nesterov else "")] if o.momentum else []
    words += [f"dampening {o.dampening:g}"] if o.dampening else []
    words += [f"weight decay {o.weight_decay:g}"] if o.weight_decay else []
    words += [f"{o.schedule.kind} schedule"] if o.schedule.kind != "constant" else []
    return "".join(", " + w for w in words)


def _where_saved(args, saved: Position | None) -> str:
    if args.save is None:
        return " Nothing was saved (no --save)."
    if saved is None:
        return f" No checkpoint was written yet; {args.save} was left as it was."
    return (
        f" The last checkpoint, {args.save}, holds step {saved.step} (written at the end of an epoch) and is "
        f"intact: continue with --init {args.save}"
    )


def main(argv=None) -> int:
    return cli.run(build_parser(), train, argv)


if __name__ == "__main__":
    sys.exit(main())
