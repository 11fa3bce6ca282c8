"""Checkpoints: one .npz holding the state_dict (PyTorch's names and shapes), with momentum the optimizer's
buffers (momentum_buffer.<parameter name>), and a metadata record.

Written atomically (a temporary file in the same directory, then a rename), so a crash or a full disk
never leaves a half-written checkpoint where a good one was.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import reference, sizes
from .paths import write_atomic

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
    write_atomic(path, lambda f: np.savez(f, **arrays))
    return path


NOT_A_CHECKPOINT = "a checkpoint is the .npz that `python -m mnist_cuda.train --save PATH` writes"
META_MAX_BYTES = 1 << 20  # the metadata record is a few hundred bytes of JSON


class Header(NamedTuple):
    """What an .npy member of a checkpoint says it holds, read before its data."""

    shape: tuple
    dtype: np.dtype


def _check_file(path: Path) -> None:
    """A checkpoint is a readable regular file that starts as a zip archive does."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a regular file (a device or a pipe?); {NOT_A_CHECKPOINT}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if magic != b"PK\x03\x04":  # an .npz is a zip archive
        raise CheckpointError(f"{path} is not a checkpoint (not an .npz archive); {NOT_A_CHECKPOINT}")


def _unreadable(path, e: Exception) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a readable .npz checkpoint ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else 'damaged'}); {NOT_A_CHECKPOINT}"
    )


def read_headers(path) -> dict[str, Header]:
    """{name: Header} of every array of a checkpoint (its metadata record among them), from the .npy headers
    alone: the sizes are known (and checked) before any array's data is read, so a small archive that claims
    a huge array allocates nothing."""
    path = Path(path)
    _check_file(path)
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = {
                        (1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0,
                    }.get(version)
                    if read is None:
                        raise ValueError(f"{name} is in .npy format {version[0]}.{version[1]}")
                    shape, _, dtype = read(member)
                headers[name] = Header(tuple(shape), dtype)
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as e:
        raise _unreadable(path, e) from None
    for header in headers.values():
        if header.dtype.hasobject:
            raise CheckpointError(
                f"{path} is not a checkpoint: it holds pickled Python objects (a torch.save file?); {NOT_A_CHECKPOINT}"
            )
    if META_KEY not in headers:
        raise CheckpointError(f"{path} has no mnist_cuda metadata record; {NOT_A_CHECKPOINT}")
    return headers


def load_checkpoint(
    path, spec: dict[str, tuple[tuple, np.dtype]] | None = None, headers: dict[str, Header] | None = None
):
    """Read (state, meta). With spec {name: (shape, dtype)} check that names, shapes and dtypes fit (before
    any array's data is read) and that the values are finite (check_values). headers: read_headers' answer
    where the caller has it already. Every problem is a CheckpointError whose message says what is wrong and
    what a checkpoint is."""
    path = Path(path)
    headers = dict(read_headers(path) if headers is None else headers)
    meta_header = headers.pop(META_KEY)
    if meta_header.shape != () or meta_header.dtype.kind != "U" or meta_header.dtype.itemsize > META_MAX_BYTES:
        raise CheckpointError(f"{path}: the metadata record is not a JSON object")
    if spec is not None:
        fit(headers, spec, path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta_text = str(z[META_KEY])
            arrays = {k: z[k] for k in (spec if spec is not None else headers)}
    except ValueError:  # a member's data is shorter than its header says (read_headers refuses pickled objects)
        raise CheckpointError(
            f"{path} is not a checkpoint: a member is not a NumPy array; {NOT_A_CHECKPOINT}"
        ) from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as e:
        raise _unreadable(path, e) from None
    try:
        meta = json.loads(meta_text)
        assert isinstance(meta, dict)
    except (json.JSONDecodeError, AssertionError):
        raise CheckpointError(f"{path}: the metadata record is not a JSON object") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is in checkpoint format {meta.get('format')!r}; this version of mnist_cuda "
            f"reads {FORMAT!r} only (write it again with this version's --save, or load it with "
            f"the version that wrote it)"
        )
    if spec is not None:
        check_values(arrays, path)
    return arrays, meta


def fit(arrays, spec: dict[str, tuple[tuple, np.dtype]], path) -> dict:
    """arrays (or Headers) in spec's order, or a CheckpointError listing every name, shape and dtype that does
    not fit."""
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


def check_values(arrays: dict[str, np.ndarray], path) -> None:
    """Every value finite, the BatchNorm variances >= 0 and the batch counts >= 0, or a CheckpointError naming
    the first array that breaks the rule: a checkpoint carried on would copy the damage into the next one."""
    for name, a in arrays.items():
        if name.endswith("num_batches_tracked"):
            if int(a) < 0:
                raise CheckpointError(f"{path}: {name} is {int(a)}; a count of batches is >= 0")
            continue
        bad = ~np.isfinite(a)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise CheckpointError(
                f"{path}: {name} holds {a[where]} (first at {list(where)}); a checkpoint must hold "
                f"finite values: start from an earlier one"
            )
        if name.endswith("running_var") and (a < 0).any():
            where = int(np.argmax(a < 0))
            raise CheckpointError(
                f"{path}: {name} holds a negative variance ({a[where]} at [{where}]); {NOT_A_CHECKPOINT}"
            )


def model_of(state, path) -> tuple[tuple[int, int], int]:
    """(channels, hidden) of the model a state_dict (arrays or Headers) belongs to, read from its shapes."""
    try:
        channels = (int(state["conv1.weight"].shape[0]), int(state["conv2.weight"].shape[0]))
        hidden = int(state["fc1.weight"].shape[0])
    except (KeyError, IndexError):
        raise CheckpointError(f"{path} lacks conv1.weight, conv2.weight or fc1.weight; {NOT_A_CHECKPOINT}") from None
    return channels, hidden


def model_spec(channels, hidden, momentum: bool) -> dict[str, tuple[tuple, np.dtype]]:
    """What a checkpoint of this model holds: the state_dict and, with momentum, a float32 buffer per parameter."""
    spec = reference.state_dict_spec(channels, hidden)
    if momentum:
        spec.update(
            {
                MOMENTUM_PREFIX + k: (shape, np.dtype(np.float32))
                for k, shape in reference.param_shapes(channels, hidden).items()
            }
        )
    return spec


def load_model(path):
    """(state, meta, channels, hidden, momentum buffers) of a checkpoint: the model its shapes name, checked
    against what the kernels take before any array is read, then every array's shape, dtype and values; the
    buffers (saved with momentum) by parameter name, else empty."""
    headers = read_headers(path)
    channels, hidden = model_of(headers, path)
    problem = sizes.model_problem(channels, hidden, sizes.CHECKPOINT)
    if problem:
        raise CheckpointError(f"{path}: {problem[1]}")
    momentum = any(k.startswith(MOMENTUM_PREFIX) for k in headers)
    arrays, meta = load_checkpoint(path, model_spec(channels, hidden, momentum), headers)
    buffers = {k[len(MOMENTUM_PREFIX) :]: arrays.pop(k) for k in list(arrays) if k.startswith(MOMENTUM_PREFIX)}
    return arrays, meta, channels, hidden, buffers
