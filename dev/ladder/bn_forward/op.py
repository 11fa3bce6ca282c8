"""BN2's forward with the ReLU and the max pool, the ladder's op bn_forward: each rung's launch contract (grid,
block, arguments, -D options).

From x [N,C,S,S] (conv2's output a2) and BatchNorm's statistics (mean, invstd: the batch's, which bn_stats takes)
and parameters (gamma, beta), the pooled output [N,C,S/2,S/2]:

    pooled = maxpool2x2(relu((x - mean) invstd gamma + beta)), per channel

The op's output is pooled. Each rung also writes the record its backward reads, as scratch, unchecked here (the
product's kernel cases check it, mnist_cuda.kernel_cases): the naive chain its ReLU's output in full and the pool's
argmax; the fused rungs and the product the window's position (NO_POSITION where the ReLU blocked it) and x at it.
"""

import functools

import numpy as np
from ladder_op import Block, Op, ProductRung, Rung, from_bf16, to_bf16

from mnist_cuda import reference as ref
from mnist_cuda.kernel_cases import BF16_TOL
from mnist_cuda.ops import bn_relu_pool
from mnist_cuda.ops.common import NO_POSITION

I32 = np.int32
THREADS = 256  # the naive kernels' blocks (cuda.Kernel.launch_1d), and rung 02's


def launch_naive(kernels, s: Block, x, mean, invstd, gamma, beta, pooled, z, position, x_at):
    """Rung 01, the naive net's block forward (nets._NaiveBlock.forward): batchnorm_apply_naive and
    relu_forward_naive a thread per element (the ReLU in place on z), maxpool2x2_forward_naive a thread per pooled
    pixel, its argmax into `position`'s bytes."""
    apply, relu, pool = kernels
    elements = s.n * s.c * s.s * s.s
    apply.launch_1d(elements, x, mean, invstd, gamma, beta, z, *s.ints()[:2], I32(s.s * s.s))
    relu.launch_1d(elements, z, z, I32(elements))
    pool.launch_1d(s.windows, z, pooled, position, *s.ints(), I32(s.s))


FUSED = {"THREADS": THREADS, "NO_POSITION": NO_POSITION}


def launch_fused(kernel, s: Block, x, mean, invstd, gamma, beta, pooled, z, position, x_at):
    """Rung 02: a thread per pooled pixel, blocks of THREADS."""
    kernel.launch_1d(s.windows, x, mean, invstd, gamma, beta, *s.ints(), pooled, position, x_at, block=THREADS)


def prepare_product(s: Block, x, mean, invstd, gamma, beta, pooled, z, position, x_at, form="windows"):
    """Rung 09: bn_relu_pool.forward as FastNet.forward launches it, in its form `form` (bn_relu_pool.FORMS: rung 09's
    a thread per window, rung 11's staged planes)."""
    return lambda: bn_relu_pool.forward(x, mean, invstd, gamma, beta, s.n, s.c, s.s, pooled, position, x_at, form=form)


def prepare_product_bf16(s: Block, x, mean, invstd, gamma, beta, pooled, z, position, x_at, form="windows"):
    """Rung 10: the product in --precision bf16, where conv2's output and fc1's input (the pooled output) are stored
    as bf16: x rounded to bf16 before the launch, pooled and x_at written as bf16 (pooled rounded to the nearest, x_at
    exact), pooled put into the float32 output after the launch (untimed). Against the reference on the unrounded x.
    Rung 12: the same, staged."""
    import cupy

    pooled_bits, at_bits = (cupy.empty(pooled.shape, cupy.uint16) for _ in range(2))
    x_bits = to_bf16(x)
    run = prepare_product(s, x_bits, mean, invstd, gamma, beta, pooled_bits, z, position, at_bits, form)
    return run, lambda: from_bf16(pooled_bits, pooled)


def product_accepts(s: Block) -> bool:
    """Even images (the windows are read as pairs of a row)."""
    return s.s % 2 == 0


