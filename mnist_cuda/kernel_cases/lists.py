"""The lists of cases: the naive ones, those of the kernels both nets launch, the fast ones, all of them, and
OPS, all of them by op family."""

from __future__ import annotations

from ..ops import bn_relu_pool as bn
from ..ops import conv1_bn_relu_pool as conv1
from ..ops import conv2_implicit_gemm as conv2
from .both import count_correct_case, shift_images_case
from .common import FAMILIES, Case
from .conv2d import (
    conv2_product_cases,
    conv_backward_input_case,
    conv_backward_weight_case,
    conv_forward_case,
    conv_stage_weights_case,
)
from .fast_blocks import (
    STORED,
    block_backward_fast_case,
    bn_eval_stats_fast_case,
    bn_relu_pool_fast_case,
    bn_stats_fast_case,
    conv1_moments_case,
)
from .fast_fc import head_fast_case, linear_fast_cases
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


def fast_cases() -> list[Case]:
    return (
        [conv_stage_weights_case(p) for p in conv2.KERNEL_PRECISION]
        + [conv_stage_weights_case("fp32", "forward_stacked")]
        + [conv_stage_weights_case("fp32", input_grad="backward_input_paired")]
        + [case for p in conv2.KERNEL_PRECISION for case in conv2_product_cases(p)]
        + [conv1_moments_case()]
        + [bn_stats_fast_case(stored) for stored in STORED]
        + [bn_eval_stats_fast_case()]
        + [
            bn_relu_pool_fast_case(1, train, per_block, stored)
            for train in (True, False)
            for per_block in conv1.FORWARD_CHANNELS
            for stored in STORED
        ]
        + [
            bn_relu_pool_fast_case(1, train, stored=stored, tensor_cores=True)
            for train in (True, False)
            for stored in STORED
        ]
        + [bn_relu_pool_fast_case(2, stored=stored, form=form) for stored in STORED for form in bn.FORMS]
        + [block_backward_fast_case(1, per_block, stored) for per_block in conv1.BACKWARD_CHANNELS for stored in STORED]
        + [block_backward_fast_case(2, stored=stored, form=form) for stored in STORED for form in bn.FORMS]
        + [case for p in ("fp32", "bf16") for case in linear_fast_cases(p)]
        + [head_fast_case("float32"), head_fast_case("bf16"), sgd_fast_case()]
        + [sgd_momentum_case("fast", started) for started in (False, True)]
        + [sgd_models_case()]
    )


def naive_cases() -> list[Case]:
    """The naive kernels' cases (the updates' with the rate sgd_schedule, a kernel of kernels/both/, computes)."""
    cases = []
    for layer in (1, 2):
        cases += [
            conv_forward_case(layer),
            conv_backward_weight_case(layer),
            bn_stats_case(layer),
            bn_apply_case(layer),
            bn_apply_case(layer, eval_mode=True),
            bn_backward_case(layer),
            pool_case(layer),
            pool_case(layer, backward=True),
        ]
    cases += [conv_backward_input_case(), relu_case(), relu_case(backward=True)]
    for layer in ("fc1", "fc2"):
        cases += [linear_case(layer, part) for part in ("forward", "backward_input", "backward_params")]
    cases += [normalize_case(), cross_entropy_case(), sgd_case()]
    cases += [sgd_momentum_case("naive", started) for started in (False, True)]
    return cases


def both_cases() -> list[Case]:
    """The cases of the kernels both nets launch (but sgd_schedule's, which are the updates' in sgd.py)."""
    return [shift_images_case(), count_correct_case()]


def all_cases() -> list[Case]:
    return naive_cases() + both_cases() + fast_cases()


def _group(cases: list[Case]) -> dict[str, list[Case]]:
    return {family: [c for c in cases if family in c.ops] for family in FAMILIES}


# The cases by op family (FAMILIES, the files of kernels/naive/ and kernels/both/): each family's cases without
# a fast kernel first, then every fast case whose kernels replace some of its work. A fused fast kernel replaces
# several ops and so is listed under each: conv1's kernels under normalize, conv2d, batchnorm, relu and maxpool
# (they read the bytes and normalise as they stage, and never store conv1's output); block 2's BatchNorm +
# ReLU + maxpool under those three; fc1's forward under linear and relu (its ReLU runs in
# splitk_reduce_fast); the head under linear (fc2), relu (fc1's ReLU backward) and cross_entropy. A case of
# an update at the rate sgd_schedule computes is listed under sgd and sgd_schedule.
OPS: dict[str, list[Case]] = _group(all_cases())
