"""Shared test set-up: the `gpu` marker skips, with the reason, where CuPy finds no CUDA device."""
import functools
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def gpu_missing_reason():
    try:
        from mnist_cuda import kernels
        kernels.require_gpu()
    except Exception as e:  # GPUUnavailable, or CuPy failing to import
        return str(e)
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_missing_reason() if any("gpu" in item.keywords for item in items) else None
    if reason:
        skip = pytest.mark.skip(reason=f"GPU test: {reason}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def find_mnist_dir():
    """A folder with the real MNIST files: $MNIST_DATA_DIR, data/mnist, or ../shared/mnist."""
    for candidate in (os.environ.get("MNIST_DATA_DIR"), REPO / "data" / "mnist", REPO.parent / "shared" / "mnist"):
        if candidate and (Path(candidate) / "train-images-idx3-ubyte.gz").is_file():
            return Path(candidate)
    return None
