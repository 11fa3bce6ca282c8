"""Compile and load the CUDA C kernels of kernels/*.cu, and launch them with checked argument types.

Each .cu file becomes one `cupy.RawModule`, compiled once per process by NVRTC for the device's own
architecture (CuPy keeps compiled modules in its on-disk cache, so later processes skip NVRTC).
`#include "common.cuh"` is inlined here, so the cache key covers the header too.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

SOURCE_FILES = ("input.cu", "conv2d.cu", "conv1_fused.cu", "batchnorm.cu", "activation.cu", "pool.cu", "linear.cu",
                "loss.cu", "reduce.cu", "sgd.cu")
COMPILE_OPTIONS = ("--std=c++17",)
INSTALL_HINT = ("install the CUDA extra: pip install 'mnist-cuda[cuda12]' "
                "(or [cuda13] for a CUDA 13 driver); only an NVIDIA driver is needed besides")


class GPUUnavailable(RuntimeError):
    """CuPy or a CUDA device is missing; the message says what and how to install."""


def kernel_dir() -> Path:
    """kernels/ of a source checkout, or the copy a wheel carries inside the package."""
    packaged = Path(__file__).resolve().parent / "kernels_src"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "kernels"


_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.MULTILINE)


def read_source(name: str) -> str:
    """The text of kernels/<name> with local #include "..." headers inlined (each once)."""
    root, seen = kernel_dir(), set()

    def expand(text: str) -> str:
        def repl(m):
            header = m.group(1)
            if header in seen:
                return ""
            seen.add(header)
            text = (root / header).read_text().replace("#pragma once", "")  # inlined once already
            return f"// ---- {header} ----\n" + expand(text) + f"\n// ---- end {header} ----"
        return _INCLUDE.sub(repl, text)

    return expand((root / name).read_text())


