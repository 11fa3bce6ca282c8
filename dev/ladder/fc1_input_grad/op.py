"""fc1's input gradient, the ladder's op fc1_input_grad: each rung's launch contract (grid, block, arguments, -D
options).

torch.nn.Linear's input gradient: dy [N,O], W [O,I] -> dx [N,I] = dy W, a reduction over the O outputs. In the
network I = 3136 (conv2's pooled features, 64 x 7 x 7), O = 128, and dy is the gradient at fc1's pre-activation
(the head applies fc1's ReLU mask). The reduction is short (128), the output large (N x 3136): no split.
"""

import dataclasses

import numpy as np
from ladder_op import Op, ProductRung, Rung, from_bf16, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import linear_splitk
from mnist_cuda.sizes import GRID_LIMIT


@dataclasses.dataclass(frozen=True)
class Linear:
    """A linear layer: x [n, i], W [o, i] -> y [n, o] (n the batch)."""

    n: int
    i: int
    o: int

    def __str__(self):
        return f"N={self.n},I={self.i},O={self.o}"

    def ints(self) -> tuple:
        return tuple(np.int32(v) for v in (self.n, self.i, self.o))


CHECK_SHAPES = (
    Linear(3, 37, 5),  # odd sizes: no tile fits whole
    Linear(67, 300, 129),  # partial tiles on every edge, a partial last step of k
    Linear(701, 45, 70),  # many rows of tiles, a narrow matrix
    Linear(64, 3136, 128),  # fc1's geometry, the network's
    Linear(512, 3136, 128),
)


def network_shape(batch: int) -> Linear:
    return Linear(batch, 3136, 128)


def _grid_rows(rows: int, tile: int) -> int:
    if ceil_div(rows, tile) > GRID_LIMIT:
        raise ValueError(f"{rows} rows: their tiles go in grid y, which takes at most {GRID_LIMIT}")
    return ceil_div(rows, tile)


def launch_naive(kernel, s: Linear, dy, w, dx):
    """Rung 01: linear_backward_input_naive, a thread per element of dx, blocks of 256
    (mnist_cuda.ops.naive.linear_backward_input's contract)."""
    kernel.launch_1d(s.n * s.i, dy, w, dx, *s.ints())


SHARED_TILES = {"TILE": 16}


def launch_shared_tiles(kernel, s: Linear, dy, w, dx):
    """Rung 02: a block per TILE x TILE elements of dx (TILE samples x TILE inputs), a thread per element."""
    t = SHARED_TILES["TILE"]
    kernel.launch((ceil_div(s.i, t), _grid_rows(s.n, t)), t * t, dy, w, dx, *s.ints())


REGISTER_BLOCKING = {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4}


