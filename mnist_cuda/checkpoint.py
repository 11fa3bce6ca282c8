"""Checkpoints: one .npz holding the state_dict (PyTorch's names and shapes), with momentum the optimizer's
buffers (momentum_buffer.<parameter name>), and a metadata record.

Written atomically (a temporary file in the same directory, then a rename), so a crash or a full disk
never leaves a half-written checkpoint where a good one was.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from . import cli, reference

FORMAT = "mnist_cuda.checkpoint/1"
META_KEY = "__meta__"
MOMENTUM_PREFIX = "momentum_buffer."  # + a parameter's name: SGD's momentum buffer of that parameter


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
    cli.write_atomic(path, lambda f: np.savez(f, **arrays))
    return path


NOT_A_CHECKPOINT = "a checkpoint is the .npz that `python -m mnist_cuda.train --save PATH` writes"


def load_checkpoint(path, spec: dict[str, tuple[tuple, np.dtype]] | None = None):
    """Read (state, meta). With spec {name: (shape, dtype)} check that names, shapes and dtypes fit.
    Every problem is a CheckpointError whose message says what is wrong and what a checkpoint is."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist" if not path.exists()
                              else f"{path} is a folder, not a checkpoint")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if magic != b"PK\x03\x04":  # an .npz is a zip archive
        raise CheckpointError(f"{path} is not a checkpoint (not an .npz archive); {NOT_A_CHECKPOINT}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except ValueError as e:
        why = ("it holds pickled Python objects (a torch.save file?)" if "pickle" in str(e)
               else "a member is not a NumPy array")
        raise CheckpointError(f"{path} is not a checkpoint: {why}; {NOT_A_CHECKPOINT}") from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as e:
        raise CheckpointError(f"{path} is not a readable .npz checkpoint ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'damaged'}); {NOT_A_CHECKPOINT}") from None
    if META_KEY not in arrays:
        raise CheckpointError(f"{path} has no mnist_cuda metadata record; {NOT_A_CHECKPOINT}")
    try:
        meta = json.loads(str(arrays.pop(META_KEY)))
        assert isinstance(meta, dict)
    except (json.JSONDecodeError, AssertionError):
        raise CheckpointError(f"{path}: the metadata record is not a JSON object") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is in checkpoint format {meta.get('format')!r}; this version of mnist_cuda "
                              f"reads {FORMAT!r} only (write it again with this version's --save, or load it with "
                              f"the version that wrote it)")
    if spec is not None:
        arrays = fit(arrays, spec, path)
    return arrays, meta


def fit(arrays: dict[str, np.ndarray], spec: dict[str, tuple[tuple, np.dtype]], path) -> dict[str, np.ndarray]:
    """arrays in spec's order, or a CheckpointError listing every name, shape and dtype that does not fit."""
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
    return {k: arrays[k] for k in spec}


def model_of(state: dict[str, np.ndarray], path) -> tuple[tuple[int, int], int]:
    """(channels, hidden) of the model a state_dict belongs to, read from its shapes."""
    try:
        channels = (int(state["conv1.weight"].shape[0]), int(state["conv2.weight"].shape[0]))
        hidden = int(state["fc1.weight"].shape[0])
    except (KeyError, IndexError):
        raise CheckpointError(f"{path} lacks conv1.weight, conv2.weight or fc1.weight; {NOT_A_CHECKPOINT}") from None
    return channels, hidden


def load_model(path):
    """(state, meta, channels, hidden, momentum buffers) of a checkpoint: the state checked against the
    model its shapes name; the buffers (saved with momentum) by parameter name, else empty."""
    arrays, meta = load_checkpoint(path)
    buffers = {k[len(MOMENTUM_PREFIX):]: arrays.pop(k) for k in list(arrays) if k.startswith(MOMENTUM_PREFIX)}
    channels, hidden = model_of(arrays, path)
    state = fit(arrays, reference.state_dict_spec(channels, hidden), path)
    if buffers:
        shapes = reference.param_shapes(channels, hidden)
        bad = [k for k in shapes if k not in buffers or buffers[k].shape != tuple(shapes[k])]
        if bad or set(buffers) - set(shapes):
            raise CheckpointError(f"{path}: its momentum buffers do not fit the model ({', '.join(bad) or 'extra'})")
    return state, meta, channels, hidden, buffers
