"""What every command line of the project shares: a parser whose errors are one line (exit 2), argparse
types that reject bad input before any work starts (mnist_cuda.cli_types', re-exported here), the checks that
need several flags or the machine, and the atomic writes of result files.

A user mistake costs one line on stderr, `PROG: error: WHAT (see PROG --help)`, and exit status 2, never a
traceback and never a half-written file: outputs are checked when the flags are parsed (their folder exists
and is writable, the path is not a folder) and written through a temporary file renamed into place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

# the argument types: the commands name them as cli.X, so those cli does not use itself are re-exported
from .cli_types import FLOAT32_MAX as FLOAT32_MAX
from .cli_types import SEED_MAX as SEED_MAX
from .cli_types import batch_sizes as batch_sizes
from .cli_types import choice_of, int_in_range, non_negative, number_between, on_off, positive_number, value_list
from .cli_types import existing_dir as existing_dir
from .cli_types import input_file as input_file
from .cli_types import int_at_least as int_at_least
from .cli_types import learning_rate as learning_rate
from .cli_types import model_counts as model_counts
from .cli_types import non_negative_at_most as non_negative_at_most
from .cli_types import one_value as one_value
from .cli_types import output_path as output_path
from .cli_types import seed as seed
from .cli_types import shorten as shorten
from .paths import write_atomic


def prog_name(module: str) -> str:
    """The name a command was started by: its console script (mnist-cuda-train) or `python -m module`."""
    started_as = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return started_as if started_as.startswith("mnist-cuda-") else f"python -m {module}"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Ends a flag's help with "(default: X)" only where the help does not already state its default
    ("(default" or "default:") and there is one to state: not None, not an empty string, and not for a
    switch (a flag that takes no value: its default is the other switch's, or off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        stated = "(default" in text or "default:" in text
        nothing = action.default is None or action.default == "" or action.nargs == 0
        if stated or nothing:
            return text
        return super()._get_help_string(action)


# A value that starts with "-" but is a number (-1e-3, -.5, -inf) is a value, not a flag: argparse's own
# pattern knows only -5 and -0.5, and says "expected one argument" for the rest.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block of a long command buries the message) that reads
    negative numbers as values, so a range check can say what is wrong with them."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def fail(self, flag: str, message: str):
        """A mistake in one flag's value found after parsing (it needs another flag or a file to see)."""
        self.error(f"argument {flag}: {message}")


def add_precision_arguments(p: Parser, default: str):
    """--precision and its shorthand --tf32 (one or the other); `default` ends the help text."""
    from .nets import PRECISIONS

    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the tensor-core products' precision (fast kernels only for tf32 and bf16): fp32 keeps "
        "float32's accuracy (3xTF32, ~1e-6 relative error); tf32 runs conv2 in plain TF32, as "
        "PyTorch's cuDNN convolutions by default (~3e-4); bf16 runs conv2 and fc1 on bf16 "
        "operands and stores conv2's input and output, fc1's input, and their gradients as bf16, as "
        "torch.autocast(dtype=torch.bfloat16) (~3e-3); every product accumulates "
        f"in float32 ({default})",
    )
    group.add_argument(
        "--tf32", dest="precision", action="store_const", const="tf32", help="the same as --precision tf32"
    )


