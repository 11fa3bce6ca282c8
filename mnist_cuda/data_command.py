"""The command line of mnist_cuda.data:  python -m mnist_cuda.data [--download] [--help]

Checks that a data set's four IDX files are where a run would read them and match their published SHA-256,
or (--download) fetches the missing ones first; no GPU needed. The finding, verifying and fetching are
mnist_cuda.data_sources' and data_files'; this module only parses the flags and says the outcome in one line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import cli
from .data_files import DATASETS, DataDirError, DataError
from .data_sources import default_cache_dir, fetch_file, load_arrays, named_dir
from .paths import kind_of, os_error


def build_parser():
    p = cli.Parser(
        prog=cli.prog_name("mnist_cuda.data"),
        description="Check that a data set's four IDX files are where a run would read them and match "
        "their published SHA-256, or (--download) fetch the missing ones first. No GPU needed.",
    )
    p.add_argument("--dataset", choices=sorted(DATASETS), default="mnist", help="which data set")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the folder to check, or with --download to fetch into (as the cache: the files land in "
        "DIR/<dataset>/) (default: $MNIST_DATA_DIR if set, else the cache ./data/<dataset>)",
    )
    p.add_argument(
        "--download",
        action="store_true",
        help="fetch each file that is missing or does not verify from the download mirrors, verify it, "
        "then move it into place",
    )
    p.add_argument("--quiet", action="store_true", help="no download progress bars")
    return p


def main(argv=None) -> int:
    return cli.run(build_parser(), _check_or_download, argv)


def _check_or_download(args, parser) -> int:
    spec = DATASETS[args.dataset]
    named = args.data_dir if args.data_dir is not None else os.environ.get("MNIST_DATA_DIR") or None
    try:
        if args.download:
            folder = Path(named) if named is not None else default_cache_dir()
            kind = kind_of(folder)
            if kind == "unusable":
                parser.fail("--data-dir", f"{folder}: {os_error(folder)}")
            if kind not in ("folder", "missing"):
                parser.fail("--data-dir", f"{folder} is not a folder")
            arrays = [fetch_file(f, spec.name, None, folder, spec.mirrors, progress=not args.quiet) for f in spec.files]
            where = folder / spec.name
        else:
            folder = named_dir(spec.name, named)
            arrays = load_arrays(spec.name, folder, mirrors=(), progress=False)
            where = folder if folder is not None else default_cache_dir() / spec.name
    except DataDirError as e:
        print(f"{parser.prog}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except DataError as e:
        hint = "" if args.download else " (--download fetches it)"
        print(f"{parser.prog}: {_one_line(e)}{hint}", file=sys.stderr)
        return 1
    print(
        f"{spec.name}: the four files verified (SHA-256) in {where}: {len(arrays[0]):,} training and "
        f"{len(arrays[2]):,} test images"
    )
    return 0


def _one_line(error: Exception) -> str:
    """A DataError's message ("could not get X. Tried:" and a line per source) as one line."""
    first, *rest = [line.strip(" -") for line in str(error).splitlines() if line.strip()]
    return f"{first} {'; '.join(rest)}" if rest else first


if __name__ == "__main__":
    sys.exit(main())
