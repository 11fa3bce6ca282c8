"""Checkpoints: one .npz holding the state_dict (PyTorch's names and shapes) and a metadata record.

Written atomically (a temporary file in the same directory, then a rename), so a crash or a full disk
never leaves a half-written checkpoint where a good one was.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

FORMAT = "mnist_cuda.checkpoint/1"
META_KEY = "__meta__"


class CheckpointError(Exception):
    """A checkpoint could not be read or does not fit the model; the message says why."""


def save_checkpoint(path, state: dict[str, np.ndarray], meta: dict | None = None) -> Path:
    """Write state (+ meta: dataset, channels, hidden, step, ...) to path atomically."""
    path = Path(path)
    record = {"format": FORMAT, **(meta or {})}
    arrays = {k: np.asarray(v) for k, v in state.items()}
    arrays[META_KEY] = np.array(json.dumps(record))
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise CheckpointError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path, spec: dict[str, tuple[tuple, np.dtype]] | None = None):
    """Read (state, meta). With spec {name: (shape, dtype)} check that names, shapes and dtypes fit."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"{path} is not a readable .npz checkpoint ({e})") from None
    meta = {}
    if META_KEY in arrays:
        try:
            meta = json.loads(str(arrays.pop(META_KEY)))
        except json.JSONDecodeError:
            raise CheckpointError(f"{path}: the metadata record is not valid JSON") from None
    if spec is not None:
        problems = []
        missing = [k for k in spec if k not in arrays]
        extra = [k for k in arrays if k not in spec]
        if missing:
            problems.append("missing " + ", ".join(missing))
        if extra:
            problems.append("unexpected " + ", ".join(extra))
        for name, (shape, dtype) in spec.items():
            if name in arrays:
                a = arrays[name]
                if tuple(a.shape) != tuple(shape):
                    problems.append(f"{name} has shape {tuple(a.shape)}, the model needs {tuple(shape)}")
                elif a.dtype != dtype:
                    problems.append(f"{name} has dtype {a.dtype}, the model needs {np.dtype(dtype)}")
        if problems:
            raise CheckpointError(f"{path} does not fit this model: " + "; ".join(problems))
        arrays = {k: arrays[k] for k in spec}
    return arrays, meta