def launch_register_blocking(kernel, s: Linear, dy, w, dx):
    """Rung 03: a block per BM x BN elements of dx (samples x inputs), a thread per TM x TN of them; the outputs
    (k) staged BK at a time."""
    t = REGISTER_BLOCKING
    grid = ceil_div(s.i, t["BN"]), _grid_rows(s.n, t["BM"])
    kernel.launch(grid, (t["BM"] // t["TM"]) * (t["BN"] // t["TN"]), dy, w, dx, *s.ints())


def prepare_product(s: Linear, dy, w, dx):
    """The top rung: linear_splitk.backward_input as FastNet.backward calls it (fp32: 3xTF32 on the tensor cores, the
    tiled form; 64 x 32 tiles where the 64 x 64 ones would be fewer blocks than the GPU has SMs)."""
    return lambda: linear_splitk.backward_input(dy, w, dx, s.n, s.i, s.o, precision="fp32")


def prepare_product_bf16(s: Linear, dy, w, dx):
    """Rung 10: the product in --precision bf16, in the form the step takes (the wgmma form from
    linear_splitk.WG_MIN_BATCH samples on Hopper, else the tiled one): both operands rounded to bf16 on the tensor
    cores, dx written as bf16, as the step stores fc1's input gradient there (put into the float32 output after the
    launch, untimed)."""
    import cupy

    dx_bits = cupy.empty(dx.shape, cupy.uint16)
    run = lambda: linear_splitk.backward_input(dy, w, dx_bits, s.n, s.i, s.o, precision="bf16")
    return run, lambda: from_bf16(dx_bits, dx)


def prepare_product_bf16_operands(s: Linear, dy, w, dx):
    """Rung 11: rung 10 reading dy and W as the bf16 step's copies (dy as the head writes it, W's copy made once a
    step; both rounded here, untimed), the values the products round them to, in half the bytes: each block reads its
    rows of dy and a column of W's tiles, and those reads bound the product."""
    import cupy

    dx_bits, dy_bits, w_bits = cupy.empty(dx.shape, cupy.uint16), to_bf16(dy), to_bf16(w)
    run = lambda: linear_splitk.backward_input(dy_bits, w_bits, dx_bits, s.n, s.i, s.o, precision="bf16")
    return run, lambda: from_bf16(dx_bits, dx)


def inputs(rng, s: Linear) -> dict:
    """dy ~ N(0, 1) and W ~ N(0, 1 / I), as mnist_cuda.kernel_cases draws them."""
    dy = rng.standard_normal((s.n, s.o)).astype(np.float32)
    w = (rng.standard_normal((s.o, s.i)) / np.sqrt(s.i)).astype(np.float32)
    return {"dy": dy, "w": w}


def reference(dy, w) -> dict:
    """dx of mnist_cuda.reference.linear_backward (which takes x for the weight gradient: zeros here, unused)."""
    dx, _, _ = ref.linear_backward(np.zeros((dy.shape[0], w.shape[1])), w, dy)
    return {"dx": dx}


def _work(s: Linear) -> tuple[float, float]:
    """2 FLOPs per multiply-add; dy and W read and dx written once, as float32."""
    return 2.0 * s.n * s.i * s.o, 4.0 * (s.n * s.o + s.o * s.i + s.n * s.i)


def _work_bf16(s: Linear) -> tuple[float, float]:
    """As _work, with dx written as bf16 (2 bytes a value)."""
    flops, _ = _work(s)
    return flops, 4.0 * (s.n * s.o + s.o * s.i) + 2.0 * s.n * s.i


def _work_bf16_operands(s: Linear) -> tuple[float, float]:
    """As _work, with dy and W read and dx written as bf16."""
    flops, _ = _work(s)
    return flops, 2.0 * (s.n * s.o + s.o * s.i + s.n * s.i)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "linear_backward_input_naive", launch_naive),
        Rung("02_shared_tiles.cu", "fc1_input_grad_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "fc1_input_grad_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
        ProductRung(
            "09_product",
            "fast/4_linear_splitk.cu",
            "linear_backward_input_fast<Precision::Fp32, float, float> (linear_backward_input_narrow_fast<"
            "Precision::Fp32, float, float> where 64 x 64 tiles are fewer than the SMs)",
            prepare_product,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/4_linear_splitk.cu",
            "linear_backward_input_wgmma_fast<Precision::Bf16, bfloat16, float> from 256 samples, else "
            "linear_backward_input_fast<Precision::Bf16, bfloat16, float> (or its narrow form, as rung 09)",
            prepare_product_bf16,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_bf16_operands",
            "fast/4_linear_splitk.cu",
            "linear_backward_input_wgmma_fast<Precision::Bf16, bfloat16, bfloat16> from 256 samples, else "
            "linear_backward_input_fast<Precision::Bf16, bfloat16, bfloat16> (or its narrow form, as rung 09)",
            prepare_product_bf16_operands,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16_operands,
        ),
    ),
    geometry="dy [N,128], W [128,3136] -> dx [N,3136] = dy W",
    check_shapes=CHECK_SHAPES,
    network_shape=network_shape,
    inputs=inputs,
    outputs=lambda s: {"dx": (s.n, s.i)},
    reference=reference,
    work=_work,
    naive=("naive/6_linear.cu", "linear_backward_input_naive"),
)
