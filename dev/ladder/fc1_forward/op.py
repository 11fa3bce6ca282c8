"""fc1's forward, the ladder's op fc1_forward: each rung's launch contract (grid, block, arguments, -D options).

torch.nn.Linear followed by its ReLU, as the step computes it: x [N,I], W [O,I], b [O] -> y [N,O] =
relu(x W^T + b). In the network I = 3136 (conv2's pooled features, 64 x 7 x 7) and O = 128.

The op's output is y, which every rung writes; its scratch buffer, `scratch`, is not checked: rung 01 keeps the
linear layer's output there before its ReLU (the naive net's two launches), and rung 04 its split partial sums.
"""

import dataclasses

import numpy as np
from ladder_op import Op, ProductRung, Rung, to_bf16

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
    Linear(3, 37, 5),  # odd sizes: no tile fits whole, one split
    Linear(67, 300, 129),  # partial tiles on every edge, k cut into splits with a short last one
    Linear(701, 45, 70),  # a long batch against a short k
    Linear(64, 3136, 128),  # fc1's geometry, the network's
    Linear(512, 3136, 128),
)


def network_shape(batch: int) -> Linear:
    return Linear(batch, 3136, 128)


def _grid_rows(rows: int, tile: int) -> int:
    if ceil_div(rows, tile) > GRID_LIMIT:
        raise ValueError(f"{rows} rows: their tiles go in grid y, which takes at most {GRID_LIMIT}")
    return ceil_div(rows, tile)


def launch_naive(kernels, s: Linear, x, w, b, y, scratch):
    """Rung 01: linear_forward_naive then relu_forward_naive, a thread per element of y each, blocks of 256
    (mnist_cuda.ops.naive's contracts, as the naive net launches them); the pre-activation goes through scratch."""
    linear, relu = kernels
    linear.launch_1d(s.n * s.o, x, w, b, scratch, *s.ints())
    relu.launch_1d(s.n * s.o, scratch, y, np.int32(s.n * s.o))


SHARED_TILES = {"TILE": 16}


def launch_shared_tiles(kernel, s: Linear, x, w, b, y, scratch):
    """Rung 02: a block per TILE x TILE outputs (TILE samples x TILE outputs), a thread per output."""
    t = SHARED_TILES["TILE"]
    kernel.launch((ceil_div(s.o, t), _grid_rows(s.n, t)), t * t, x, w, b, y, *s.ints())


REGISTER_BLOCKING = {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4}


def _blocked_grid(s: Linear, splits: int = 1) -> tuple:
    t = REGISTER_BLOCKING
    return ceil_div(s.o, t["BN"]), _grid_rows(s.n, t["BM"]), splits


