"""What an op of the kernel ladders is (dev/ladder.py runs them): its rungs, its shapes, its inputs and outputs, its
float64 reference and its count of FLOPs and bytes; and the peaks its floors are counted against.

Each op lives in dev/ladder/<op>/: the rung files NN_name.cu and op.py, whose OP is an Op of this module.
"""

import dataclasses
from collections.abc import Callable

import numpy as np

from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import FP32_TOL
from mnist_cuda.sizes import GRID_LIMIT

# NVIDIA's H200 SXM datasheet (docs/performance.md, section 1, takes the same): FP32 67 TFLOP/s on the CUDA cores;
# TF32 989 TFLOP/s on the tensor cores with structured sparsity, so about 495 dense, and BF16 twice that, about 990
# dense; GPU memory 4.8 TB/s.
# A rung's floor is its FLOPs at the peak of the units it runs on, or its fewest bytes at the bandwidth, whichever
# takes longer; 3xTF32 issues three TF32 products for each one it computes.
HBM_BYTES_PER_S = 4.8e12
PEAK_FLOPS = {"fp32": 67e12, "tf32": 495e12, "3xtf32": 495e12 / 3, "bf16": 990e12}
UNIT_WORDS = {
    "fp32": "fp32 on the CUDA cores",
    "tf32": "TF32 tensor cores",
    "3xtf32": "3xTF32, TF32 tensor cores",
    "bf16": "bf16 tensor cores",
}


@dataclasses.dataclass(frozen=True)
class Rung:
    """A rung of the ladder's own: one kernel in one file of dev/ladder/<op>/."""

    file: str  # NN_name.cu in dev/ladder/<op>/
    kernel: str  # its extern "C" kernel; or several, "a + b", that it launches in this order
    launch: Callable  # launch(kernel, shape, *inputs, *outputs): the rung's grid, block and arguments (with several
    # kernels, `kernel` is the tuple of them, in the order `kernel` names them)
    defines: dict = dataclasses.field(default_factory=dict)  # its -D options
    unit: str = "fp32"  # the units its products run on (PEAK_FLOPS)
    tolerance: float = FP32_TOL  # its largest relative error against the reference

    @property
    def name(self) -> str:
        return self.file.removesuffix(".cu")

    @property
    def kernels(self) -> list[str]:
        return self.kernel.split(" + ")

    def accepts(self, shape) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class ProductRung:
    """The top rung: the product's fast kernel itself, launched through its launch contract in mnist_cuda.ops, so
    the ladder cannot drift from what the step runs. prepare(shape, *inputs, *outputs) makes what the kernel needs
    besides (staged weights, scratch) and returns the launch, or (the launch, finish) where the kernel writes its
    outputs in another type (bf16): finish, untimed, puts them into the op's float32 outputs for the check;
    accepts(shape) says which shapes the product takes (it is built for the network's geometry). An op has its
    product in fp32 (NN_product) and may have it in --precision bf16 as well (NN_product_bf16, above it), whose
    bytes differ from the op's: work, if given, counts them; and the bf16 product in further forms above that
    (NN_product_bf16_persistent, then NN_product_bf16_moments: conv2's forward), then the fp32 product with its
    output's moments (NN_product_tile_moments: conv2's forward) and that product's persistent forms
    (NN_product_warpgroup_pair, then NN_product_warp_specialized)."""

    name: str  # NN_product, NN_product_bf16, NN_product_bf16_persistent, ..._bf16_moments, ..._tile_moments, ..
    path: str  # the product's kernel file, under kernels/
    kernel: str  # the kernel the rung launches (the step's, in its form at the network's geometry)
    prepare: Callable
    accepts: Callable
    unit: str = "3xtf32"
    tolerance: float = FP32_TOL
    work: Callable | None = None  # work(shape) -> (FLOPs, fewest bytes), where not the op's

    @property
    def file(self) -> str:
        return self.path


