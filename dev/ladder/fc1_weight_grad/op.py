"""fc1's weight gradient, the ladder's op fc1_weight_grad: each rung's launch contract (grid, block, arguments, -D
options).

torch.nn.Linear's weight gradient: x [N,I], dy [N,O] -> dW [O,I] = dy^T x, a reduction over the batch. In the
network I = 3136 (conv2's pooled features, 64 x 7 x 7), O = 128, and dy is the gradient at fc1's pre-activation.
The bias gradient is not part of the op: the step takes it from the head's sums, not from this product.

The op's output is dW, which every rung writes; its scratch buffer, `scratch`, is not checked: rung 01 (the naive
kernel, which also sums the bias gradient) writes the bias gradient there, and rung 04 its split partial sums.
"""

import dataclasses

import numpy as np
from ladder_op import Op, ProductRung, Rung, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.cuda import ceil_div
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import linear_splitk
from mnist_cuda.ops.splitk_reduce import splitk_reduce
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
    Linear(3, 37, 5),  # odd sizes: no tile fits whole, one split
    Linear(67, 300, 129),  # partial tiles on every edge
    Linear(701, 45, 70),  # a long batch: k cut into splits, the last one short
    Linear(64, 3136, 128),  # fc1's geometry, the network's
    Linear(512, 3136, 128),
)


def network_shape(batch: int) -> Linear:
    return Linear(batch, 3136, 128)


def _grid_rows(rows: int, tile: int) -> int:
    if ceil_div(rows, tile) > GRID_LIMIT:
        raise ValueError(f"{rows} rows: their tiles go in grid y, which takes at most {GRID_LIMIT}")
    return ceil_div(rows, tile)


def launch_naive(kernel, s: Linear, x, dy, dw, scratch):
    """Rung 01: linear_backward_params_naive, a thread per weight and one per bias, blocks of 256
    (mnist_cuda.ops.naive.linear_backward_params' contract); the bias gradient goes to scratch."""
    kernel.launch_1d(s.o * (s.i + 1), x, dy, dw, scratch, *s.ints())


SHARED_TILES = {"TILE": 16}


def launch_shared_tiles(kernel, s: Linear, x, dy, dw, scratch):
    """Rung 02: a block per TILE x TILE weights (TILE outputs x TILE inputs), a thread per weight."""
    t = SHARED_TILES["TILE"]
    kernel.launch((ceil_div(s.i, t), _grid_rows(s.o, t)), t * t, x, dy, dw, *s.ints())


REGISTER_BLOCKING = {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4}


def _blocked_grid(s: Linear, splits: int = 1) -> tuple:
    t = REGISTER_BLOCKING
    return ceil_div(s.i, t["BN"]), _grid_rows(s.o, t["BM"]), splits