_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(')


def kernel_names(source: str) -> list[str]:
    """The extern "C" __global__ entry points of a source (with or without __launch_bounds__)."""
    return _KERNEL.findall(source)


def compile_check(arch: str = "sm_90") -> dict[str, str]:
    """Compile every source with NVRTC for `arch` without needing a GPU. Returns {file: error log}
    for the files that fail (empty when all compile)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:
        raise GPUUnavailable(f"NVRTC is not available ({e}); {INSTALL_HINT}") from None
    errors = {}
    for name in SOURCE_FILES:
        prog = nvrtc.createProgram(read_source(name), name, (), ())
        try:
            nvrtc.compileProgram(prog, COMPILE_OPTIONS + (f"-arch={arch}",))
        except nvrtc.NVRTCError:
            errors[name] = nvrtc.getProgramLog(prog)
        finally:
            nvrtc.destroyProgram(prog)
    return errors


def require_gpu():
    """Import CuPy and check that a CUDA device answers; raise GPUUnavailable with advice if not."""
    try:
        import cupy
    except ImportError:
        raise GPUUnavailable(f"CuPy is not installed; {INSTALL_HINT}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, insufficient driver, ...
        hint = (" (no NVIDIA driver here, or one older than this CuPy's CUDA)"
                if "InsufficientDriver" in str(e) else "")
        raise GPUUnavailable(f"no usable CUDA GPU: {e}{hint}; this trainer needs an NVIDIA GPU and driver") from None
    if count == 0:
        raise GPUUnavailable("no CUDA GPU found; this trainer needs an NVIDIA GPU and driver")
    return cupy


_arch_specific = True  # on Hopper, compile for sm_90a (conv2d.cu's products then use its warpgroup MMA)


def use_arch_specific(on: bool):
    """Whether the kernels are compiled for sm_90a on a Hopper GPU (conv2d.cu's three products then use its
    warpgroup MMA, wgmma) or for plain sm_XY as on any other GPU (their mma.sync form). The tests run both
    forms on a Hopper GPU; kernels are compiled anew on their next use."""
    global _arch_specific
    _arch_specific = bool(on)
    _module.cache_clear()
    _dynamic_shared.clear()
    _configured.clear()


def _arch_options(cupy) -> tuple[str, ...]:
    # CuPy adds -arch=sm_XY for the device; NVRTC given both -arch=sm_90a and -arch=sm_90 compiles for sm_90a.
    return ("-arch=sm_90a",) if _arch_specific and cupy.cuda.Device().compute_capability == "90" else ()


@functools.lru_cache(maxsize=None)
def _module(name: str):
    cupy = require_gpu()
    return cupy.RawModule(code=read_source(name), options=COMPILE_OPTIONS + _arch_options(cupy))


@functools.lru_cache(maxsize=None)
def _kernel_index() -> dict[str, str]:
    index = {}
    for name in SOURCE_FILES:
        for k in kernel_names(read_source(name)):
            index[k] = name
    return index


def get(kernel: str):
    """The compiled RawKernel by its extern "C" name (compiling its file on first use)."""
    try:
        source = _kernel_index()[kernel]
    except KeyError:
        raise KeyError(f"no kernel named {kernel!r} in {kernel_dir()}") from None
    fn = _module(source).get_function(kernel)
    if kernel not in _configured:
        # Every kernel asks for the same split of the SM's memory between shared memory and L1: the
        # largest shared memory. Kernels that ask for different splits make the SM drain and reconfigure
        # between them; in the step at batch 64 that cost ~16 us (NOTES.md, v12).
        fn.preferred_shared_memory_carveout = 100
        _configured.add(kernel)
    return fn


_configured: set[str] = set()  # kernels whose attributes are set (they stay with the loaded module)


def preload():
    """Compile and load every kernel now (before timing, and before a graph capture, during which
    loading a module is not allowed)."""
    for name in _kernel_index():
        get(name)


_dynamic_shared: dict[str, int] = {}  # kernel -> the dynamic shared memory it may use, where raised
_ARG_TYPES = (np.int32, np.uint32, np.int64, np.float32)


def launch(kernel: str, grid, block, *args, shared_mem: int = 0):
    """Launch on the current stream. Scalars must be explicit NumPy types (np.int32, np.float32):
    a bare Python int would be passed as 64 bits and silently corrupt the following arguments."""
    for i, a in enumerate(args):
        if not (isinstance(a, _ARG_TYPES) or hasattr(a, "data") and hasattr(a, "dtype") and
                type(a).__module__.startswith("cupy")):
            raise TypeError(f"{kernel}: argument {i} is {type(a).__name__}; pass a cupy array, "
                            "np.int32 or np.float32")
    grid = grid if isinstance(grid, tuple) else (int(grid),)
    fn = get(kernel)
    if shared_mem > _dynamic_shared.get(kernel, 48 * 1024):  # more than the default limit must be asked for
        fn.max_dynamic_shared_size_bytes = _dynamic_shared[kernel] = shared_mem
    block = block if isinstance(block, tuple) else (int(block),)
    fn(grid, block, args, shared_mem=shared_mem)


def launch_1d(kernel: str, n: int, *args, block: int = 256):
    """One thread per element for n elements."""
    launch(kernel, (n + block - 1) // block, block, *args)


def pinned_empty(shape, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory (fast, truly asynchronous host-to-device copies)."""
    cupy = require_gpu()
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    mem = cupy.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
    return np.frombuffer(mem, dtype, count).reshape(shape)


# ---- launch geometry of the fast kernels (mirrors the #defines in kernels/, checked by a test) --------

TILE, TILE_K, GEMM_THREADS, GEMM_MIN_BLOCKS = 64, 16, 256, 3
# conv2d_forward_fast and conv2d_backward_input_fast (kernels/conv2d.cu): threads, output channels per block,
# input channels per step, weight float4s per step, image rows per block, staged pixels per channel quad
CONV_THREADS, CONV_TILE_CHANNELS, CONV_CHUNK, CONV_CHUNK_QUADS = 128, 32, 8, 1152
CONV_TILE_CHANNELS_TF32 = 64  # output channels per block of their _tf32 forms (A's 64 rows: no small parts)
CONV_ROWS, CONV_STAGED_PIXELS = 7, 146
# conv2d_backward_weight_fast (kernels/conv2d.cu): threads, input and output channels per block, images per k
# unit, staged x rows
WGRAD_THREADS, WGRAD_CHANNELS, WGRAD_OUT, WGRAD_IMAGES, WGRAD_X_SLOTS = 384, 32, 64, 4, 6
HEAD_SAMPLES, HEAD_THREADS = 16, 512  # samples and threads per block of head_forward_backward_fast (kernels/loss.cu)
CONV1_CHANNELS, CONV1_THREADS = 8, 224  # channels and threads per block of kernels/conv1_fused.cu
CONV1_MOMENTS, CONV1_GRAD_SUMS = 54, 10  # the batch's image moments (doubles), the backward's sums per channel
CONV1_GRAD_CHANNELS = 4  # channels per block of conv1_backward_fast
MAX_PARTS = 64  # per-part reductions (BatchNorm, conv1) use at most this many parts
MAX_SPLITS = 64


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def sm_count() -> int:
    return int(require_gpu().cuda.Device().attributes["MultiProcessorCount"])


def conv_tile_shared_bytes() -> int:
    """Dynamic shared memory of a conv2d_forward_fast / conv2d_backward_input_fast block: two buffers of
    the staged image (2 TF32 parts x 2 channel quads x CONV_STAGED_PIXELS x 16 bytes) and of a chunk's
    weights (CONV_CHUNK_QUADS float4s)."""
    return 2 * 4 * CONV_STAGED_PIXELS * 16 + 2 * CONV_CHUNK_QUADS * 16


def conv_product(name: str, tf32: bool = False) -> str:
    """The entry point of conv2's weight staging ("stage_weights") or of one of its three products
    ("forward", "backward_input", "backward_weight"): conv2d_<name>_fast (3xTF32, fp32 accuracy), or
    conv2d_<name>_tf32 (plain TF32, --tf32)."""
    return f"conv2d_{name}_{'tf32' if tf32 else 'fast'}"


def conv_tile_channels(tf32: bool = False) -> int:
    """Output channels per block of conv2's image-tile products."""
    return CONV_TILE_CHANNELS_TF32 if tf32 else CONV_TILE_CHANNELS


def conv_weight_quads(c_in: int, c_out: int, tf32: bool = False) -> int:
    """Weight float4s of one product staged by conv2d_stage_weights_fast (or _tf32): c_in input and c_out
    output channels."""
    return ceil_div(c_out, conv_tile_channels(tf32)) * ceil_div(c_in, CONV_CHUNK) * CONV_CHUNK_QUADS


def launch_conv_image_tile(product: str, tf32: bool, n: int, out_channels: int, *args):
    """conv2's "forward" or "backward_input" (conv_product): a block per conv_tile_channels() output
    channels and CONV_ROWS rows of an image, with its dynamic shared memory."""
    launch(conv_product(product, tf32), (n, ceil_div(out_channels, conv_tile_channels(tf32)), 14 // CONV_ROWS),
           CONV_THREADS, *args, shared_mem=conv_tile_shared_bytes())


def stage_conv_weights(w, c_in: int, c_out: int, forward_quads, input_grad_quads, tf32: bool = False):
    """conv2d_stage_weights_fast (or _tf32): w [c_out, c_in, 3, 3] as the quads of both products
    (conv_weight_quads each)."""
    launch_1d(conv_product("stage_weights", tf32), forward_quads.shape[0] + input_grad_quads.shape[0], w,
              np.int32(c_in), np.int32(c_out), forward_quads, input_grad_quads)


def conv_weight_grad_shared_bytes() -> int:
    """Dynamic shared memory of a conv2d_backward_weight_fast block: WGRAD_X_SLOTS staged x rows (16 pixels
    x 2 TF32 parts x WGRAD_CHANNELS x 16 bytes each) and two dy rows (14 pixels x 2 parts x WGRAD_OUT x 16
    bytes each)."""
    return WGRAD_X_SLOTS * 16 * 2 * WGRAD_CHANNELS * 16 + 2 * 14 * 2 * WGRAD_OUT * 16


def conv_weight_grid(n: int, c_in: int, c_out: int) -> tuple[tuple[int, int, int], int]:
    """Grid of conv2d_backward_weight_fast and its items per part. An item is an output row of
    WGRAD_IMAGES images; each block sums a run of consecutive items into its own partial result. A block
    fills an SM (152 KB of shared memory, 384 threads x 164 registers), and the kernel runs beside conv2's
    input gradient and conv1's backward (on the side stream), so it gets about half of the SMs: with
    all of them the step took 138 / 459 us at batch 64 / 512, with half 118 / 458, with a third 120 / 482
    (H100, NOTES.md v13)."""
    rows, cols = ceil_div(c_out, WGRAD_OUT), ceil_div(c_in, WGRAD_CHANNELS)
    items = ceil_div(n, WGRAD_IMAGES) * 14
    per_part = ceil_div(items * rows * cols, max(1, sm_count() // 2))
    return (ceil_div(items, per_part), rows, cols), per_part


def launch_conv_weight_grad(n: int, c_in: int, c_out: int, x, dy, partial, tf32: bool = False) -> int:
    """conv2d_backward_weight_fast (or _tf32): its partial results [parts, c_out, c_in, 3, 3] into partial
    (room for sm_count() parts is enough); returns parts, for splitk_reduce."""
    grid, per_part = conv_weight_grid(n, c_in, c_out)
    launch(conv_product("backward_weight", tf32), grid, WGRAD_THREADS, x, dy, partial, np.int32(n), np.int32(c_in),
           np.int32(c_out), np.int32(14), np.int32(14), np.int32(per_part), shared_mem=conv_weight_grad_shared_bytes())
    return grid[0]


def splitk_reduce(partial, splits: int, out, bias=None, relu: bool = False, count=None):
    """out = the sum of the splits' partial results [splits, count] in split order (+ bias by column, then
    ReLU): the second half of every split product."""
    count = out.size if count is None else count
    launch_1d("splitk_reduce", count, partial, np.int32(splits), np.int32(count), partial if bias is None else bias,
              np.int32(out.shape[-1]), np.int32(bias is not None), np.int32(relu), out)


def split_k(k_total: int, tiles: int) -> tuple[int, int]:
    """Cut a product's reduction of length k_total into splits (each a multiple of TILE_K long, at
    least 4 steps) so that tiles * splits blocks run in one wave (GEMM_MIN_BLOCKS per SM): a second,
    partly filled wave cost more than the longer splits (fc1 at batch 512: 528 blocks of 6 steps in
    396 slots -> 352 of 9 steps, the step ~3 us shorter, NOTES.md v19a). Returns (splits, k_per_split)."""
    steps = ceil_div(k_total, TILE_K)
    splits = max(1, min(steps // 4, MAX_SPLITS, GEMM_MIN_BLOCKS * sm_count() // max(tiles, 1)))
    k_per_split = ceil_div(steps, splits) * TILE_K
    return ceil_div(k_total, k_per_split), k_per_split


def max_splits(k_total: int) -> int:
    """An upper bound of split_k's splits for any reduction of length <= k_total (to size scratch)."""
    return max(1, min(MAX_SPLITS, ceil_div(k_total, TILE_K) // 4))


def parts_of(n: int, max_parts: int = MAX_PARTS) -> tuple[int, int]:
    """(parts, images per part) for reductions over a batch of n images, at most max_parts parts."""
    per_part = ceil_div(n, max(1, min(max_parts, MAX_PARTS)))
    return ceil_div(n, per_part), per_part


def linear_input_grad_launch(n: int, n_in: int) -> tuple[str, tuple[int, int]]:
    """(kernel, grid) of fc1's input gradient for a batch of n: linear_backward_input_fast's 64-wide tiles,
    or its narrow form's 32-wide ones where the wide would be fewer blocks than the GPU has SMs."""
    rows = ceil_div(n, TILE)
    if ceil_div(n_in, TILE) * rows < sm_count():
        return "linear_backward_input_narrow_fast", (ceil_div(n_in, TILE // 2), rows)
    return "linear_backward_input_fast", (ceil_div(n_in, TILE), rows)


def head_sums(hidden: int) -> int:
    """Floats of one head_forward_backward_fast block's sums (HEAD_SUMS in kernels/loss.cu)."""
    return 11 * hidden + 11


def conv1_backward_grid(n: int, channels: int) -> tuple[tuple[int, int], int]:
    """Grid of conv1_backward_fast and its images per part: one wave at its two blocks per SM (each block
    loads an image's gradients while it works on the image before, so a longer part costs little)."""
    groups = ceil_div(channels, CONV1_GRAD_CHANNELS)
    parts, per_part = parts_of(n, 2 * sm_count() // groups)
    return (parts, groups), per_part


def conv1_moments_parts(n: int) -> tuple[int, int]:
    """(parts, images per part) of conv1_image_moments_fast: up to a part per SM (a block fills an SM's
    registers, and its last block merges the parts with sum_in_order, which takes any number)."""
    per_part = ceil_div(n, sm_count())
    return ceil_div(n, per_part), per_part
