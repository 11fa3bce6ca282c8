"""The datasets' files and their checks: each dataset's four IDX files (name, SHA-256 of the decompressed bytes,
count) and download mirrors (DATASETS), its class names, and the parsing and verification of an IDX file's
bytes (gzipped or raw) into a uint8 array; DataError (and DataDirError, a user's folder at fault) for what fails.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import zlib

import numpy as np

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
