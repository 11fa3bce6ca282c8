"""What every kernel case shares: the case and its prepared run (Case, Prepared, Dims), the op families, the
tolerances against the float64 reference, the comparisons, the helpers that build inputs and poisoned outputs
on the device, and check(), which runs a prepared case once and measures its errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .. import cuda, data
from .. import reference as ref
from ..ops import conv2_implicit_gemm as conv2
from ..ops.common import BF16, bf16_values

EPS, MOMENTUM = ref.BN_EPS, ref.BN_MOMENTUM
# The op families: one per file of kernels/naive/ (its op: naive/3_batchnorm.cu, batchnorm), in the step's
# order, then one per file of kernels/both/, the kernels both nets launch (its kernel: both/count_correct.cu,
# count_correct). A case belongs to the families of its kernels' naive and both files, and a fast case to
# every family whose naive kernels its kernels replace (each kernels/fast/ file's header names them: "the
# fast form of naive/...").
FAMILIES = (
    "normalize",
    "conv2d",
    "batchnorm",
    "relu",
    "maxpool",
    "linear",
    "cross_entropy",
    "sgd",
    "shift_images",
    "sgd_schedule",
    "count_correct",
)
BLOCK1_OPS = ("normalize", "conv2d", "batchnorm", "relu", "maxpool")  # 1_conv1_bn_relu_pool.cu
BLOCK2_OPS = ("batchnorm", "relu", "maxpool")  # 3_bn_relu_pool.cu


@dataclasses.dataclass
class Dims:
    batch: int
    c1: int
    c2: int
    hidden: int

    def __str__(self):
        return f"N={self.batch},C={self.c1},{self.c2},H={self.hidden}"


@dataclasses.dataclass
class Prepared:
    run: Callable[[], None]
    outputs: dict
    expected: dict
    work: tuple[float, float]
    compare: dict = dataclasses.field(default_factory=dict)  # name -> fn(got, want) -> error, if not default


# Largest relative error (rel_err) a kernel may have against the float64 reference: fp32 kernels land near
# 1e-6 to 1e-5; plain TF32 ones (conv2's <tf32> products, 10-bit mantissas) near 3e-4; bf16 ones (conv2's
# and fc1's <bf16> products, 7-bit stored mantissas) near 3e-3 (docs/design.md).
FP32_TOL, TF32_TOL, BF16_TOL = 1e-4, 1e-3, 1e-2
# The paired input gradient (near 2e-6) is held closer: its second set of accumulators is moved one column
# over by lane shuffles, and in a float64 model of it one lane's column taken wrong moves the result by ~6e-5,
# which FP32_TOL would pass.
PAIRED_TOL = 1e-5


@dataclasses.dataclass
class Case:
    name: str  # the kernel(s), conv2's precision, and which layer's geometry
    make: Callable[[np.random.Generator, Dims], Prepared]
    tol: float = FP32_TOL
    ops: tuple[str, ...] = ()  # the op families (FAMILIES) this case covers
    sm90a: bool = False  # its kernels exist only compiled for sm_90a (a Hopper GPU): see runnable()


def runnable(case: Case) -> bool:
    """Whether the case's kernels can run here (GPU present): an sm_90a-only case needs a Hopper GPU with
    the kernels compiled for it (mnist_cuda.cuda.arch_specific)."""
    return not case.sm90a or cuda.arch_specific()


def listed_kernels(case: Case) -> set[str]:
    """The kernels the case's name lists, as the ops modules declare them: conv2's short precision names written
    out ("conv2_forward_fast<tf32>" -> "conv2_forward_fast<Precision::Tf32>"), the other template arguments as
    they are."""
    listed = case.name.split("[")[0]
    for short, full in conv2.KERNEL_PRECISION.items():
        listed = listed.replace(f"<{short}>", f"<{full}>")
    return set(listed.split("+"))


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _exact(got, want) -> float:
    return 0.0 if np.array_equal(got, want) else float("inf")


def _same_bits(got, want) -> float:
    """Exact, bit for bit (bf16 pairs read as float32 can be NaN patterns)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    return (
        0.0 if got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)) else float("inf")
    )


