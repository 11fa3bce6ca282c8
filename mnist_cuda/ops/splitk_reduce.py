"""The launch contract of kernels/fast/6_splitk_reduce.cu: the second half of every split-K product."""

from __future__ import annotations

from .common import I32, source

_reduce = source("fast/6_splitk_reduce.cu").kernel("splitk_reduce_fast")


def splitk_reduce(
    partial, splits: int, out, bias=None, relu: bool = False, count=None, models: int = 1, out_stride=0, bias_stride=0
):
    """out = the sum of the splits' partial results [splits, count] in split order (+ bias by column, then
    ReLU). count: one model's outputs (default out.size). models: K models in one launch, model m's partials
    [splits, count] at m * splits * count (where the split products write them), its out at m * out_stride
    (count for activations [K][...], param_stride for a gradient) and its bias at m * bias_stride."""
    count = out.size if count is None else count
    if models > 1 and out_stride < count:
        raise ValueError(f"out_stride {out_stride} would overlap the models' {count} outputs")
    _reduce.launch_1d(
        count,
        partial,
        I32(splits),
        I32(count),
        partial if bias is None else bias,
        I32(out.shape[-1]),
        I32(bias is not None),
        I32(relu),
        out,
        I32(out_stride),
        I32(bias_stride),
        models=models,
    )
