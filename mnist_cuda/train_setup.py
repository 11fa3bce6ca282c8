"""The checks of `python -m mnist_cuda.train` before any work starts: the flags resolved against the recipe,
the defaults and an --init checkpoint's record into a Setup (everything a run needs), and every user mistake
among them (flags that cannot work together or change nothing, sizes the kernels or the machine cannot take,
outputs that would replace an input, a damaged checkpoint record) as a usage error, exit 2."""

from __future__ import annotations

import dataclasses
import math

from . import checkpoint, cli, curves, data, nets, optim, reference, sizes
from .nets import KERNEL_VERSIONS
from .training import DEFAULTS, RECIPES, Position

# what a checkpoint records and --init takes as this run's default (the model's shape comes from its arrays)
RESUMED = ("dataset", "batch_size", "lr", "seed", "kernels", "precision", "shuffle", "augment")


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