def add_optimizer_arguments(parser, lists: bool = False):
    """SGD's flags (mnist_cuda.optim's options), for the trainer and the comparison. lists: each flag takes a
    list of values A,B,... (a tuple; the trainer's models are the cross product of its lists), and --nesterov
    takes on,off."""
    from .optim import ANNEALS, SCHEDULES

    each = value_list if lists else (lambda parse: parse)
    title = "optimizer (torch.optim.SGD's options; the defaults are plain SGD"
    g = parser.add_argument_group(title + ("; each takes a list A,B,...: a model per value)" if lists else ")"))
    g.add_argument(
        "--momentum",
        type=each(number_between(0, 1, high_included=False)),
        default=None,
        help="momentum factor (default: 0)",
    )
    g.add_argument(
        "--dampening",
        type=each(non_negative),
        default=None,
        help="dampening of the momentum (needs --momentum > 0; default: 0)",
    )
    nesterov = "Nesterov momentum (needs --momentum > 0 and no dampening; default: off)"
    if lists:
        g.add_argument(
            "--nesterov",
            nargs="?",
            type=value_list(on_off),
            const=(True,),
            default=None,
            metavar="on,off",
            help=nesterov,
        )
        g.add_argument(
            "--no-nesterov", dest="nesterov", action="store_const", const=(False,), help="the same as --nesterov off"
        )
    else:
        g.add_argument("--nesterov", action=argparse.BooleanOptionalAction, default=None, help=nesterov)
    g.add_argument(
        "--weight-decay", type=each(non_negative), default=None, help="L2 penalty added to the gradient (default: 0)"
    )
    g.add_argument(
        "--schedule",
        **_choices(SCHEDULES, lists),
        default=None,
        help="learning-rate schedule over the run's steps, computed on the GPU: constant, step "
        "(x --gamma every --step-size steps), cosine (to 0 at the last step), onecycle (warm up "
        "from lr/25 to lr over --pct-start of the steps, then anneal to lr/25e4) (default: constant)",
    )
    g.add_argument(
        "--step-size",
        type=each(int_in_range(1, 2**31 - 1)),
        default=None,
        help="the step schedule's period in steps (needs --schedule step)",
    )
    g.add_argument(
        "--gamma",
        type=each(positive_number),
        default=None,
        help="the step schedule's factor (needs --schedule step; default: 0.1)",
    )
    g.add_argument(
        "--pct-start",
        type=each(number_between(0, 1, False, False)),
        default=None,
        help="the share of the steps that warm up (needs --schedule onecycle; default: 0.3)",
    )
    g.add_argument(
        "--anneal",
        **_choices(ANNEALS, lists),
        default=None,
        help="the annealing curve (needs --schedule onecycle; default: cos)",
    )


def _choices(choices, lists: bool) -> dict:
    """A flag's argparse keywords for one of `choices`, or (lists) a list of them."""
    if not lists:
        return {"choices": choices}
    return {"type": value_list(choice_of(choices)), "metavar": "{" + ",".join(choices) + "}"}


