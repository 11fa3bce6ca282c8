"""dev/grid_barrier.py: its barrier kernels compile for the H200 (CPU) and hold the grid together on a GPU."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "dev" / "grid_barrier.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)


def test_too_few_rounds_is_a_usage_error():
    r = run("--rounds", "3")
    assert r.returncode == 2 and "--rounds" in r.stderr and "Traceback" not in r.stderr


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
    """Each block reads another's round number after every barrier: a barrier that lets a block through
    early counts an error and the script exits 1."""
    out = tmp_path / "barriers.json"
    r = run("--rounds", "200", "--repeats", "3", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    designs = {row["design"] for row in result["barriers"]}
    assert {"cooperative", "counter", "flags", "cluster2+counter", "cluster8"} <= designs
    assert all(row["errors"] == 0 and row["us_per_barrier"] > 0 for row in result["barriers"])
    assert result["graph_launch_us_per_kernel"] > 0
