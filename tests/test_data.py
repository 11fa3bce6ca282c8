"""The data pipeline: IDX parsing, verification, sources and downloads (local HTTP server only)."""

import errno
import gzip
import hashlib
import http.server
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import mnist_or_skip
from mnist_cuda import data
from mnist_cuda.data import DataDirError, DataError, DatasetSpec, FileSpec


def idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, np.uint8)
    return bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape) + arr.tobytes()


def make_dataset(rng, n_train=12, n_test=5, name="tiny", mirrors=()):
    """A small synthetic dataset: {file name: raw IDX bytes} and a spec with their hashes."""
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    raw = {k: idx_bytes(v) for k, v in arrays.items()}
    specs = [FileSpec(k, hashlib.sha256(v).hexdigest(), len(arrays[k]), "images" in k) for k, v in raw.items()]
    return raw, arrays, DatasetSpec(name, tuple(mirrors), *specs)


def write_files(folder: Path, raw: dict, gz=True):
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in raw.items():
        (folder / (name + (".gz" if gz else ""))).write_bytes(gzip.compress(blob) if gz else blob)


@pytest.fixture
def rng():
    return np.random.default_rng()


# ---- parsing and verification ------------------------------------------------------------------


def test_read_idx_roundtrip_and_errors():
    a = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    assert np.array_equal(data.read_idx(idx_bytes(a)), a)
    good = idx_bytes(a)
    with pytest.raises(DataError, match="bad magic"):
        data.read_idx(b"\x00\x00\x09\x03" + good[4:], "f")
    with pytest.raises(DataError, match="need .* bytes"):
        data.read_idx(good[:-1], "f")
    with pytest.raises(DataError, match="need .* bytes"):
        data.read_idx(good + b"\x00", "f")
    with pytest.raises(DataError, match="too short"):
        data.read_idx(b"\x00\x00", "f")


