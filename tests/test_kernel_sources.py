"""Every kernel source compiles with NVRTC for the H100 (sm_90, and sm_90a) and an A100 (sm_80); no GPU needed, so CI catches syntax
errors. Also the launch helper's guard against untyped scalars."""
import numpy as np
import pytest

from mnist_cuda import data, kernels


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_80"])  # sm_90a: conv2d.cu's wgmma form
def test_every_kernel_compiles(arch):
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'mnist-cuda[cuda12]')")
    errors = kernels.compile_check(arch)
    assert errors == {}, "\n".join(f"{k}:\n{v}" for k, v in errors.items())


def test_compile_check_reports_errors(monkeypatch):
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'mnist-cuda[cuda12]')")
    real = kernels.read_source
    monkeypatch.setattr(kernels, "read_source", lambda name: real(name) + ("\nint broken(" if name == "sgd.cu" else ""))
    errors = kernels.compile_check("sm_90")
    assert list(errors) == ["sgd.cu"] and "error" in errors["sgd.cu"]


def test_header_is_inlined_once():
    src = kernels.read_source("batchnorm.cu")
    assert '#include "common.cuh"' not in src and src.count("block_sum(float v)") == 1


def test_every_source_file_is_listed():
    on_disk = sorted(p.name for p in kernels.kernel_dir().glob("*.cu"))
    assert on_disk == sorted(kernels.SOURCE_FILES)


def test_launch_rejects_python_scalars():
    with pytest.raises(TypeError, match="np.int32"):
        kernels.launch("sgd_update", 1, 32, 3)
    with pytest.raises(TypeError, match="argument 1 is float"):
        kernels.launch("sgd_update", 1, 32, np.int32(1), 0.5)


def test_every_global_function_is_indexed_by_its_name():
    for name in kernels.SOURCE_FILES:
        src = kernels.read_source(name)
        names = kernels.kernel_names(src)
        assert len(names) == src.count("__global__"), name
        assert not any(n.startswith("__") for n in names), names


def test_every_launched_kernel_exists():
    import re
    defined = {k for f in kernels.SOURCE_FILES for k in kernels.kernel_names(kernels.read_source(f))}
    root = kernels.kernel_dir().parent
    launched = set()
    for path in [root / "mnist_cuda" / n for n in ("model.py", "kernel_checks.py", "kernels.py")]:
        launched |= set(re.findall(r'launch(?:_1d)?\(\s*"(\w+)"', path.read_text()))
    assert len(launched) > 30 and launched <= defined, launched - defined


def test_launch_geometry_mirrors_the_kernels_defines():
    """The launch constants in mnist_cuda/kernels.py must equal the #defines the kernels were written for
    (a mismatch launches the wrong grid or block size, or overruns a scratch buffer)."""
    import re

    def define(source, name):
        m = re.search(rf"^#define {name} (\d+)", kernels.read_source(source), re.MULTILINE)
        assert m, f"{name} not defined in {source}"
        return int(m.group(1))

    pairs = [("conv2d.cu", "TILE_M", kernels.TILE), ("conv2d.cu", "TILE_N", kernels.TILE),
             ("conv2d.cu", "TILE_K", kernels.TILE_K), ("conv2d.cu", "GEMM_THREADS", kernels.GEMM_THREADS),
             ("conv2d.cu", "GEMM_MIN_BLOCKS", kernels.GEMM_MIN_BLOCKS),
             ("conv2d.cu", "CONV_THREADS", kernels.CONV_THREADS),
             ("conv2d.cu", "CONV_TILE_CHANNELS", kernels.CONV_TILE_CHANNELS),
             ("conv2d.cu", "CONV_TILE_CHANNELS_TF32", kernels.CONV_TILE_CHANNELS_TF32),
             ("conv2d.cu", "CONV_CHUNK", kernels.CONV_CHUNK), ("conv2d.cu", "CONV_CHUNK_QUADS", kernels.CONV_CHUNK_QUADS),
             ("conv2d.cu", "CONV_ROWS", kernels.CONV_ROWS), ("conv2d.cu", "CONV_STAGED_PIXELS", kernels.CONV_STAGED_PIXELS),
             ("conv2d.cu", "WGRAD_THREADS", kernels.WGRAD_THREADS),
             ("conv2d.cu", "WGRAD_CHANNELS", kernels.WGRAD_CHANNELS), ("conv2d.cu", "WGRAD_OUT", kernels.WGRAD_OUT),
             ("conv2d.cu", "WGRAD_IMAGES", kernels.WGRAD_IMAGES), ("conv2d.cu", "WGRAD_X_SLOTS", kernels.WGRAD_X_SLOTS),
             ("loss.cu", "HEAD_SAMPLES", kernels.HEAD_SAMPLES), ("loss.cu", "HEAD_THREADS", kernels.HEAD_THREADS),
             ("batchnorm.cu", "MAX_PARTS", kernels.MAX_PARTS),
             ("conv1_fused.cu", "CHANNELS", kernels.CONV1_CHANNELS),
             ("conv1_fused.cu", "THREADS", kernels.CONV1_THREADS),
             ("conv1_fused.cu", "MOMENTS", kernels.CONV1_MOMENTS),
             ("conv1_fused.cu", "GRAD_SUMS", kernels.CONV1_GRAD_SUMS),
             ("conv1_fused.cu", "GRAD_CHANNELS", kernels.CONV1_GRAD_CHANNELS)]
    for source, name, value in pairs:
        assert define(source, name) == value, (source, name)
    m = re.search(r"^#define HEAD_SUMS\(H\) \((\d+) \* \(H\) \+ (\d+)\)", kernels.read_source("loss.cu"), re.MULTILINE)
    assert m and all(int(m.group(1)) * h + int(m.group(2)) == kernels.head_sums(h) for h in (1, 33, 128)), "HEAD_SUMS"
    for name, value in (("MNIST_MEAN", data.MEAN), ("MNIST_STD", data.STD)):  # the kernels' normalisation
        m = re.search(rf"^#define {name} ([0-9.]+)f$", kernels.read_source("common.cuh"), re.MULTILINE)
        assert m and float(m.group(1)) == value, name
