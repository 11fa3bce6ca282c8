"""What every kernel source shares: the data's constants, the limit of the per-part reductions and the
pooled position that marks a window the ReLU blocked, as NVRTC -D options, and the argument types."""

from __future__ import annotations

import numpy as np

from .. import cuda, data

I32, F32 = np.int32, np.float32
MAX_PARTS = 64  # a reduction over the batch uses at most this many parts (kernels/include/part_reduce.cuh)
NULL = np.int64(0)  # a null pointer argument: a kernel's optional buffer not passed
NO_POSITION = 4  # the blocks' argmax where the ReLU blocked the window (kernels/include/common.cuh, pool_position)
CLASSES = data.NUM_CLASSES
COMMON_DEFINES = {
    "MNIST_MEAN": data.MEAN,
    "MNIST_STD": data.STD,
    "NUM_CLASSES": CLASSES,
    "MAX_PARTS": MAX_PARTS,
    "NO_POSITION": NO_POSITION,
}


def source(path: str, **defines) -> cuda.Source:
    """kernels/<path> with the common -D options and its own."""
    return cuda.Source(path, {**COMMON_DEFINES, **defines})


def precision_kernels(src: cuda.Source, op: str, names, precisions: dict):
    """The instantiations `{op}_{name}_fast<{precisions[p]}>` of src's kernel templates, for every name and
    precision p; returns kernel(name, p), which names the precisions for an unknown one."""
    kernels = {(name, p): src.kernel(f"{op}_{name}_fast<{expr}>") for name in names for p, expr in precisions.items()}

    def kernel(name: str, precision: str) -> cuda.Kernel:
        try:
            return kernels[name, precision]
        except KeyError:
            raise ValueError(f"unknown precision {precision!r}; choose from {tuple(precisions)}") from None

    return kernel


# bf16 activations in device memory (conv2's input and output, fc1's input, and their gradients with --precision
# bf16): the upper 16 bits of each float32, as uint16 arrays (CuPy has no bfloat16); the kernels' type for them is
# bfloat16 (common.cuh)
BF16 = np.uint16
STORED_TYPES = {np.dtype(np.float32): "float", np.dtype(BF16): "bfloat16"}


def stored_kernels(src: cuda.Source, name: str, *arguments) -> dict:
    """The instantiations name<float> and name<bfloat16> of a kernel template over a stored activation's type (after
    its other template arguments, if any), keyed by the arrays' dtype (float32, BF16)."""
    return {dtype: src.kernel(f"{name}<{', '.join((*map(str, arguments), t))}>") for dtype, t in STORED_TYPES.items()}


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of bf16 bits (uint16): exact."""
    return (np.asarray(bits, BF16).astype(np.uint32) << 16).view(np.float32)


def widen(stored: np.ndarray) -> np.ndarray:
    """A host array of stored activations (float32, or BF16 bits) as float32 (exact)."""
    stored = np.asarray(stored)
    return bf16_values(stored) if stored.dtype == np.dtype(BF16) else stored.astype(np.float32, copy=False)


def activation_dtype(precision: str):
    """The dtype the step stores the activations between conv2 and fc1 (and their gradients) in at `precision`: bf16
    bits (BF16) in "bf16", as autocast stores them, float32 otherwise. The precision is the caller's to check."""
    return np.dtype(BF16 if precision == "bf16" else np.float32)


def check_stored(array, name: str, want, layer: str, precision: str):
    """A product's activation array must have the dtype its layer stores it in at `precision` (want)."""
    if np.dtype(array.dtype) != want:
        raise ValueError(f"{name} is {np.dtype(array.dtype)}; {layer} stores it as {want} in {precision}")


def stored_kernel(kernels: dict, what: str, *arrays):
    """The kernel of stored_kernels for the arrays' dtype, which they must share (float32 or BF16)."""
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1 or next(iter(dtypes)) not in kernels:
        names = ", ".join(str(np.dtype(a.dtype)) for a in arrays)
        raise ValueError(f"{what} must be float32, or bf16 ({np.dtype(BF16)}) alike; got {names}")
    return kernels[dtypes.pop()]


def parts_of(n: int, max_parts: int = MAX_PARTS) -> tuple[int, int]:
    """(parts, images per part) for reductions over a batch of n images, at most max_parts parts."""
    per_part = cuda.ceil_div(n, max(1, min(max_parts, MAX_PARTS)))
    return cuda.ceil_div(n, per_part), per_part