def test_verify_checks_hash_counts_and_labels(rng):
    raw, arrays, spec = make_dataset(rng)
    lab = raw["train-labels-idx1-ubyte"]
    assert np.array_equal(data.verify(gzip.compress(lab), spec.train_labels, "x"), arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(data.verify(lab, spec.train_labels, "x"), arrays["train-labels-idx1-ubyte"])  # raw too
    with pytest.raises(DataError, match="SHA-256"):
        data.verify(lab[:-1] + bytes([(lab[-1] + 1) % 10]), spec.train_labels, "x")
    bad_labels = idx_bytes(np.array([1, 2, 12]))
    with pytest.raises(DataError, match="label 12 out of range"):
        data.verify(bad_labels, FileSpec("l", hashlib.sha256(bad_labels).hexdigest(), 3, False), "x")
    short = idx_bytes(np.array([1, 2, 3]))
    with pytest.raises(DataError, match="3 items, expected 4"):
        data.verify(short, FileSpec("l", hashlib.sha256(short).hexdigest(), 4, False), "x")
    wrong_shape = idx_bytes(np.zeros((2, 27, 28)))
    with pytest.raises(DataError, match="28x28"):
        data.verify(wrong_shape, FileSpec("i", hashlib.sha256(wrong_shape).hexdigest(), 2, True), "x")
    truncated = gzip.compress(lab)[:-10]
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        data.verify(truncated, spec.train_labels, "x")


def test_normalize():
    u8 = np.array([[[0, 255] * 14] * 28], dtype=np.uint8)
    x = data.normalize(u8)
    assert x.dtype == np.float32 and x.shape == (1, 1, 28, 28)
    assert np.isclose(x[0, 0, 0, 0], -0.1307 / 0.3081) and np.isclose(x[0, 0, 0, 1], (1 - 0.1307) / 0.3081)


def test_epoch_order_and_batches():
    a, b = data.epoch_order(100, seed=1, epoch=0), data.epoch_order(100, seed=1, epoch=0)
    assert np.array_equal(a, b) and sorted(a) == list(range(100))
    assert not np.array_equal(a, data.epoch_order(100, seed=1, epoch=1))
    assert np.array_equal(data.epoch_order(5, 0, 0, shuffle=False), np.arange(5))
    assert [len(i) for i in data.batch_indices(np.arange(10), 4, drop_last=True)] == [4, 4]
    assert [len(i) for i in data.batch_indices(np.arange(10), 4, drop_last=False)] == [4, 4, 2]
    assert list(data.with_next(["a", "b", "c"])) == [("a", "b"), ("b", "c"), ("c", None)]
    assert list(data.with_next([])) == []


# ---- sources: user directory and cache -----------------------------------------------------------


def test_load_from_user_dir_flat_or_nested_gz_or_raw(tmp_path, rng):
    raw, arrays, spec = make_dataset(rng)
    write_files(tmp_path / "flat", raw, gz=True)
    write_files(tmp_path / "nested" / "tiny", raw, gz=False)
    for d in ("flat", "nested"):
        got = data.load_arrays(spec=spec, data_dir=tmp_path / d, cache_dir=tmp_path / "cache", progress=False)
        for a, name in zip(got, raw):
            assert np.array_equal(a, arrays[name])
    host = data.load(spec=spec, data_dir=tmp_path / "flat", cache_dir=tmp_path / "cache", progress=False)
    assert host.train_x.shape == (12, 1, 28, 28) and host.train_x.dtype == np.uint8
    assert host.train_y.dtype == np.int32
    assert np.array_equal(host.train_x[:, 0], arrays["train-images-idx3-ubyte"])


def test_cache_is_used_when_no_user_dir(tmp_path, rng, monkeypatch):
    raw, _, spec = make_dataset(rng)
    write_files(tmp_path / "cache" / "tiny", raw)
    monkeypatch.delenv("MNIST_DATA_DIR", raising=False)
    got = data.load_arrays(spec=spec, cache_dir=tmp_path / "cache", progress=False)
    assert got[0].shape == (12, 28, 28)


def test_env_var_data_dir(tmp_path, rng, monkeypatch):
    raw, _, spec = make_dataset(rng)
    write_files(tmp_path / "mine", raw)
    monkeypatch.setenv("MNIST_DATA_DIR", str(tmp_path / "mine"))
    assert data.load_arrays(spec=spec, cache_dir=tmp_path / "empty", progress=False)[1].shape == (12,)


def test_missing_files_name_every_source(tmp_path, rng, monkeypatch):
    raw, _, spec = make_dataset(rng)
    monkeypatch.delenv("MNIST_DATA_DIR", raising=False)
    with pytest.raises(DataError) as e:
        data.load_arrays(spec=spec, cache_dir=tmp_path / "cache", mirrors=(), progress=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte" in msg and "cache" in msg and "no mirrors" in msg
    assert not (tmp_path / "cache").exists()  # a failed fetch leaves no empty cache folder behind
    with pytest.raises(DataError, match="unknown dataset"):
        data.load_arrays("cifar")


def test_a_path_the_system_refuses_is_named_in_its_words(tmp_path, rng):
    """A loop of links where a data folder or file should be is not a permission problem: the message is the
    system's, for a named folder (a usage error) and for the cache."""
    looping = os.strerror(errno.ELOOP)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(DataDirError) as e:
        data.named_dir("mnist", tmp_path / "loop")
    assert str(e.value) == f"the data folder {tmp_path / 'loop'}: {looping}"
    (tmp_path / "mine").mkdir()
    link = tmp_path / "mine" / "t10k-images-idx3-ubyte"
    link.symlink_to(link)
    with pytest.raises(DataDirError) as e:
        data.named_dir("mnist", tmp_path / "mine", test_only=True)
    assert str(e.value) == f"{link}: {looping}"
    _, _, spec = make_dataset(rng)
    with pytest.raises(DataError) as e:
        data.fetch_file(spec.files[2], "mnist", None, tmp_path / "mine", (), progress=False)
    assert f"cache: cannot read {link} ({looping})" in str(e.value) and "permission" not in str(e.value)


def test_a_named_folder_is_the_only_source(tmp_path, rng):
    """A missing, empty or corrupt named folder is an error naming it, with the cache full of good files
    beside it: no fallback, no download, no folder created."""
    raw, _, spec = make_dataset(rng)
    write_files(tmp_path / "cache" / "tiny", raw)
    kw = dict(spec=spec, cache_dir=tmp_path / "cache", progress=False)
    with pytest.raises(DataDirError, match="data folder .*nope does not exist"):
        data.load_arrays(data_dir=tmp_path / "nope", **kw)
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataDirError, match="mine has no train-images-idx3-ubyte"):
        data.load_arrays(data_dir=tmp_path / "mine", **kw)
    write_files(tmp_path / "mine", raw)
    (tmp_path / "mine" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8bgarbage")
    with pytest.raises(DataDirError, match="t10k-labels-idx1-ubyte.gz: corrupt or truncated gzip"):
        data.load_arrays(data_dir=tmp_path / "mine", **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "mine"]


# ---- downloads, against a local HTTP server ------------------------------------------------------


class Server:
    """Routes: /good/<f>, /garbage/<f> (random bytes), /missing/<f> (404), /cut/<f> (connection
    dropped half-way), /wronghash/<f> (a valid gzip of other data)."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.hits = files, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.hits.append(self.path)
                _, route, name = self.path.split("/", 2)
                blob = outer.files.get(name)
                if route == "missing" or blob is None:
                    self.send_error(404)
                    return
                if route == "garbage":
                    blob = np.random.default_rng().integers(0, 256, 5000, dtype=np.uint8).tobytes()
                elif route == "wronghash":
                    blob = gzip.compress(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + b"\x01\x02\x03")
                self.send_response(200)
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob[: len(blob) // 2] if route == "cut" else blob)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def mirror(self, route):
        return f"{self.url}/{route}/"


@pytest.fixture
def server(rng):
    raw, arrays, spec = make_dataset(rng)
    srv = Server({k + ".gz": gzip.compress(v) for k, v in raw.items()})
    srv.arrays, srv.spec = arrays, spec
    yield srv
    srv.httpd.shutdown()


def cache_files(cache: Path):
    return sorted(p.name for p in cache.rglob("*") if p.is_file())


@pytest.mark.parametrize("bad", ["garbage", "missing", "cut", "wronghash"])
def test_download_falls_back_to_next_mirror(tmp_path, server, bad):
    cache = tmp_path / "cache"
    got = data.load_arrays(
        spec=server.spec,
        cache_dir=cache,
        mirrors=[server.mirror(bad), server.mirror("good")],
        progress=False,
        retries=0,
        timeout=5,
    )
    assert np.array_equal(got[0], server.arrays["train-images-idx3-ubyte"])
    # only verified files, under their final names, landed in the cache
    assert cache_files(cache) == sorted(n + ".gz" for n in server.arrays)
    # and the next load reads the cache without touching the network
    server.hits.clear()
    data.load_arrays(spec=server.spec, cache_dir=cache, mirrors=[server.mirror("good")], progress=False)
    assert server.hits == []


def test_every_mirror_failing_leaves_no_partial_file(tmp_path, server):
    cache = tmp_path / "cache"
    mirrors = [server.mirror("missing"), server.mirror("garbage"), server.mirror("cut")]
    with pytest.raises(DataError) as e:
        data.load_arrays(spec=server.spec, cache_dir=cache, mirrors=mirrors, progress=False, retries=1, timeout=5)
    msg = str(e.value)
    assert "HTTP 404" in msg and "/garbage/" in msg and "/cut/" in msg and "Tried:" in msg
    assert cache_files(cache) == []


def test_unreachable_mirror(tmp_path, server):
    with pytest.raises(DataError, match="ConnectionError"):
        data.load_arrays(
            spec=server.spec,
            cache_dir=tmp_path / "c",
            mirrors=["http://127.0.0.1:9/"],
            progress=False,
            retries=0,
            timeout=2,
        )
    assert cache_files(tmp_path / "c") == []


# ---- the real datasets, where this machine has them ----------------------------------------------


def test_real_mnist_loads_and_verifies(tmp_path):
    folder = mnist_or_skip()
    host = data.load("mnist", data_dir=folder, cache_dir=tmp_path / "cache", progress=False)
    assert host.train_x.shape == (60000, 1, 28, 28) and host.test_x.shape == (10000, 1, 28, 28)
    assert host.train_y[:5].tolist() == [5, 0, 4, 1, 9]  # the well-known first training labels
    assert np.bincount(host.test_y).min() > 800
    seen = data.normalize(host.train_x)  # what the network sees: about zero mean and unit variance
    assert abs(float(seen.mean())) < 0.01 and abs(float(seen.std()) - 1) < 0.02
    assert not (tmp_path / "cache").exists() or cache_files(tmp_path / "cache") == []


def test_real_fashion_mnist_loads_and_verifies(tmp_path):
    from conftest import fashion_or_skip

    folder = fashion_or_skip()
    host = data.load("fashion-mnist", data_dir=folder, cache_dir=tmp_path / "cache", progress=False)
    assert host.train_x.shape == (60000, 1, 28, 28)
    assert np.bincount(host.train_y).tolist() == [6000] * 10  # balanced classes


@pytest.mark.parametrize("n", [0, 5, 4096])
def test_gather_copies_the_rows_in_order_and_refuses_a_bad_index(n):
    """gather's copy (np.take in its "clip" mode, after one check of the indices) is the rows idx in order; the staging
    buffers past the batch stay untouched; an index outside the data, negative included, raises before anything is
    written."""
    rng = np.random.default_rng(n)
    x = rng.integers(0, 256, (20000, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, 20000).astype(np.int32)
    idx = rng.permutation(20000)[:n]
    out_x, out_y = np.full((n + 2, 1, 28, 28), 7, np.uint8), np.full(n + 2, -1, np.int32)
    assert data.gather(x, y, idx, out_x, out_y) == n
    assert np.array_equal(out_x[:n], x[idx]) and np.array_equal(out_y[:n], y[idx])
    assert (out_x[n:] == 7).all() and (out_y[n:] == -1).all()
    for bad in (20000, -1):
        before = out_x.copy()
        with pytest.raises(IndexError, match="outside 0..19999"):
            data.gather(x, y, np.append(idx, bad), out_x, out_y)
        assert np.array_equal(out_x, before)
