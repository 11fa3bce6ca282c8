"""Paths and files, without a command line: what is at a path, in the system's words where it refuses the
path, and a file written whole or not at all.

The commands' argparse types (mnist_cuda.cli) and the readers and writers of the core (data, preprocess,
checkpoint) share these, so a path is judged and named the same way wherever it is met.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

# why a path whose kind_of is "unreachable" cannot be looked at, as the messages say it
UNREACHABLE = "permission denied on a folder on the way"


def kind_of(path) -> str:
    """What is at path: "missing", "folder", "file", "other" (a device, a pipe, a socket), "unreachable" (a
    folder on the way may not be searched: a permission error, which Path.exists raises rather than answers)
    or "unusable" (the system refuses the path itself, a name too long or a loop of links: os_error says why)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except PermissionError:
        return "unreachable"
    except OSError:
        return "unusable"
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def os_error(path) -> str:
    """The system's words for why path cannot be looked at ("File name too long"), for a path kind_of calls
    "unusable"."""
    try:
        os.stat(path)
    except OSError as e:
        return e.strerror or type(e).__name__
    return "it changed while it was looked at"


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