def precision_of(record: dict, default: str = "fp32") -> str:
    """The precision a checkpoint's record of the run names; one from before --precision says tf32 or not."""
    if "precision" in record:
        return record["precision"]
    return "tf32" if record.get("tf32") is True else default


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path after links are resolved, or one file (one inode)
    reached through a hard link."""
    a, b = Path(a), Path(b)
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:  # one of them does not exist yet
        pass
    return a.resolve() == b.resolve()


def refuse_clashes(parser: Parser, inputs=(), outputs=(), allowed=()):
    """A usage error where an output would replace an input (or another output): (flag, path) pairs, a path
    None where the flag is not given, or a list of paths for a flag that takes several. allowed: (output
    flag, input flag) pairs that may name one file (a checkpoint continued and replaced in place)."""

    def each(pairs):
        for flag, value in pairs:
            for path in value if isinstance(value, (list, tuple)) else [value]:
                if path is not None:
                    yield flag, Path(path)

    outs, ins = list(each(outputs)), list(each(inputs))
    for i, (flag, path) in enumerate(outs):
        for other, other_path in ins + outs[:i]:
            if (flag, other) not in allowed and same_file(path, other_path):
                what = "read as" if (other, other_path) in ins else "also written as"
                parser.fail(
                    flag, f"{path} is the file {what} {other}; writing it would destroy that: name another file"
                )


def fail_on(parser: Parser, problem) -> None:
    """A usage error for a (flag, message) that mnist_cuda.sizes found, if any."""
    if problem:
        parser.fail(*problem)


def model_fits_or_fail(
    parser: Parser,
    channels,
    hidden,
    batch: int,
    kernels=("naive", "fast"),
    batch_flag: str = "--batch-size",
    initialise: bool = True,
    blame=None,
) -> None:
    """The model and batch size within what the kernels take and, where its weights are to be drawn
    (initialise: the trainer's flags make the model), the host's memory: checked before anything is
    allocated. blame: a sizes.Blame, whom a problem with the model blames (default: the trainer's flags)."""
    from . import sizes

    blame = blame or sizes.FLAGS
    fail_on(parser, sizes.model_problem(channels, hidden, blame))
    fail_on(parser, sizes.batch_problem(channels, hidden, batch, batch_flag, kernels, blame=blame))
    if initialise:
        fail_on(parser, sizes.host_problem(channels, hidden))


def fits_host_or_fail(parser: Parser, flag: str, need: int, what: str) -> None:
    """A usage error where `what` needs more than the host's available memory (need bytes)."""
    from . import sizes

    available = sizes.available_host_bytes()
    if available is not None and need > available:
        parser.fail(
            flag,
            f"{what} needs about {need / 1e9:.1f} GB of memory; this machine has {available / 1e9:.1f} GB available",
        )


def fits_gpu_or_exit(
    parser: Parser,
    channels,
    hidden,
    batch: int,
    kernels: str,
    precision: str,
    momentum: bool = False,
    augment: bool = False,
    batch_flag: str = "--batch-size",
    blame=None,
) -> None:
    """Once the GPU is known and before the first buffer: the net's buffers fit its free memory and, where a
    buffer holds a part per SM, the 32-bit indexing on this GPU. blame: as model_fits_or_fail's."""
    from . import cuda, sizes

    cp = cuda.require_gpu()
    free, _ = cp.cuda.Device().mem_info
    fail_on(
        parser,
        sizes.device_problem(
            channels,
            hidden,
            batch,
            kernels,
            precision,
            momentum,
            augment,
            free,
            cuda.sm_count(),
            batch_flag,
            blame or sizes.FLAGS,
        ),
    )


def data_inputs(dataset: str, data_dir=None, test_only: bool = False) -> list:
    """(label, files) of a data set's files where a run reads them, for refuse_clashes: the named folder's
    (--data-dir, else $MNIST_DATA_DIR), else the cache's."""
    from . import data

    named = data_dir if data_dir is not None else os.environ.get("MNIST_DATA_DIR") or None
    folder = Path(named) if named else data.default_cache_dir()
    label = ("--data-dir" if data_dir is not None else "$MNIST_DATA_DIR") if named else f"the {dataset} cache"
    return [(label, data.present_files(dataset, folder, test_only))]


def write_json(path: Path, obj, announce: bool = True) -> None:
    """Write obj as indented JSON atomically."""
    write_atomic(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()))
    if announce:
        print(f"result: {path}")


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure to path (PNG) atomically."""
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))


def require_matplotlib(parser: Parser, flag: str):
    """matplotlib with the Agg backend, or a usage error naming the extra to install (before any work)."""
    try:
        import matplotlib
    except ImportError:
        parser.fail(flag, "needs matplotlib: pip install '.[plot]' in the source folder, or pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def interrupt_deferred():
    """Ctrl-C (SIGINT) held until the block ends, then handled as the handler before would have: what the block writes
    and what it records of it stay together. Where SIGINT is ignored, or its handler is not Python's, or outside the
    main thread (where no handler can be set), the block runs as it is. A SIGINT caught while the block raises is
    dropped: the block's own exception ends the run."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (None, signal.SIG_IGN):
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not caught:
        return
    if previous == signal.SIG_DFL:  # the default action: the signal again, now unblocked
        os.kill(os.getpid(), signal.SIGINT)
    else:  # Python's default handler raises KeyboardInterrupt
        previous(signal.SIGINT, caught[0])


def run(parser: Parser, work, argv=None) -> int:
    """Parse argv and return work(args, parser)'s exit status; Ctrl-C before work handles it is one line
    and exit status 130."""
    args = parser.parse_args(argv)
    try:
        return work(args, parser)
    except KeyboardInterrupt:
        print(f"\n{parser.prog}: interrupted", file=sys.stderr)
        return 130


def check_data_dir_or_exit(prog, dataset, data_dir, test_only=False):
    """A named data folder (--data-dir or $MNIST_DATA_DIR) that is missing or lacks a file is a user
    mistake: one line, exit 2, before the GPU or a download is tried."""
    from . import data

    try:
        data.named_dir(dataset, data_dir, test_only)
    except data.DataDirError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)


def load_data_or_exit(prog, dataset, data_dir, quiet, test_only=False):
    """The dataset's four verified arrays; a named folder whose files do not verify is a user mistake
    (exit 2), a failed download not (exit 1)."""
    from . import data

    try:
        return data.load_arrays(dataset, data_dir, progress=not quiet, test_only=test_only)
    except data.DataDirError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except data.DataError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(1)


def gpu_or_exit(prog):
    """Exit 2 with one line saying what to install where CuPy or a CUDA device is missing."""
    from . import cuda

    try:
        cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)