def _blocked_threads() -> int:
    t = REGISTER_BLOCKING
    return (t["BM"] // t["TM"]) * (t["BN"] // t["TN"])


def launch_register_blocking(kernel, s: Linear, x, w, b, y, scratch):
    """Rung 03: a block per BM x BN outputs, a thread per TM x TN of them; k staged BK at a time."""
    kernel.launch(_blocked_grid(s)[:2], _blocked_threads(), x, w, b, y, *s.ints())


SMS, BLOCKS_PER_SM, MAX_SPLITS = 132, 3, 64  # an H100 SXM's or an H200's SMs


def splits(s: Linear) -> tuple[int, int]:
    """(splits, k per split) of rung 04: the product's rule (ops/linear_splitk.split_k) with rung 03's tiles, on
    132 SMs (H100 SXM and H200 alike) so that it depends on the shape alone: tiles x splits blocks in one wave of
    3 per SM, each split at least 4 k-steps long, a multiple of BK."""
    bk = REGISTER_BLOCKING["BK"]
    tiles = _blocked_grid(s)[0] * _blocked_grid(s)[1]
    steps = ceil_div(s.i, bk)
    count = max(1, min(steps // 4, MAX_SPLITS, BLOCKS_PER_SM * SMS // tiles))
    per_split = ceil_div(steps, count) * bk
    return ceil_div(s.i, per_split), per_split


def launch_split_k(kernels, s: Linear, x, w, b, y, scratch):
    """Rung 04: rung 03's grid times the splits in z, each split's partial sums into scratch [splits, N, O]; then a
    thread per element of y (blocks of 256) adds the splits in order, the bias and the ReLU."""
    partial, reduce = kernels
    count, per_split = splits(s)
    partial.launch(_blocked_grid(s, count), _blocked_threads(), x, w, scratch, *s.ints(), np.int32(per_split))
    reduce.launch_1d(s.n * s.o, scratch, b, y, np.int32(count), *s.ints())


def prepare_product(s: Linear, x, w, b, y, scratch):
    """The top rung: linear_splitk.forward as FastNet.forward calls it (fp32: 3xTF32 on the tensor cores), through
    partial sums of its own size (forward_partial_size), allocated here as FastNet allocates them."""
    import cupy

    partial = cupy.empty(linear_splitk.forward_partial_size(s.n, s.i, s.o), cupy.float32)
    return lambda: linear_splitk.forward(x, w, b, partial, y, s.n, s.i, s.o, "fp32")


def prepare_product_bf16(s: Linear, x, w, b, y, scratch):
    """Rung 10: the product in --precision bf16: both operands rounded to bf16 on the tensor cores, x read as bf16,
    as the step stores fc1's input there (rounded here, untimed: the products would round it to the same values)."""
    import cupy

    partial = cupy.empty(linear_splitk.forward_partial_size(s.n, s.i, s.o), cupy.float32)
    x_bits = to_bf16(x)
    return lambda: linear_splitk.forward(x_bits, w, b, partial, y, s.n, s.i, s.o, "bf16")


def prepare_product_bf16_operands(s: Linear, x, w, b, y, scratch):
    """Rung 11: rung 10 reading W from the bf16 step's copy (linear_splitk.weight_to_bf16, made here untimed: the step
    makes it once a step on a side branch), the values the products round W to, in half the bytes: every block of a
    column of tiles reads W's rows, and those reads bound the product."""
    import cupy

    partial = cupy.empty(linear_splitk.forward_partial_size(s.n, s.i, s.o), cupy.float32)
    x_bits, w_bits = to_bf16(x), to_bf16(w)
    return lambda: linear_splitk.forward(x_bits, w_bits, b, partial, y, s.n, s.i, s.o, "bf16")


def inputs(rng, s: Linear) -> dict:
    """x ~ N(0, 1), W ~ N(0, 1 / I), b ~ N(0, 1), as mnist_cuda.kernel_cases draws them."""
    x = rng.standard_normal((s.n, s.i)).astype(np.float32)
    w = (rng.standard_normal((s.o, s.i)) / np.sqrt(s.i)).astype(np.float32)
    b = rng.standard_normal(s.o).astype(np.float32)
    return {"x": x, "w": w, "b": b}


def _work(s: Linear) -> tuple[float, float]:
    """2 FLOPs per multiply-add; x, W and b read and y written once, as float32."""
    return 2.0 * s.n * s.i * s.o, 4.0 * (s.n * s.i + s.o * s.i + s.o + s.n * s.o)


def _work_bf16(s: Linear) -> tuple[float, float]:
    """As _work, with x read as bf16 (2 bytes a value)."""
    flops, _ = _work(s)
    return flops, 2.0 * s.n * s.i + 4.0 * (s.o * s.i + s.o + s.n * s.o)


def _work_bf16_operands(s: Linear) -> tuple[float, float]:
    """As _work, with x and W read as bf16."""
    flops, _ = _work(s)
    return flops, 2.0 * (s.n * s.i + s.o * s.i) + 4.0 * (s.o + s.n * s.o)


OP = Op(
    rungs=(
        Rung("01_naive.cu", "linear_forward_naive + relu_forward_naive", launch_naive),
        Rung("02_shared_tiles.cu", "fc1_forward_rung02_shared_tiles", launch_shared_tiles, SHARED_TILES),
        Rung(
            "03_register_blocking.cu",
            "fc1_forward_rung03_register_blocking",
            launch_register_blocking,
            REGISTER_BLOCKING,
        ),
        Rung(
            "04_split_k.cu",
            "fc1_forward_rung04_split_k_partial + fc1_forward_rung04_split_k_sum",
            launch_split_k,
            REGISTER_BLOCKING,
        ),
        ProductRung(
            "09_product",
            "fast/4_linear_splitk.cu",
            "linear_forward_fast<Precision::Fp32, float, float>, then the split sum with bias and ReLU "
            "(6_splitk_reduce.cu)",
            prepare_product,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
        ),
        ProductRung(
            "10_product_bf16",
            "fast/4_linear_splitk.cu",
            "linear_forward_fast<Precision::Bf16, bfloat16, float>, then the split sum with bias and ReLU "
            "(6_splitk_reduce.cu)",
            prepare_product_bf16,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16,
        ),
        ProductRung(
            "11_product_bf16_operands",
            "fast/4_linear_splitk.cu",
            "linear_forward_fast<Precision::Bf16, bfloat16, bfloat16>, then the split sum with bias and ReLU "
            "(6_splitk_reduce.cu)",
            prepare_product_bf16_operands,
            lambda s: ceil_div(s.n, linear_splitk.TILE) <= GRID_LIMIT,
            unit="bf16",
            tolerance=BF16_TOL,
            work=_work_bf16_operands,
        ),
    ),
    geometry="x [N,3136], W [128,3136], b [128] -> y [N,128] = relu(x W^T + b)",
    check_shapes=CHECK_SHAPES,
    network_shape=network_shape,
    inputs=inputs,
    outputs=lambda s: {"y": (s.n, s.o)},
    scratch=lambda s: {"scratch": (splits(s)[0] * s.n * s.o,)},
    reference=lambda x, w, b: {"y": ref.relu_forward(ref.linear_forward(x, w, b))},
    work=_work,
    naive=(("naive/6_linear.cu", "linear_forward_naive"), ("naive/4_relu.cu", "relu_forward_naive")),
)
