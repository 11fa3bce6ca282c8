"""The speed probes in dev/: grid_barrier.py (its barrier kernels compile for the H200 without a GPU and
hold the grid together on one), bf16_distance.py (PyTorch's bf16 distance to its fp32 run) and the persistent
forward prototype, persistent_forward.py (both its forms compile without a GPU; on one, they compute what
FastNet's forward and the float64 reference compute)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, mnist_or_skip

SCRIPT = REPO / "dev" / "grid_barrier.py"
BF16 = REPO / "dev" / "bf16_distance.py"
PERSISTENT = REPO / "dev" / "persistent_forward.py"


def run(*args, script=SCRIPT):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)


@pytest.mark.parametrize("flag,value", [("--rounds", "3"), ("--threads", "2048"), ("--threads", "100")])
def test_bad_flags_are_usage_errors(flag, value):
    r = run(flag, value)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
def test_barrier_kernels_compile_for_sm_90(cluster):
    """(The cooperative_groups kernel needs the CUDA headers, which CuPy finds on the GPU machine: the GPU
    test compiles and runs it.)"""
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy is not installed")
    sys.path.insert(0, str(REPO / "dev"))
    import grid_barrier
    prog = nvrtc.createProgram(grid_barrier.SOURCE, "grid_barrier.cu", (), ())
    try:
        nvrtc.compileProgram(prog, ("-arch=sm_90", "-std=c++17", f"-DCLUSTER={cluster}"))
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(prog))
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.gpu
def test_every_barrier_design_holds_the_grid_together(tmp_path):
    """Each block reads another's round number after every grid-wide barrier: a barrier that lets a block
    through early counts an error and the script exits 1. (The cluster-only rows are timed, not checked.)"""
    out = tmp_path / "barriers.json"
    r = run("--rounds", "200", "--repeats", "3", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    designs = {row["design"] for row in result["barriers"]}
    assert {"cooperative", "counter", "flags", "cluster2+counter", "cluster8"} <= designs
    assert all(row["us_per_barrier"] > 0 for row in result["barriers"])
    assert all(row["errors"] == 0 for row in result["barriers"] if not row["design"].startswith("cluster")
               or "+" in row["design"])
    assert result["graph_launch_us_per_kernel"] > 0


def test_bf16_distance_rejects_a_bad_flag_in_one_line():
    r = run("--seeds", "0", script=BF16)
    assert r.returncode == 2 and "--seeds" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_bf16_distance_measures_both_distances(tmp_path):
    """A short run: fp32 stays far closer to fp64 than bf16 to fp32 (bf16 keeps 8 bits of mantissa)."""
    pytest.importorskip("torch", reason="torch is not installed (the comparison's extra)")
    mnist = mnist_or_skip()
    out = tmp_path / "bf16.json"
    r = run("--data-dir", str(mnist), "--steps", "60", "--seeds", "1", "--out", str(out), script=BF16)
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(out.read_text())["seeds"]["0"]
    assert 0 < row["fp32_vs_fp64"]["all"] < 1e-4
    assert row["bf16_vs_fp32"]["all"] > 10 * row["fp32_vs_fp64"]["all"]


@pytest.mark.parametrize("conv1_first", [0, 1])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_persistent_forward_compiles(conv1_first, arch):
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy is not installed")
    sys.path.insert(0, str(REPO / "dev"))
    import persistent_forward
    prog = nvrtc.createProgram(persistent_forward.source(), "persistent_forward.cu", (), ())
    try:
        nvrtc.compileProgram(prog, persistent_forward.compile_options(conv1_first, (f"-arch={arch}",)))
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(prog))
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.parametrize("flag,value", [("--windows", "2"), ("--warmup-seconds", "-1"), ("--seed", "x")])
def test_persistent_forward_rejects_a_bad_flag_in_one_line(flag, value):
    r = run(flag, value, script=PERSISTENT)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_persistent_forward_computes_the_forward(tmp_path):
    """Both forms against FastNet's forward (conv1's pooled output and conv2's output to the bit) and the float64
    reference (logits, loss, the gradient at fc1's pre-activation within 1e-4); a failed check exits 1."""
    data_dir = mnist_or_skip()
    out = tmp_path / "persistent.json"
    r = run("--data-dir", str(data_dir), "--windows", "5", "--warmup-seconds", "0", "--out", str(out),
            script=PERSISTENT)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["checks_pass"] and set(result["checks"]) == {"conv1 as staged", "conv1 first"}
    for checks in result["checks"].values():
        assert checks["a2 (same bits)"] == 0 and checks["logits vs float64"] < 1e-4
    assert all(us > 0 for us in result["median_us"].values()) and result["verdict"] in ("go", "no-go")
