"""Where the datasets' files come from: a folder the user names (--data-dir or MNIST_DATA_DIR, the only place
looked in when given), else the cache, else each download mirror in turn (a download lands in the cache only
after it verified); load_arrays, a dataset's four verified arrays. mnist_cuda.data_files says what each file
must be; mnist_cuda.data keeps the data in host memory."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .data_files import DATASETS, DataDirError, DataError, DatasetSpec, FileSpec, verify
from .paths import UNREACHABLE, kind_of, os_error


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
