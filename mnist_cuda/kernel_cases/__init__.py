"""The kernel cases: every kernel against the float64 reference, as data. tests/test_gpu_kernels.py runs
them and dev/bench_kernels.py times them.

Every case launches through mnist_cuda.ops (the only code that knows grids, blocks and arguments), builds
fresh random inputs for given dimensions, poisons its outputs (NaN, or 255 for argmax) so that an
unwritten element fails, and returns a Prepared:
    run()      launches the kernel(s) on the current stream,
    outputs    {name: device array} to compare after run(),
    expected   {name: float64 / integer host array} from mnist_cuda.reference,
    work       (flops, bytes): the floor's two numbers, for the benchmark.

Run as a module, it lists the cases by op family (python -m mnist_cuda.kernel_cases [--family F]); no GPU
needed.

A case's name is the kernel it checks (several joined by "+"), with conv2's precision in angle brackets
as in the kernel's template instantiation ("conv2_forward_fast<tf32>") and the layer whose geometry it
takes in square brackets. Case.ops names the op families the case covers; OPS groups the cases by them.

    common         Case, Prepared, Dims, the op families, the tolerances, the shared helpers, check()
    conv2d         the convolutions' cases (naive, and conv2's fast products), weight_quads (conv2's staging)
    naive          the other naive kernels' cases: batchnorm, relu, maxpool, linear, the loss, normalize
    both           the cases of the kernels both nets launch: the augmentation's shift, the accuracy count
    fast_blocks    the fused conv blocks' cases (conv1's and block 2's kernels) and their argmax comparisons
    fast_fc        fc1's fast products and the head's
    sgd            the optimizer's (both versions, at the rate sgd_schedule computes)
    lists          naive_cases(), both_cases(), fast_cases(), all_cases() and OPS, the cases by op family
    __main__       the command that lists them
"""

from .both import count_correct_case, shift_images_case
from .common import (
    BF16_TOL,
    BLOCK1_OPS,
    BLOCK2_OPS,
    EPS,
    FAMILIES,
    FP32_TOL,
    MOMENTUM,
    PAIRED_TOL,
    TF32_TOL,
    Case,
    Dims,
    Prepared,
    bf16_values,
    check,
    listed_kernels,
    rel_err,
    round_bf16,
    round_bf16_bits,
    runnable,
)
from .conv2d import (
    conv2_product_cases,
    conv_backward_input_case,
    conv_backward_weight_case,
    conv_forward_case,
    conv_stage_weights_case,
    round_tf32,
    split_tf32,
    weight_quads,
)
from .fast_blocks import (
    argmax_near_ties,
    block_backward_fast_case,
    blocked_positions,
    bn_eval_stats_fast_case,
    bn_relu_pool_fast_case,
    bn_stats_fast_case,
    conv1_moments_case,
    image_moments,
    positions_near_ties,
    values_at_positions,
)
from .fast_fc import head_fast_case, linear_fast_case, linear_fast_cases
from .lists import OPS, all_cases, both_cases, fast_cases, naive_cases
from .naive import (
    bn_apply_case,
    bn_backward_case,
    bn_stats_case,
    cross_entropy_case,
    linear_case,
    normalize_case,
    pool_case,
    relu_case,
)
from .sgd import sgd_case, sgd_fast_case, sgd_models_case, sgd_momentum_case

__all__ = [
    "EPS",
    "MOMENTUM",
    "FAMILIES",
    "BLOCK1_OPS",
    "BLOCK2_OPS",
    "Dims",
    "Prepared",
    "FP32_TOL",
    "TF32_TOL",
    "BF16_TOL",
    "PAIRED_TOL",
    "Case",
    "runnable",
    "rel_err",
    "check",
    "listed_kernels",
    "split_tf32",
    "round_tf32",
    "round_bf16_bits",
    "round_bf16",
    "bf16_values",
    "weight_quads",
    "conv_stage_weights_case",
    "conv_forward_case",
    "conv_backward_input_case",
    "conv_backward_weight_case",
    "conv2_product_cases",
    "bn_stats_case",
    "bn_apply_case",
    "bn_backward_case",
    "relu_case",
    "pool_case",
    "linear_case",
    "cross_entropy_case",
    "count_correct_case",
    "normalize_case",
    "shift_images_case",
    "argmax_near_ties",
    "blocked_positions",
    "positions_near_ties",
    "values_at_positions",
    "image_moments",
    "conv1_moments_case",
    "bn_stats_fast_case",
    "bn_eval_stats_fast_case",
    "bn_relu_pool_fast_case",
    "block_backward_fast_case",
    "linear_fast_case",
    "linear_fast_cases",
    "head_fast_case",
    "sgd_case",
    "sgd_fast_case",
    "sgd_models_case",
    "sgd_momentum_case",
    "fast_cases",
    "naive_cases",
    "both_cases",
    "all_cases",
    "OPS",
]