def _blocked_threads() -> int:
    t = REGISTER_BLOCKING
    return (t["BM"] // t["TM"]) * (t["BN"] // t["TN"])


def launch_register_blocking(kernel, s: Linear, x, dy, dw, scratch):
    """Rung 03: a block per BM x BN weights (outputs x inputs), a thread per TM x TN of them; the batch staged BK
    samples at a time."""
    kernel.launch(_blocked_grid(s)[:2], _blocked_threads(), x, dy, dw, *s.ints())


SMS, BLOCKS_PER_SM, MAX_SPLITS = 132, 3, 64  # an H100 SXM's or an H200's SMs


def splits(s: Linear) -> tuple[int, int]:
    """(splits, samples per split) of rung 04: the product's rule (ops/linear_splitk.split_k) with rung 03's tiles,
    on 132 SMs (H100 SXM and H200 alike) so that it depends on the shape alone: tiles x splits blocks in one wave of
    3 per SM, each split at least 4 k-steps long, a multiple of BK."""
    bk = REGISTER_BLOCKING["BK"]
    tiles = _blocked_grid(s)[0] * _blocked_grid(s)[1]
    steps = ceil_div(s.n, bk)
    count = max(1, min(steps // 4, MAX_SPLITS, BLOCKS_PER_SM * SMS // tiles))
    per_split = ceil_div(steps, count) * bk
    return ceil_div(s.n, per_split), per_split


def launch_split_k(kernels, s: Linear, x, dy, dw, scratch):
    """Rung 04: rung 03's grid times the splits in z, each split's partial sums into scratch [splits, O, I]; then a
    thread per weight (blocks of 256) adds the splits in order. With one split, the first kernel writes dW itself
    and the second is not launched (as the product does)."""
    partial, reduce = kernels
    count, per_split = splits(s)
    out = dw if count == 1 else scratch
    partial.launch(_blocked_grid(s, count), _blocked_threads(), x, dy, out, *s.ints(), np.int32(per_split))
    if count > 1:
        reduce.launch_1d(s.o * s.i, scratch, dw, np.int32(count), *s.ints())


def _prepare(s: Linear, x, dy, dw, precision: str):
    """linear_splitk.backward_weight at `precision` as FastNet._fc1_weight_grad calls it (the splits left in its
    partial sums, of the size FastNet allocates), then the sum of the splits that FastNet._conv2_weight_grad
    launches later on its side stream (splitk_reduce), where there is more than one."""
    import cupy

    partial = cupy.empty(linear_splitk.weight_partial_size(s.n, s.i, s.o), cupy.float32)
    count, _ = linear_splitk.weight_splits(s.n, s.i, s.o)

    def run():
        linear_splitk.backward_weight(x, dy, dw, partial, s.n, s.i, s.o, precision, sum_splits=False)
        if count > 1:
            splitk_reduce(partial, count, dw)

    return run


def prepare_product(s: Linear, x, dy, dw, scratch):
    """The top rung: the product in fp32 (3xTF32 on the tensor cores), as _prepare says."""
    return _prepare(s, x, dy, dw, "fp32")


def prepare_product_bf16(s: Linear, x, dy, dw, scratch):
    """Rung 10: the product in --precision bf16: both operands rounded to bf16 on the tensor cores, x read as bf16,
    as the step stores fc1's input there (rounded here, untimed: the products would round it to the same values)."""
    return _prepare(s, to_bf16(x), dy, dw, "bf16")


def prepare_product_bf16_operands(s: Linear, x, dy, dw, scratch):
    """Rung 11: rung 10 reading dy as the bf16 step's head writes it (rounded here, untimed), the values the products
    round it to, in half the bytes: every block of a row of tiles reads dy's columns, and those reads bound the
    product."""
    return _prepare(s, to_bf16(x), to_bf16(dy), dw, "bf16")


def inputs(rng, s: Linear) -> dict:
    """x ~ N(0, 1) and dy ~ N(0, 1), as mnist_cuda.kernel_cases draws them."""
    x = rng.standard_normal((s.n, s.i)).astype(np.float32)
    dy = rng.standard_normal((s.n, s.o)).astype(np.float32)
    return {"x": x, "dy": dy}


def reference(x, dy) -> dict:
    """dW of mnist_cuda.reference.linear_backward (which takes W for the input gradient: zeros here, unused)."""
    _, dw, _ = ref.linear_backward(x, np.zeros((dy.shape[1], x.shape[1])), dy)
    return {"dw": dw}


def _work(s: Linear) -> tuple[float, float]:
    """2 FLOPs per multiply-add; x and dy read and dW written once, as float32."""
    return 2.0 * s.n * s.i * s.o, 4.0 * (s.n * s.i + s.n * s.o + s.o * s.i)


def _work_bf16(s: Linear) -> tuple[float, float]:
    """As _work, with x read as bf16 (2 bytes a value)."""
    flops, _ = _work(s)
    return flops, 2.0 * s.n * s.i + 4.0 * (s.n * s.o + s.o * s.i)


def _work_bf16_operands(s: Linear) -> tuple[float, float]:
    """As _work, with x and dy read as bf16."""
    flops, _ = _work(s)
    return flops, 2.0 * (s.n * s.i + s.n * s.o) + 4.0 * s.o * s.i


OP = Op(
    rungs=(
        Rung("01_naive.cu", "linear_backward_params_naive", launch_naive),
        Rung("02_shared_tiles.cu", "fc1_weight_grad_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "fc1_weight_grad_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
        Rung(
            "04_split_k.cu",
            "fc1_weight_grad_rung04_split_k_partial + fc1_weight_grad_rung04_split_k_sum",
            launch_split_k,
            REGISTER_BLOCKING,
        ),
        ProductRung(
            "09_product",
            "fast/4_linear_splitk.cu",
            "linear_backward_weight_fast<Precision::Fp32, float, float>, then the sum of its splits where there are "
            "several (6_splitk_reduce.cu)",
            prepare_product,
            lambda s: ceil_div(s.o, linear_splitk.TILE) <= GRID_LIMIT,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/4_linear_splitk.cu",
            "linear_backward_weight_fast<Precision::Bf16, bfloat16, float>, then the sum of its splits where there "
            "are several (6_splitk_reduce.cu)",
            prepare_product_bf16,
            lambda s: ceil_div(s.o, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_bf16_operands",
            "fast/4_linear_splitk.cu",
            "linear_backward_weight_fast<Precision::Bf16, bfloat16, bfloat16>, then the sum of its splits where "
            "there are several (6_splitk_reduce.cu)",
            prepare_product_bf16_operands,
            lambda s: ceil_div(s.o, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16_operands,
        ),
    ),
    geometry="x [N,3136], dy [N,128] -> dW [128,3136] = dy^T x",
    check_shapes=CHECK_SHAPES,
    network_shape=network_shape,
    inputs=inputs,
    outputs=lambda s: {"dw": (s.o, s.i)},
    scratch=lambda s: {"scratch": (splits(s)[0] * s.o * s.i,)},
    reference=reference,
    work=_work,
    naive=("naive/6_linear.cu", "linear_backward_params_naive"),
)
