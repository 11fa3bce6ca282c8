"""The argparse types of the command lines: each turns a flag's text into its value or rejects it with an
argparse.ArgumentTypeError (which the parser reports as one line, exit 2) before any work starts: whole
numbers and numbers in their ranges (seeds, float32 rates and factors, batch sizes), files to write (their
folder exists and is writable), files and folders to read. mnist_cuda.cli re-exports them: the commands name
them as cli.output_path and so on."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .paths import UNREACHABLE, kind_of, os_error

SEED_MAX = 2**32 - 1  # NumPy seeds any whole number >= 0; we document 32 bits, as torch.manual_seed reads them


def int_at_least(minimum: int):
    """An argparse type: a whole number >= minimum (argparse names the flag in the error)."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {shorten(text)!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {shorten(text)}")
        return value

    return parse


def int_in_range(minimum: int, maximum: int, why: str = ""):
    """An argparse type: a whole number from minimum to maximum (a size the machine can hold); why, if given,
    says where the maximum comes from."""
    at_least = int_at_least(minimum)

    def parse(text):
        value = at_least(text)
        if value > maximum:
            because = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"must be at most {maximum}{because}, got {shorten(text)}")
        return value

    return parse


def shorten(text: str) -> str:
    """A value as an error message quotes it: at most 24 characters of it."""
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"


def seed(text):
    """A seed: a whole number from 0 to SEED_MAX."""
    value = int_at_least(0)(text)
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {SEED_MAX} (32 bits), got {value}")
    return value


# The kernels take rates and factors as float32: a larger value would reach them as infinity.
FLOAT32_MAX = 3.4028234663852886e38


def _number(text) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {shorten(text)!r}") from None


def _float32(value: float, text: str) -> float:
    if value > FLOAT32_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {FLOAT32_MAX:.4g} (the kernels take it as a float32), got {shorten(text)}"
        )
    return value


def positive_number(text):
    """A finite number > 0 that a float32 holds."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {shorten(text)}")
    return _float32(value, text)


learning_rate = positive_number


def non_negative(text):
    """A finite number >= 0 that a float32 holds."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {shorten(text)}")
    return _float32(value, text)


def number_between(low: float, high: float, low_included: bool = True, high_included: bool = True):
    """An argparse type: a finite number from low to high, each end included or not (a factor with a range of
    its own: a momentum, a share of the steps, a percentage)."""
    lower = f"at least {low:g}" if low_included else f"more than {low:g}"
    upper = f"at most {high:g}" if high_included else f"less than {high:g}"

    def parse(text):
        value = _number(text)
        above = value >= low if low_included else value > low
        below = value <= high if high_included else value < high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(f"must be {lower} and {upper}, got {shorten(text)}")
        return value

    return parse


def non_negative_at_most(maximum: float):
    """An argparse type: a finite number from 0 to maximum."""

    def parse(text):
        value = _number(text)
        if not (math.isfinite(value) and value >= 0):
            raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {shorten(text)}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {shorten(text)}")
        return value

    return parse


def batch_sizes(text: str) -> list[int]:
    """--batch-sizes: whole numbers from 1 to the largest training set (sizes.MAX_BATCH), separated by commas."""
    from .sizes import MAX_BATCH

    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive whole numbers separated by commas (e.g. 64,512), got {shorten(text)!r}"
        )
    if max(sizes) > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"{max(sizes)} is larger than any training set ({MAX_BATCH} samples)")
    return sizes


def model_counts(text: str) -> list:
    """--models of the many-model benchmark: whole numbers from 1 to model_grid.MAX_MODELS, or "max" (the most
    that fit, known once the GPU is), separated by commas."""
    from .model_grid import MAX_MODELS

    words = [w.strip() for w in text.split(",")]
    try:
        counts = [w if w == "max" else int(w) for w in words]
    except ValueError:
        counts = []
    if not counts or min((c for c in counts if c != "max"), default=1) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive whole numbers or max, separated by commas (e.g. 1,8,64,max), got {shorten(text)!r}"
        )
    if max((c for c in counts if c != "max"), default=1) > MAX_MODELS:
        raise argparse.ArgumentTypeError(f"at most {MAX_MODELS:,} models train at once, got {shorten(text)}")
    return counts


