"""Command-line pieces the dev/ programs share: argparse types that reject bad input before any work
starts (a usage error, exit 2), and the result file's write."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


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
    """A file to write the results to, checked now rather than after the run: its folder exists and is
    writable, and the path is not a folder."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def write_json(path: Path, obj) -> None:
    """Write obj as JSON through a temporary file, so a failed write leaves no half-written result."""
    tmp = path.with_name(path.name + ".tmp-write")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)
    print(f"result: {path}")
