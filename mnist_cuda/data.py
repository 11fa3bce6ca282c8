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

The decoded images stay uint8 in host memory (optionally in pinned memory, which the GPU trainer asks
for); batches are gathered from there by index and copied to the GPU as bytes, a quarter of the float32
batch. The kernels normalise each pixel with normalize()'s float32 operations (the same bits: a GPU test
checks all 256 values).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from .paths import UNREACHABLE, kind_of, os_error

MEAN, STD = 0.1307, 0.3081  # the usual MNIST normalisation: (x/255 - MEAN) / STD
IMAGE_SIZE = 28
NUM_CLASSES = 10


class DataError(Exception):
    """A dataset could not be found, downloaded or verified; the message says what and where."""


class DataDirError(DataError):
    """The folder the user named does not exist or lacks a verified file: a user mistake."""


@dataclasses.dataclass(frozen=True)
class FileSpec:
    name: str  # IDX file name without .gz, e.g. "train-images-idx3-ubyte"
    sha256: str  # of the decompressed bytes
    count: int  # number of images or labels
    is_images: bool


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    name: str
    mirrors: tuple[str, ...]  # base URLs; a file is fetched from mirror + name + ".gz"
    train_images: FileSpec
    train_labels: FileSpec
    test_images: FileSpec
    test_labels: FileSpec

    @property
    def files(self) -> tuple[FileSpec, ...]:
        return (self.train_images, self.train_labels, self.test_images, self.test_labels)


def _spec(name, mirrors, hashes):
    n = {"train": 60000, "t10k": 10000}
    files = [FileSpec(f, h, n[f.split("-")[0]], "images" in f) for f, h in hashes.items()]
    return DatasetSpec(name, tuple(mirrors), *files)


