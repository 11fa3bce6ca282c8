"""The launch contract of kernels/fast/6_splitk_reduce.cu: the second half of every split-K product."""

from __future__ import annotations

from .common import I32, source

_reduce = source("fast/6_splitk_reduce.cu").kernel("splitk_reduce_fast")


def splitk_reduce(partial, splits: int, out, bias=None, relu: bool = False, count=None):
    """out = the sum of the splits' partial results [splits, count] in split order (+ bias by column, then
    ReLU)."""
    count = out.size if count is None else count
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
    )