def round_bf16_bits(v: np.ndarray) -> np.ndarray:
    """The bf16 bits (uint16) of float32 v rounded to the nearest, ties to even (PTX cvt.rn.bf16x2.f32;
    finite v)."""
    bits = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def round_bf16(v: np.ndarray) -> np.ndarray:
    """float32 v rounded to the nearest bf16, as float32."""
    return bf16_values(round_bf16_bits(v))


def _dev(a, dtype=np.float32):
    """a on the device as dtype; as BF16 (common.BF16), a rounded to the nearest bf16, stored as its bits."""
    import cupy

    if np.dtype(dtype) == np.dtype(BF16):
        return cupy.asarray(round_bf16_bits(np.ascontiguousarray(a, np.float32)))
    return cupy.asarray(np.ascontiguousarray(a, dtype=dtype))


def _poison(shape, dtype=np.float32):
    """An output buffer filled with what no kernel writes: NaN (a bf16 NaN for BF16), 255 for bytes."""
    import cupy

    fill = {np.dtype(np.uint8): 255, np.dtype(BF16): 0x7FC0}.get(np.dtype(dtype), np.nan)
    return cupy.full(shape, fill, dtype=dtype)


def held_to(tol: float, case_tol: float):
    """A comparison for an output held to tol in a case whose tolerance is case_tol (a case with a bf16 output
    beside float32 ones): its relative error, scaled so that passing case_tol means passing tol."""
    return lambda got, want: rel_err(got, want) * case_tol / tol


def _f32(rng, shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def _geometry(d: Dims, layer: int):
    """(N, C_in, C_out, size) of conv block `layer`."""
    return (d.batch, 1, d.c1, 28) if layer == 1 else (d.batch, d.c1, d.c2, 14)


def _block_input(rng, d: Dims, layer: int, scale: float, shift: float, stored=np.float32):
    """(x, x on the device) for conv block `layer`: block 1 reads images as bytes, and x is what the
    network sees (data.normalize); block 2 reads conv2's output (random here), float32 or bf16 (stored BF16:
    x then holds the values rounded to bf16, what the kernel reads)."""
    N, C_in, K, S = _geometry(d, layer)
    if layer == 1:
        images = rng.integers(0, 256, (N, 1, S, S), dtype=np.uint8)
        return data.normalize(images), _dev(images, np.uint8)
    x = _f32(rng, (N, K, S, S), scale, shift)
    if np.dtype(stored) == np.dtype(BF16):
        x = round_bf16(x)
    return x, _dev(x, stored)


def _bytes(*arrays) -> float:
    return float(sum(a.nbytes for a in arrays))


def _tol(version: str) -> float:
    return {"tf32": TF32_TOL, "bf16": BF16_TOL}.get(version, FP32_TOL)


def _check_precision(precision: str):
    if precision not in conv2.KERNEL_PRECISION:
        raise ValueError(f"unknown precision {precision!r}; choose from {tuple(conv2.KERNEL_PRECISION)}")


def _linear_geometry(d: Dims, layer: str):
    return (d.batch, d.c2 * 49, d.hidden) if layer == "fc1" else (d.batch, d.hidden, 10)


def check(prepared: Prepared) -> dict[str, float]:
    """Run once and return {output: relative error} (exact comparison for integer outputs; a bf16 output, BF16,
    is compared by its values)."""
    import cupy

    prepared.run()
    cupy.cuda.get_current_stream().synchronize()
    errors = {}
    for name, out in prepared.outputs.items():
        got, want = out.get(), np.asarray(prepared.expected[name])
        if got.dtype == np.dtype(BF16):
            got = bf16_values(got)
        if name in prepared.compare:
            errors[name] = prepared.compare[name](got, want)
        elif got.dtype.kind in "iu":
            errors[name] = 0.0 if np.array_equal(got.ravel(), want.ravel()) else float("inf")
        else:
            errors[name] = rel_err(got, want)
    return errors