@dataclasses.dataclass(frozen=True)
class Op:
    rungs: tuple  # Rung ..., then the ProductRungs (the product and its bf16 forms), last
    geometry: str  # the network's shapes, in words
    check_shapes: tuple  # the shapes every rung is checked at (those it accepts)
    network_shape: Callable  # network_shape(batch): the shape it is timed at
    inputs: Callable  # inputs(rng, shape) -> {name: float32 host array}, in the launch's order
    outputs: Callable  # outputs(shape) -> {name: shape of the array}, in the launch's order
    reference: Callable  # reference(**float64 inputs) -> {name: float64 array}
    work: Callable  # work(shape) -> (FLOPs, fewest bytes moved)
    naive: tuple  # rung 01's kernel(s) in the product: (its file under kernels/, its kernel as Rung.kernel names it),
    # or a tuple of such pairs where they come from several files, in rung 01's order
    # initial(inputs) -> {output name: host array}: the outputs a kernel updates in place (the running statistics)
    # start from these instead of NaN
    initial: Callable | None = None
    # scratch(shape) -> {name: shape}: float32 buffers, zeroed, that a rung needs besides its outputs (partial sums,
    # a naive chain's intermediates), passed after the outputs and never checked; made with the inputs, so no
    # launch allocates (the timing captures launches in a CUDA graph)
    scratch: Callable | None = None


def floor_us(op: Op, rung, shape) -> float:
    flops, nbytes = (getattr(rung, "work", None) or op.work)(shape)
    return max(flops / PEAK_FLOPS[rung.unit], nbytes / HBM_BYTES_PER_S) * 1e6


# ---- shapes and grids the convolution ops share ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Conv:
    """A 3x3 convolution, stride 1, zero padding 1: x [n, c, h, w], w [k, c, 3, 3] -> y [n, k, h, w]."""

    n: int
    c: int
    k: int
    h: int
    w: int

    def __str__(self):
        return f"N={self.n},C={self.c},K={self.k},{self.h}x{self.w}"

    def ints(self) -> tuple:
        return tuple(np.int32(v) for v in (self.n, self.c, self.k, self.h, self.w))


def image_tile_grid(s: Conv, tile_h: int, tile_w: int, tile_k: int, channels: int | None = None) -> tuple:
    """(the image's spatial tiles, row by row; the tiles of `channels` (default: the output channels); the
    images): the grid of a block per tile of one image."""
    if s.n > GRID_LIMIT:
        raise ValueError(f"{s.n} images: the images go in grid z, which takes at most {GRID_LIMIT}")
    return ceil_div(s.h, tile_h) * ceil_div(s.w, tile_w), ceil_div(s.k if channels is None else channels, tile_k), s.n


def conv_inputs(rng, s: Conv) -> dict:
    """x ~ N(0, 1) and w ~ N(0, 1 / (9 C)), as mnist_cuda.kernel_cases draws them."""
    x = rng.standard_normal((s.n, s.c, s.h, s.w)).astype(np.float32)
    w = (rng.standard_normal((s.k, s.c, 3, 3)) / np.sqrt(9 * s.c)).astype(np.float32)
    return {"x": x, "w": w}


CONV_CHECK_SHAPES = (
    Conv(3, 5, 7, 13, 13),  # odd sizes: no tile fits whole
    Conv(2, 9, 33, 17, 30),  # an oblong image: partial tiles at two edges, a partial chunk of C
    Conv(5, 1, 32, 28, 28),  # conv1's geometry: one input channel, 28 x 28
    Conv(64, 32, 64, 14, 14),  # conv2's, the network's
    Conv(512, 32, 64, 14, 14),
)


def is_conv2(s: Conv) -> bool:
    """The network's conv2 geometry, which the product's kernels are built for."""
    return (s.c, s.k, s.h, s.w) == (32, 64, 14, 14)


# ---- the shape BN2's block ops share (bn_forward, bn_backward) ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Block:
    """x [n, c, s, s] (BatchNorm's input), pooled to [n, c, s/2, s/2] (an odd s's last row and column in no window)."""

    n: int
    c: int
    s: int

    def __str__(self):
        return f"N={self.n},C={self.c},{self.s}x{self.s}"

    def ints(self) -> tuple:
        return tuple(np.int32(v) for v in (self.n, self.c, self.s))

    @property
    def pooled(self) -> tuple:
        return self.n, self.c, self.s // 2, self.s // 2

    @property
    def windows(self) -> int:
        return self.n * self.c * (self.s // 2) ** 2


# ---- bf16 storage, for the products' bf16 forms ------------------------------------------------------------------


def to_bf16(a):
    """A device float32 array as the step stores it in --precision bf16: its values rounded to the nearest bf16
    (ties to even), as uint16 bits (mnist_cuda.ops.common.BF16)."""
    import cupy

    bits = cupy.ascontiguousarray(a).view(cupy.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cupy.uint16)


def from_bf16(bits, out):
    """bf16 bits into the float32 device array out (exact)."""
    import cupy

    out[...] = (bits.astype(cupy.uint32) << 16).view(cupy.float32).reshape(out.shape)
