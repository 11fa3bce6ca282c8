"""What every command line of the project shares: a parser whose errors are one line (exit 2), argparse
types that reject bad input before any work starts, and the atomic writes of result files.

A user mistake costs one line on stderr, `PROG: error: WHAT (see PROG --help)`, and exit status 2, never a
traceback and never a half-written file: outputs are checked when the flags are parsed (their folder exists
and is writable, the path is not a folder) and written through a temporary file renamed into place.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

SEED_MAX = 2 ** 32 - 1  # NumPy seeds any whole number >= 0; we document 32 bits, as torch.manual_seed reads them


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


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the usage block of a long command buries the message."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def fail(self, flag: str, message: str):
        """A mistake in one flag's value found after parsing (it needs another flag or a file to see)."""
        self.error(f"argument {flag}: {message}")


def add_precision_arguments(p: Parser, default: str):
    """--precision and its shorthand --tf32 (one or the other); `default` ends the help text."""
    from .nets import PRECISIONS
    group = p.add_mutually_exclusive_group()
    group.add_argument("--precision", choices=PRECISIONS, default=None,
                       help="the tensor-core products' precision (fast kernels only for tf32 and bf16): fp32 keeps "
                            "float32's accuracy (3xTF32, ~1e-6 relative error); tf32 runs conv2 in plain TF32, as "
                            "PyTorch's cuDNN convolutions by default (~3e-4); bf16 runs conv2 and fc1 on bf16 "
                            "operands, as torch.autocast(dtype=torch.bfloat16) (~3e-3); every product accumulates "
                            f"in float32 ({default})")
    group.add_argument("--tf32", dest="precision", action="store_const", const="tf32",
                       help="the same as --precision tf32")


def precision_of(record: dict, default: str = "fp32") -> str:
    """The precision a checkpoint's record of the run names; one from before --precision says tf32 or not."""
    if "precision" in record:
        return record["precision"]
    return "tf32" if record.get("tf32") is True else default


def int_at_least(minimum: int):
    """An argparse type: a whole number >= minimum (argparse names the flag in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def seed(text):
    """A seed: a whole number from 0 to SEED_MAX."""
    value = int_at_least(0)(text)
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {SEED_MAX} (32 bits), got {value}")
    return value


def positive_number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


learning_rate = positive_number


def non_negative(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def batch_sizes(text: str) -> list[int]:
    """--batch-sizes: positive whole numbers separated by commas."""
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers separated by commas (e.g. 64,512), "
                                         f"got {text!r}")
    return sizes


def output_path(text: str) -> Path:
    """A file to write, checked now rather than after the work: its folder exists and is writable, and the
    path is not a folder (nor an existing file we may not replace)."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if not text or text.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{text!r} names no file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {folder} does not exist" if not folder.exists()
                                         else f"{folder} is not a folder")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a device or a pipe?); name a file")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def input_file(text: str) -> Path:
    """A file to read: it exists, is a file and is readable."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not readable")
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {text} does not exist" if not path.exists()
                                         else f"{text} is not a folder")
    return path


def write_atomic(path: Path, write) -> None:
    """Call write(file object, binary) on a temporary file beside path, then rename it into place: a failed
    or interrupted write leaves whatever was at path before."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; a result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
