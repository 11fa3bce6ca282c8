"""The speed probe in dev/: bf16_distance.py (PyTorch's bf16 distance to its fp32 run)."""

import json

import pytest

from conftest import REPO, mnist_or_skip, run_program

BF16 = REPO / "dev" / "bf16_distance.py"


def run(*args):
    return run_program(BF16, *args)


def test_bf16_distance_rejects_a_bad_flag_in_one_line():
    r = run("--seeds", "0")
    assert r.returncode == 2 and "--seeds" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_bf16_distance_measures_both_distances(tmp_path):
    """A short run: fp32 stays far closer to fp64 than bf16 to fp32 (bf16 keeps 8 bits of mantissa)."""
    pytest.importorskip("torch", reason="torch is not installed (the comparison's extra)")
    mnist = mnist_or_skip()
    out = tmp_path / "bf16.json"
    r = run("--data-dir", str(mnist), "--steps", "60", "--seeds", "1", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(out.read_text())["seeds"]["0"]
    assert 0 < row["fp32_vs_fp64"]["all"] < 1e-4
    assert row["bf16_vs_fp32"]["all"] > 10 * row["fp32_vs_fp64"]["all"]
