"""Shared test set-up: the repository's folders, the programs of dev/ and scripts/ loaded from their files,
the `gpu` marker, which skips with the reason where CuPy finds no CUDA device, and where the real MNIST and
Fashion-MNIST files are found."""

import ast
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "dev"  # programs run from their files (python dev/X.py), as the tests load them (load_script)


def load_script(path: Path):
    """A program of dev/ or scripts/ as a module, loaded from its file: neither folder is a package. A
    program run as `python dev/X.py` imports its neighbours by name (its folder is first on sys.path then):
    those are loaded from their files first and registered under their names, so no folder joins sys.path."""
    for name in _neighbours(path):
        if name not in sys.modules:
            sys.modules[name] = load_script(path.parent / f"{name}.py")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_program(path: Path, *args, timeout: int = 600):
    """`python path args` from the repository's root with the package importable: its exit code and output."""
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
    )


def _neighbours(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and not n.level]
    names += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    return [name for name in names if (path.parent / f"{name}.py").is_file()]


@functools.cache
def gpu_missing_reason():
    try:
        from mnist_cuda import cuda

        cuda.require_gpu()
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


MNIST_HINT = "no MNIST copy found ($MNIST_DATA_DIR or data/mnist)"


def find_mnist_dir():
    """A folder inside the repository (or named by $MNIST_DATA_DIR) with the real MNIST files:
    $MNIST_DATA_DIR, then data/mnist."""
    for candidate in (os.environ.get("MNIST_DATA_DIR"), REPO / "data" / "mnist"):
        if candidate and (Path(candidate) / "train-images-idx3-ubyte.gz").is_file():
            return Path(candidate)
    return None


# Fashion-MNIST: $FASHION_MNIST_DATA_DIR, the repository's data/fashion-mnist, or where Debian's
# dataset-fashion-mnist package installs it
FASHION_PLACES = ("FASHION_MNIST_DATA_DIR", REPO / "data" / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist"))


def fashion_or_skip():
    """A folder with the real Fashion-MNIST files, or skip the test saying where they are looked for."""
    for place in FASHION_PLACES:
        folder = os.environ.get(place) if isinstance(place, str) else place
        if folder and (Path(folder) / "train-images-idx3-ubyte.gz").is_file():
            return Path(folder)
    pytest.skip(
        "no Fashion-MNIST copy found ($FASHION_MNIST_DATA_DIR, data/fashion-mnist or "
        "/usr/share/datasets/fashion-mnist, which apt-get install dataset-fashion-mnist fills)"
    )


def mnist_or_skip():
    """find_mnist_dir's folder, or skip the test saying where MNIST is looked for."""
    folder = find_mnist_dir()
    if folder is None:
        pytest.skip(MNIST_HINT)
    return folder
