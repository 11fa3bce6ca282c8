"""Checkpoints: round trip, atomic writes, clear errors, and PyTorch compatibility."""

import zipfile

import numpy as np
import pytest

from mnist_cuda import checkpoint, reference
from mnist_cuda.checkpoint import CheckpointError


def test_roundtrip_with_metadata(tmp_path):
    state = reference.init_state_dict(seed=7, channels=(4, 6), hidden=9)
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", state, {"dataset": "mnist", "step": 3})
    got, meta = checkpoint.load_checkpoint(path, reference.state_dict_spec((4, 6), 9))
    assert list(got) == list(state)
    for k in state:
        assert got[k].dtype == state[k].dtype and np.array_equal(got[k], state[k])
    assert meta["dataset"] == "mnist" and meta["step"] == 3 and meta["format"] == checkpoint.FORMAT
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # no temporary left behind


def test_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "m.npz"
    state = reference.init_state_dict(seed=1, channels=(2, 3), hidden=4)
    checkpoint.save_checkpoint(path, state, {"step": 1})
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint(path, state, {"step": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]


def test_clear_errors(tmp_path):
    spec = reference.state_dict_spec((4, 6), 9)
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load_checkpoint(tmp_path / "none.npz", spec)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="not a checkpoint .not an .npz archive"):
        checkpoint.load_checkpoint(tmp_path / "junk.npz", spec)
    with pytest.raises(CheckpointError, match="directory .* does not exist"):
        checkpoint.save_checkpoint(tmp_path / "no" / "m.npz", {})

    state = reference.init_state_dict(seed=0, channels=(4, 6), hidden=9)
    other = reference.init_state_dict(seed=0, channels=(4, 8), hidden=9)
    checkpoint.save_checkpoint(tmp_path / "other.npz", other)
    with pytest.raises(CheckpointError, match=r"conv2.weight has shape \(8, 4, 3, 3\), the model needs \(6, 4, 3, 3\)"):
        checkpoint.load_checkpoint(tmp_path / "other.npz", spec)
    bad = dict(state, **{"fc1.bias": state["fc1.bias"].astype(np.float64)})
    checkpoint.save_checkpoint(tmp_path / "f64.npz", bad)
    with pytest.raises(CheckpointError, match="fc1.bias has dtype float64"):
        checkpoint.load_checkpoint(tmp_path / "f64.npz", spec)
    partial = {k: v for k, v in state.items() if k != "fc2.bias"}
    partial["extra"] = np.zeros(1)
    checkpoint.save_checkpoint(tmp_path / "partial.npz", partial)
    with pytest.raises(CheckpointError, match="missing fc2.bias; unexpected extra"):
        checkpoint.load_checkpoint(tmp_path / "partial.npz", spec)


def test_torch_loads_our_checkpoint(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]' in the source folder)")
    from mnist_cuda.torch_model import make_torch_model

    state = reference.init_state_dict(seed=2)
    checkpoint.save_checkpoint(tmp_path / "m.npz", state)
    got, _ = checkpoint.load_checkpoint(tmp_path / "m.npz", reference.state_dict_spec())
    net = make_torch_model()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in got.items()}, strict=True)
    back = {k: v.numpy() for k, v in net.state_dict().items()}
    assert list(back) == list(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and np.array_equal(back[k], state[k])


def _written(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: _written(d / "plain.npz", w=np.zeros(3)), "no mnist_cuda metadata record"),
        (lambda d: _written(d / "pickled.npz", w=np.array([{"a": 1}], dtype=object)), "pickled Python objects"),
        (lambda d: (np.save(d / "array.npy", np.zeros(3)), d / "array.npy")[1], "not an .npz archive"),
        (lambda d: (d / "empty.npz").write_bytes(b"") and None or d / "empty.npz", "not an .npz archive"),
        (lambda d: d, "is a folder"),
    ],
)
def test_not_a_checkpoint_says_what_a_checkpoint_is(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as e:
        checkpoint.load_checkpoint(path)
    assert "allow_pickle" not in str(e.value) and "\n" not in str(e.value)


def test_load_model_reads_the_headers_once(tmp_path, monkeypatch):
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", reference.init_state_dict(0, (2, 3), 4), {"step": 1})
    calls = []
    read = checkpoint.read_headers
    monkeypatch.setattr(checkpoint, "read_headers", lambda p: calls.append(p) or read(p))
    state, meta, channels, hidden, _ = checkpoint.load_model(path)
    assert len(calls) == 1 and (channels, hidden) == ((2, 3), 4) and meta["step"] == 1


def test_a_member_shorter_than_its_header_is_not_an_array(tmp_path):
    """The archive and its headers are sound, but a member's data ends early: NumPy's ValueError is ours."""
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", reference.init_state_dict(0, (2, 3), 4), {"step": 1})
    short = tmp_path / "short.npz"
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(short, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            new.writestr(info.filename, data[:-8] if info.filename == "fc1.weight.npy" else data)
    with pytest.raises(CheckpointError, match="a member is not a NumPy array") as e:
        checkpoint.load_model(short)
    assert "\n" not in str(e.value) and "--save PATH" in str(e.value)


def test_truncated_checkpoint(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", reference.init_state_dict(0, (2, 3), 4), {"step": 1})
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="not a readable .npz checkpoint"):
        checkpoint.load_checkpoint(path)


def test_other_format_version_is_refused(tmp_path):
    state = reference.init_state_dict(0, (2, 3), 4)
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", state, {"format": "mnist_cuda.checkpoint/0"})
    with pytest.raises(CheckpointError, match="format 'mnist_cuda.checkpoint/0'.*reads 'mnist_cuda.checkpoint/1'"):
        checkpoint.load_checkpoint(path)


def test_load_model_reads_the_shapes(tmp_path):
    state = reference.init_state_dict(0, (4, 6), 9)
    path = checkpoint.save_checkpoint(tmp_path / "m.npz", state, {"step": 5})
    got, meta, channels, hidden, buffers = checkpoint.load_model(path)
    assert channels == (4, 6) and hidden == 9 and meta["step"] == 5 and list(got) == list(state) and buffers == {}
