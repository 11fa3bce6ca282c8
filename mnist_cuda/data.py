"""MNIST and Fashion-MNIST: find or download the IDX files, verify them, keep the data in host DRAM.

A folder the user names (`--data-dir`, or the environment variable MNIST_DATA_DIR) is the only place
the four files of a dataset are looked for: a user who names a folder means that folder, and a missing or
bad file there is an error (DataDirError) naming it. Without one, each file is looked for, in order, in
  1. the cache (`data/<dataset>/` under the working directory, or MNIST_CUDA_CACHE),
  2. each download mirror in turn; a download goes to a temporary file in the cache directory and is
     renamed into place only after it verified, so an interrupted or corrupt download never becomes
     the cache.
A candidate is accepted only if its decompressed bytes have the published SHA-256 and parse as the
IDX file we expect. Gzipped and raw files are both accepted (detected by content, not by name).

The datasets and the checks of their files are mnist_cuda.data_files', where the files are found
mnist_cuda.data_sources'; both are re-exported here. This module keeps the data in host memory and makes
the batches.

The decoded images stay uint8 in host memory (optionally in pinned memory, which the GPU trainer asks
for); batches are gathered from there by index and copied to the GPU as bytes, a quarter of the float32
batch. The kernels normalise each pixel with normalize()'s float32 operations (the same bits: a GPU test
checks all 256 values).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator

import numpy as np

from .data_files import (
    CLASS_NAMES,
    DATASETS,
    IMAGE_SIZE,
    NUM_CLASSES,
    TRAIN_SAMPLES,
    DataDirError,
    DataError,
    DatasetSpec,
    FileSpec,
    decompress,
    read_idx,
    verify,
)
from .data_sources import default_cache_dir, fetch_file, load_arrays, named_dir, present_files

__all__ = [
    "CLASS_NAMES",
    "DATASETS",
    "IMAGE_SIZE",
    "MEAN",
    "NUM_CLASSES",
    "STD",
    "TRAIN_SAMPLES",
    "DataDirError",
    "DataError",
    "DatasetSpec",
    "EmptyFn",
    "FileSpec",
    "HostData",
    "batch_indices",
    "decompress",
    "default_cache_dir",
    "epoch_order",
    "fetch_file",
    "gather",
    "host_data",
    "load",
    "load_arrays",
    "named_dir",
    "normalize",
    "present_files",
    "read_idx",
    "verify",
    "with_next",
]

MEAN, STD = 0.1307, 0.3081  # the usual MNIST normalisation: (x/255 - MEAN) / STD


def normalize(images: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 [N,28,28] or [N,1,28,28] -> float32 [N,1,28,28], (x/255 - MEAN)/STD, computed in float32:
    what the network sees (the GPU kernels compute the same in normalize_pixel, kernels/common.cuh)."""
    if out is None:
        out = np.empty((images.shape[0], 1, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    scaled = images.astype(np.float32).reshape(out.shape) / np.float32(255.0)
    np.subtract(scaled, np.float32(MEAN), out=scaled)
    np.divide(scaled, np.float32(STD), out=out)
    return out


@dataclasses.dataclass
class HostData:
    """uint8 images [N,1,28,28] (as stored; normalize() gives what the network sees) and int32 labels
    [N], train and test, in host DRAM."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


EmptyFn = Callable[[tuple, np.dtype], np.ndarray]


def load(dataset: str = "mnist", data_dir=None, cache_dir=None, empty: EmptyFn | None = None, **kw) -> HostData:
    """Load and verify a dataset once. `empty(shape, dtype)` allocates the host arrays (the GPU trainer
    passes a pinned-memory allocator so host-to-device copies are truly async)."""
    return host_data(dataset, load_arrays(dataset, data_dir, cache_dir, **kw), empty)


def host_data(dataset: str, arrays, empty: EmptyFn | None = None) -> HostData:
    """HostData from load_arrays' four arrays, in host arrays that `empty(shape, dtype)` allocates."""
    empty = empty or (lambda shape, dtype: np.empty(shape, dtype))
    tr_i, tr_l, te_i, te_l = arrays

    def images(u8):
        if u8 is None:  # load_arrays(test_only=True)
            return None
        out = empty((u8.shape[0], 1, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
        out[...] = u8.reshape(out.shape)
        return out

    def labels(u8):
        if u8 is None:
            return None
        out = empty(u8.shape, np.int32)
        out[...] = u8
        return out

    return HostData(dataset, images(tr_i), labels(tr_l), images(te_i), labels(te_l))


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The sample order of one epoch: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_indices(order: np.ndarray, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
    """Consecutive slices of `order`; training drops a partial last batch, evaluation keeps it."""
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]


def with_next(batches: list) -> Iterator[tuple]:
    """(batch, the one after it) for each of the batches, None after the last: a step graph loads the next
    step's batch while it computes (mnist_cuda.step)."""
    for i, batch in enumerate(batches):
        yield batch, batches[i + 1] if i + 1 < len(batches) else None


def gather(x: np.ndarray, y: np.ndarray, idx: np.ndarray, out_x: np.ndarray, out_y: np.ndarray):
    """Copy the samples idx into the (pinned) staging buffers; returns the batch length. The indices are checked once,
    then copied with mode="clip": np.take's default mode copies through a temporary buffer, which on a slow host made a
    large batch's gather outlast the step it is staged beside (docs/performance.md)."""
    idx = np.asarray(idx)
    n = len(idx)
    if n and (idx.min() < 0 or idx.max() >= len(x)):
        raise IndexError(f"a sample index outside 0..{len(x) - 1}")
    np.take(x, idx, axis=0, out=out_x[:n], mode="clip")
    np.take(y, idx, axis=0, out=out_y[:n], mode="clip")
    return n


if __name__ == "__main__":  # python -m mnist_cuda.data: the command lives apart from the data it checks
    from mnist_cuda.data_command import main

    sys.exit(main())