DATASETS = {
    "mnist": _spec(
        "mnist",
        ["https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/"],
        {
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
    ),
    "fashion-mnist": _spec(
        "fashion-mnist",
        [
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
        ],
        {
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
    ),
}

CLASS_NAMES = {
    "mnist": tuple(str(d) for d in range(NUM_CLASSES)),
    "fashion-mnist": (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
}
TRAIN_SAMPLES = {name: spec.train_images.count for name, spec in DATASETS.items()}


# ----------------------------------------------------------------------------------------------
# IDX parsing and verification


def read_idx(raw: bytes, what: str = "IDX data") -> np.ndarray:
    """Parse an IDX file of unsigned bytes (magic 0x00 0x00 0x08 ndim, big-endian int32 dims)."""
    if len(raw) < 4:
        raise DataError(f"{what}: {len(raw)} bytes is too short for an IDX header")
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{what}: bad magic number {raw[:4].hex()} (expected 000008 then ndim)")
    ndim = raw[3]
    if ndim not in (1, 3):
        raise DataError(f"{what}: {ndim} dimensions; MNIST files have 1 (labels) or 3 (images)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{what}: truncated header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise DataError(f"{what}: dims {dims} need {expected} bytes, the file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def decompress(blob: bytes, what: str) -> bytes:
    """Gunzip if the bytes are gzip (by magic number), else return them unchanged."""
    if blob[:2] != b"\x1f\x8b":
        return blob
    try:
        return gzip.decompress(blob)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{what}: corrupt or truncated gzip ({e})") from None


def verify(blob: bytes, spec: FileSpec, what: str) -> np.ndarray:
    """Decompress, check the SHA-256 of the IDX bytes, parse and check shape and values."""
    raw = decompress(blob, what)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise DataError(
            f"{what}: SHA-256 of the decompressed data is {digest[:16]}..., "
            f"expected {spec.sha256[:16]}... (corrupt or a different file)"
        )
    arr = read_idx(raw, what)
    if spec.is_images:
        if arr.ndim != 3 or arr.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
            raise DataError(f"{what}: images of shape {arr.shape[1:]}, expected 28x28")
    elif arr.ndim != 1:
        raise DataError(f"{what}: labels must have 1 dimension, found {arr.ndim}")
    if arr.shape[0] != spec.count:
        raise DataError(f"{what}: {arr.shape[0]} items, expected {spec.count}")
    if not spec.is_images and arr.size and int(arr.max()) >= NUM_CLASSES:
        raise DataError(f"{what}: label {int(arr.max())} out of range 0..9")
    return arr


# ----------------------------------------------------------------------------------------------
# Sources: user directory, cache, mirrors


def default_cache_dir() -> Path:
    return Path(os.environ.get("MNIST_CUDA_CACHE", "data"))


def _candidates(directory: Path, dataset: str, name: str) -> list[Path]:
    """Where a file may sit in a directory: flat, or in a per-dataset subfolder; gzipped or raw."""
    out = []
    for folder in (directory, directory / dataset):
        for fname in (name + ".gz", name):
            out.append(folder / fname)
    return out


def _download(
    url: str, dest_dir: Path, spec: FileSpec, timeout: float, retries: int, progress: bool
) -> tuple[np.ndarray, Path]:
    """Fetch url into a temporary file in dest_dir, verify it; return the array and the temp path."""
    import requests
    from tqdm import tqdm

    last = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(2.0, 0.25 * 2**attempt))
        fd, tmp = tempfile.mkstemp(prefix=f".{spec.name}.", suffix=".part", dir=dest_dir)
        try:
            with os.fdopen(fd, "wb") as f, requests.get(url, stream=True, timeout=timeout) as r:
                if r.status_code != 200:
                    raise DataError(f"{url}: HTTP {r.status_code}")
                total = int(r.headers.get("Content-Length") or 0) or None
                with tqdm(
                    total=total, unit="B", unit_scale=True, desc=spec.name, leave=False, disable=not progress
                ) as bar:
                    for chunk in r.iter_content(chunk_size=1 << 16):
                        f.write(chunk)
                        bar.update(len(chunk))
            arr = verify(Path(tmp).read_bytes(), spec, url)
            return arr, Path(tmp)
        except (DataError, requests.RequestException, OSError) as e:
            Path(tmp).unlink(missing_ok=True)
            last = e if isinstance(e, DataError) else DataError(f"{url}: {type(e).__name__}: {e}")
            if isinstance(e, DataError) and "HTTP 4" in str(e):
                break  # a 404 will not change on retry
    raise last


def fetch_file(
    spec: FileSpec,
    dataset: str,
    data_dir: Path | None,
    cache_dir: Path,
    mirrors: Sequence[str],
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 2,
) -> np.ndarray:
    """Return the verified contents of one IDX file: from data_dir alone when it is given, else from the
    cache, then each mirror."""
    if data_dir is not None:
        return _from_named_dir(spec, dataset, data_dir)
    tried: list[str] = []
    candidates = _candidates(cache_dir, dataset, spec.name)
    found = [p for p in candidates if kind_of(p) == "file"]
    tried += [f"cache: cannot read {p} ({UNREACHABLE})" for p in candidates if kind_of(p) == "unreachable"][:1]
    tried += [f"cache: cannot read {p} ({os_error(p)})" for p in candidates if kind_of(p) == "unusable"][:1]
    for path in found:
        try:
            return verify(path.read_bytes(), spec, str(path))
        except DataError as e:
            tried.append(f"cache: {e}")
        except OSError as e:
            tried.append(f"cache: cannot read {path}: {e.strerror}")
    if not found:
        tried.append(f"cache: {spec.name}[.gz] not found in {cache_dir} or {cache_dir / dataset}")

    target_dir = cache_dir / dataset
    created = [d for d in (target_dir, cache_dir) if kind_of(d) == "missing"]  # removed again if nothing lands
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        tried.append(f"cache: cannot create {target_dir}: {e}")
        mirrors = ()
    for mirror in mirrors:
        url = mirror + spec.name + ".gz"
        try:
            arr, tmp = _download(url, target_dir, spec, timeout, retries, progress)
        except DataError as e:
            tried.append(f"download: {e}")
            continue
        os.replace(tmp, target_dir / (spec.name + ".gz"))  # atomic: only a verified file lands
        return arr
    if not mirrors:
        tried.append("download: no mirrors configured")
    for folder in created:
        try:
            folder.rmdir()  # only if still empty
        except OSError:
            pass
    raise DataError(f"could not get {dataset} file {spec.name}. Tried:\n  - " + "\n  - ".join(tried))


def named_dir(dataset: str, data_dir=None, test_only: bool = False) -> Path | None:
    """The folder the user named (data_dir, else $MNIST_DATA_DIR), checked for the dataset's four files (the
    two test files with test_only) without reading them (DataDirError naming what is missing or cannot be
    read), or None when no folder is named."""
    if data_dir is None and os.environ.get("MNIST_DATA_DIR"):
        data_dir = os.environ["MNIST_DATA_DIR"]
    if data_dir is None:
        return None
    data_dir = Path(data_dir)
    _check_named_folder(data_dir)
    for spec in DATASETS[dataset].files[2 if test_only else 0 :]:
        paths = _candidates(data_dir, dataset, spec.name)
        kinds = [kind_of(p) for p in paths]
        if "file" not in kinds:
            if "unusable" in kinds:
                path = paths[kinds.index("unusable")]
                raise DataDirError(f"{path}: {os_error(path)}")
            if "unreachable" in kinds:
                raise DataDirError(f"the data folder {data_dir / dataset} cannot be read (permission denied)")
            raise _missing(spec, dataset, data_dir)
    return data_dir


def _check_named_folder(data_dir: Path) -> None:
    kind = kind_of(data_dir)
    if kind == "unusable":
        raise DataDirError(f"the data folder {data_dir}: {os_error(data_dir)}")
    if kind == "unreachable":
        raise DataDirError(f"the data folder {data_dir} cannot be reached ({UNREACHABLE})")
    if kind != "folder":
        raise DataDirError(
            f"the data folder {data_dir} does not exist"
            if kind == "missing"
            else f"the data folder {data_dir} is not a folder"
        )
    if not os.access(data_dir, os.R_OK | os.X_OK):
        raise DataDirError(f"the data folder {data_dir} cannot be read (permission denied)")


def present_files(dataset: str, folder: Path, test_only: bool = False) -> list[Path]:
    """The dataset's files that lie in folder (flat or in its per-dataset subfolder), the ones a run reads."""
    return [
        p
        for spec in DATASETS[dataset].files[2 if test_only else 0 :]
        for p in _candidates(Path(folder), dataset, spec.name)
        if kind_of(p) == "file"
    ]


def _missing(spec: FileSpec, dataset: str, data_dir: Path) -> DataDirError:
    return DataDirError(
        f"the data folder {data_dir} has no {spec.name}[.gz] (looked in {data_dir} and "
        f"{data_dir / dataset}); name the folder holding the four {dataset} IDX files, or "
        f"leave out --data-dir to use the cache and the download"
    )


def _from_named_dir(spec: FileSpec, dataset: str, data_dir: Path) -> np.ndarray:
    found = [p for p in _candidates(data_dir, dataset, spec.name) if kind_of(p) == "file"]
    problems = []
    for path in found:
        try:
            return verify(path.read_bytes(), spec, str(path))
        except DataError as e:
            problems.append(str(e))
        except OSError as e:
            problems.append(f"{path}: {e.strerror}")
    if not found:
        raise _missing(spec, dataset, data_dir)
    raise DataDirError("; ".join(problems))


def load_arrays(
    dataset: str = "mnist",
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    mirrors: Sequence[str] | None = None,
    spec: DatasetSpec | None = None,
    progress: bool = True,
    test_only: bool = False,
    **fetch_kw,
):
    """The four verified uint8 arrays: (train_images, train_labels, test_images, test_labels); with
    test_only the training pair is (None, None) and its files are not needed."""
    if spec is None:
        if dataset not in DATASETS:
            raise DataError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
        spec = DATASETS[dataset]
    if data_dir is None and os.environ.get("MNIST_DATA_DIR"):
        data_dir = os.environ["MNIST_DATA_DIR"]
    data_dir = Path(data_dir) if data_dir is not None else None
    if data_dir is not None:
        _check_named_folder(data_dir)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    mirrors = spec.mirrors if mirrors is None else tuple(mirrors)
    arrays = [
        None if test_only and i < 2 else fetch_file(f, spec.name, data_dir, cache_dir, mirrors, progress, **fetch_kw)
        for i, f in enumerate(spec.files)
    ]
    for i, j in ((0, 1), (2, 3)):
        if arrays[i] is not None and arrays[i].shape[0] != arrays[j].shape[0]:
            raise DataError(
                f"{spec.files[i].name} has {arrays[i].shape[0]} images but "
                f"{spec.files[j].name} has {arrays[j].shape[0]} labels"
            )
    return tuple(arrays)


# ----------------------------------------------------------------------------------------------
# Host cache and batches


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
    """Copy the samples idx into the (pinned) staging buffers; returns the batch length."""
    n = len(idx)
    np.take(x, idx, axis=0, out=out_x[:n])
    np.take(y, idx, axis=0, out=out_y[:n])
    return n


if __name__ == "__main__":  # python -m mnist_cuda.data: the command lives apart from the data it checks
    from mnist_cuda.data_command import main

    sys.exit(main())