def output_path(text: str) -> Path:
    """A file to write, checked now rather than after the work: its folder exists and is writable, and the
    path is not a folder (nor an existing file we may not replace)."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if not text or text.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{shorten(text)!r} names no file")
    kind, folder_kind = kind_of(path), kind_of(folder)
    if "unusable" in (kind, folder_kind):
        raise argparse.ArgumentTypeError(f"{text}: {os_error(path if kind == 'unusable' else folder)}")
    if "unreachable" in (kind, folder_kind):
        raise argparse.ArgumentTypeError(f"{text} cannot be reached ({UNREACHABLE})")
    if kind == "folder":
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it")
    if folder_kind != "folder":
        raise argparse.ArgumentTypeError(
            f"the folder {folder} does not exist" if folder_kind == "missing" else f"{folder} is not a folder"
        )
    if kind == "other":
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a device or a pipe?); name a file")
    if not os.access(folder, os.W_OK | os.X_OK) or (kind == "file" and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def _reachable_kind(text: str, named: str) -> str:
    """kind_of(text), where it names something that is there; else the argparse error, naming it `named`."""
    kind = kind_of(text)
    if kind == "missing":
        raise argparse.ArgumentTypeError(f"{named} does not exist")
    if kind == "unusable":
        raise argparse.ArgumentTypeError(f"{named}: {os_error(text)}")
    if kind == "unreachable":
        raise argparse.ArgumentTypeError(f"{named} cannot be reached ({UNREACHABLE})")
    return kind


def input_file(text: str) -> Path:
    """A file to read: it exists, is a regular file and is readable."""
    kind = _reachable_kind(text, text)
    if kind == "folder":
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if kind == "other":
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a device or a pipe?); name a file")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not readable")
    return Path(text)


def existing_dir(text: str) -> Path:
    """A folder to read: it exists and may be listed and searched."""
    kind = _reachable_kind(text, f"the folder {text}")
    if kind != "folder":
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    if not os.access(text, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"the folder {text} cannot be read (permission denied)")
    return Path(text)


MAX_LIST = 4096  # values in one flag's list (each is a model of the run, times the other lists)


def value_list(parse, ranges: bool = False):
    """An argparse type: one or more values of `parse` separated by commas, as a tuple in the order given;
    with ranges, whole numbers may come as A-B (both included), so --seed 0-15 is sixteen seeds. The models
    of a trainer's run are the cross product of its lists (mnist_cuda.model_grid)."""

    def parse_list(text):
        values = []
        for part in text.split(","):
            if ranges and "-" in part.strip().lstrip("-"):
                values += _whole_range(part.strip(), parse, MAX_LIST - len(values))
            else:
                values.append(parse(part.strip()))
            if len(values) > MAX_LIST:
                raise argparse.ArgumentTypeError(f"at most {MAX_LIST} values, got more in {shorten(text)!r}")
        return tuple(values)

    return parse_list


def _whole_range(text: str, parse, room: int) -> list:
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B, two whole numbers, got {shorten(text)!r}") from None
    if b < a:
        raise argparse.ArgumentTypeError(f"the range {text} is empty: write the smaller number first")
    if b - a + 1 > room:
        raise argparse.ArgumentTypeError(f"the range {shorten(text)} has {b - a + 1:,} values, at most {MAX_LIST}")
    return [parse(str(v)) for v in range(a, b + 1)]


def one_value(parse, why: str = "the models of a run share it"):
    """An argparse type: `parse`'s one value, where a list (a comma) is a mistake; why says why it is one."""

    def parse_one(text):
        if "," in text:
            raise argparse.ArgumentTypeError(f"takes one value ({why}), got the list {shorten(text)!r}")
        return parse(text)

    return parse_one


def on_off(text: str) -> bool:
    """on/off (also true/false, yes/no, 1/0) as a bool."""
    words = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}
    try:
        return words[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on or off, got {shorten(text)!r}") from None


def choice_of(choices):
    """An argparse type: one of `choices` (for a list of them, where argparse's own check sees the tuple)."""

    def parse(text):
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {shorten(text)!r}")
        return text

    return parse
