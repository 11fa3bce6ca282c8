"""`python -m mnist_cuda.train`: flag errors and the missing-GPU message (CPU), real runs (GPU)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import MNIST_HINT, REPO, find_mnist_dir
from mnist_cuda import checkpoint, reference


def run_train(*args, env=None, timeout=600):
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "mnist_cuda.train", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("args,flag", [
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "x"], "--batch-size"),
    (["--lr", "-1"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--dataset", "cifar"], "--dataset"),
    (["--channels", "32"], "--channels"),
    (["--channels", "32,x"], "--channels"),
    (["--channels", "0,4"], "--channels"),
    (["--epochs", "0"], "--epochs"),
    (["--steps", "-2"], "--steps"),
    (["--steps", "0"], "--steps"),  # needs --save
    (["--tf32", "--kernels", "naive"], "--tf32"),
])
def test_bad_flags_are_usage_errors(args, flag):
    r = run_train(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr and flag in r.stderr and "Traceback" not in r.stderr


def test_help():
    r = run_train("--help")
    assert r.returncode == 0 and "--batch-size" in r.stdout and "--channels" in r.stdout


def test_init_with_mismatched_shapes_is_a_usage_error(tmp_path):
    path = tmp_path / "small.npz"
    checkpoint.save_checkpoint(path, reference.init_state_dict(0, (4, 8), 16))
    r = run_train("--init", str(path))
    assert r.returncode == 2 and "--init" in r.stderr and "conv1.weight has shape" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_train("--init", str(tmp_path / "missing.npz"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_steps_zero_writes_the_initial_checkpoint(tmp_path):
    path = tmp_path / "init.npz"
    r = run_train("--steps", "0", "--save", str(path), "--seed", "3", "--channels", "4,8", "--hidden", "16")
    assert r.returncode == 0, r.stderr
    state, meta = checkpoint.load_checkpoint(path, reference.state_dict_spec((4, 8), 16))
    assert np.array_equal(state["conv2.weight"], reference.init_state_dict(3, (4, 8), 16)["conv2.weight"])
    assert meta["channels"] == [4, 8] and meta["step"] == 0


def test_no_gpu_is_one_clear_line():
    r = run_train("--steps", "1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "GPU" in r.stderr or "CuPy" in r.stderr


def test_no_cupy_is_one_clear_line():
    code = ("import sys; sys.modules['cupy'] = None; from mnist_cuda.train import main; "
            "sys.exit(main(['--steps', '1']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "CuPy is not installed" in r.stderr and "pip install" in r.stderr


# ---- real runs on the GPU ------------------------------------------------------------------------


def mnist_or_skip():
    folder = find_mnist_dir()
    if folder is None:
        pytest.skip(MNIST_HINT)
    return folder


@pytest.mark.gpu
def test_short_run_writes_checkpoint_and_metrics(tmp_path):
    folder = mnist_or_skip()
    ck, metrics = tmp_path / "m.npz", tmp_path / "m.jsonl"
    r = run_train("--data-dir", str(folder), "--steps", "120", "--save", str(ck), "--metrics", str(metrics), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout and "per-phase mean" in r.stdout
    state, meta = checkpoint.load_checkpoint(ck, reference.state_dict_spec())
    assert meta["step"] == 120 and int(state["bn1.num_batches_tracked"]) == 120
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [d for d in lines if "loss" in d]
    assert [d["step"] for d in steps] == list(range(1, 121)) and lines[-1]["test_accuracy"] > 0.9
    # continue from the checkpoint
    r = run_train("--data-dir", str(folder), "--steps", "10", "--init", str(ck), "--save", str(ck), "--quiet")
    assert r.returncode == 0, r.stderr
    assert checkpoint.load_checkpoint(ck)[1]["step"] == 130


@pytest.mark.gpu
def test_divergence_stops_and_keeps_the_last_checkpoint(tmp_path):
    folder = mnist_or_skip()
    ck = tmp_path / "m.npz"
    checkpoint.save_checkpoint(ck, reference.init_state_dict(0), {"step": 0})
    before = ck.read_bytes()
    r = run_train("--data-dir", str(folder), "--lr", "1e30", "--save", str(ck), "--quiet")
    assert r.returncode == 1 and "at step" in r.stderr and "Traceback" not in r.stderr
    assert ck.read_bytes() == before