def staged_accepts(s: Block) -> bool:
    """Even images of at most STAGED_WINDOWS windows (a block stages whole planes)."""
    return s.s % 2 == 0 and (s.s // 2) ** 2 <= bn_relu_pool.STAGED_WINDOWS


def _inputs(rng, s: Block) -> dict:
    """x ~ N(0.3, 1.5^2); mean and beta ~ N(0, 0.5^2), invstd in [0.5, 1.5), gamma ~ N(1, 0.5^2): some windows
    blocked by the ReLU, most not."""
    x = (rng.standard_normal((s.n, s.c, s.s, s.s)) * 1.5 + 0.3).astype(np.float32)
    mean, beta = (
        (rng.standard_normal(s.c) * 0.5).astype(np.float32),
        (rng.standard_normal(s.c) * 0.5).astype(np.float32),
    )
    invstd = (rng.random(s.c) + 0.5).astype(np.float32)
    gamma = (rng.standard_normal(s.c) * 0.5 + 1.0).astype(np.float32)
    return {"x": x, "mean": mean, "invstd": invstd, "gamma": gamma, "beta": beta}


def _reference(x, mean, invstd, gamma, beta) -> dict:
    per_channel = [v[:, None, None] for v in (mean, invstd, gamma, beta)]
    z = (x - per_channel[0]) * per_channel[1] * per_channel[2] + per_channel[3]
    pooled, _ = ref.maxpool_forward(ref.relu_forward(z))
    return {"pooled": pooled}


def _work(s: Block) -> tuple[float, float]:
    """4 FLOPs per element of x (BatchNorm's apply); x read once and, per window, the pooled value written with the
    record the backward reads (a position byte and x at it), as float32, and the four per-channel vectors read, as
    the fewest bytes."""
    elements = s.n * s.c * s.s * s.s
    return 4.0 * elements, 4.0 * elements + 9.0 * s.windows + 4.0 * 4 * s.c


def _work_bf16(s: Block) -> tuple[float, float]:
    """As _work, with x read and pooled and x at the position written as bf16 (2 bytes a value each)."""
    elements = s.n * s.c * s.s * s.s
    return 4.0 * elements, 2.0 * elements + 5.0 * s.windows + 4.0 * 4 * s.c


def _product(number: int, name: str, kernel: str, prepare, accepts, bf16: bool) -> ProductRung:
    """A top rung: the product's kernel in fp32 or bf16 (its own bytes and bf16's tolerance)."""
    stored = "bfloat16" if bf16 else "float"
    extra = {"tolerance": BF16_TOL, "work": _work_bf16} if bf16 else {}
    return ProductRung(
        f"{number:02d}_{name}", "fast/3_bn_relu_pool.cu", f"{kernel}<{stored}>", prepare, accepts, unit="fp32", **extra
    )


OP = Op(
    rungs=(
        Rung("01_naive.cu", "batchnorm_apply_naive + relu_forward_naive + maxpool2x2_forward_naive", launch_naive),
        Rung("02_fused.cu", "bn_forward_rung02_fused", launch_fused, FUSED),
        _product(9, "product", "batchnorm_relu_maxpool_fast", prepare_product, product_accepts, False),
        _product(10, "product_bf16", "batchnorm_relu_maxpool_fast", prepare_product_bf16, product_accepts, True),
        _product(
            11,
            "product_staged",
            "batchnorm_relu_maxpool_staged_fast",
            functools.partial(prepare_product, form="staged"),
            staged_accepts,
            False,
        ),
        _product(
            12,
            "product_staged_bf16",
            "batchnorm_relu_maxpool_staged_fast",
            functools.partial(prepare_product_bf16, form="staged"),
            staged_accepts,
            True,
        ),
    ),
    geometry="BN2 + ReLU + pool's forward: x [N,64,14,14], mean, invstd, gamma, beta [64] -> pooled [N,64,7,7]",
    check_shapes=(
        Block(3, 5, 13),  # odd sizes: a 13 x 13 image (its last row and column in no window), 5 channels
        Block(2, 33, 10),  # 33 channels, 25 windows an image
        Block(67, 9, 14),  # 603 planes: the staged form's last block partial
        Block(5, 32, 28),  # BN1's geometry: 196 windows an image, more than the staged form takes
        Block(64, 64, 14),  # the network's
        Block(512, 64, 14),
    ),
    network_shape=lambda batch: Block(batch, 64, 14),
    inputs=_inputs,
    outputs=lambda s: {"pooled": (s.n, s.c, s.s // 2, s.s // 2)},
    reference=_reference,
    work=_work,
    naive=(
        ("naive/3_batchnorm.cu", "batchnorm_apply_naive"),
        ("naive/4_relu.cu", "relu_forward_naive"),
        ("naive/5_maxpool.cu", "maxpool2x2_forward_naive"),
    ),
    # z: the naive chain's full-size intermediate; position (bytes) and x at it, the record for the backward
    scratch=lambda s: {
        "z": (s.n, s.c, s.s, s.s),
        "position": (s.n, s.c, s.s // 2, s.s // 2),
        "x_at": (s.n, s.c, s.s // 2, s.s // 2),
    },
)
