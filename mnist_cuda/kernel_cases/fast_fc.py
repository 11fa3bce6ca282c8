"""The fast fully connected cases: fc1's three products in each form and precision, and the head (fc2, the loss
and their backward down to fc1's pre-activation)."""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..ops import head, linear_splitk
from ..ops.common import STORED_TYPES
from .common import Case, Prepared, _bytes, _dev, _f32, _linear_geometry, _poison, _tol


def linear_fast_case(part, narrow=False, precision="fp32", form="tiled"):
    """fc1's products: forward (+ bias + ReLU in splitk_reduce_fast), input gradient and weight gradient, at
    precision "fp32" (3xTF32) or "bf16", in the tiled form (the input gradient in 64-wide tiles, or 32-wide
    with narrow; the weight gradient split-K where the batch is long enough) or, for the input gradient,
    the wgmma form (sm_90a)."""

    def make(rng, d):
        N, I, O = _linear_geometry(d, "fc1")
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        # x and dx as the step stores fc1's input and its gradient (bf16 in bf16: x with the rounding the products
        # give it anyway, dx rounded once more, within bf16's tolerance)
        stored = linear_splitk.input_dtype(precision)
        xd, wd, bd, dyd = _dev(x, stored), _dev(w), _dev(b), _dev(dy)
        if part == "forward":
            y = _poison((N, O))
            partial = _poison(linear_splitk.forward_partial_size(N, I, O))
            run = lambda: linear_splitk.forward(xd, wd, bd, partial, y, N, I, O, precision)
            return Prepared(
                run,
                {"y": y},
                {"y": ref.relu_forward(ref.linear_forward(x64, w64, b))},
                (2.0 * N * I * O, _bytes(xd, w, y)),
            )
        dx_want, dw_want, _ = ref.linear_backward(x64, w64, dy64)
        if part == "backward_input":
            dx = _poison((N, I), stored)
            run = lambda: linear_splitk.backward_input(
                dyd, wd, dx, N, I, O, narrow=narrow, precision=precision, form=form
            )
            return Prepared(run, {"dx": dx}, {"dx": dx_want}, (2.0 * N * I * O, _bytes(dyd, wd, dx)))
        dw = _poison((O, I))
        partial = _poison(linear_splitk.weight_partial_size(N, I, O))
        run = lambda: linear_splitk.backward_weight(xd, dyd, dw, partial, N, I, O, precision)
        return Prepared(run, {"dw": dw}, {"dw": dw_want}, (2.0 * N * I * O, _bytes(xd, dy, dw)))

    assert part in ("forward", "backward_input", "backward_weight") and form in linear_splitk.FORMS
    assert not narrow or (part, form) == ("backward_input", "tiled")
    assert form == "tiled" or part == "backward_input"
    assert precision in ("fp32", "bf16"), "fc1 runs in 3xTF32 or in bf16 (linear_splitk.KERNEL_PRECISION)"
    ops = ("linear", "relu") if part == "forward" else ("linear",)  # the forward's ReLU is in splitk_reduce
    # the kernels' template arguments: the products' precision and x's stored type
    kernel_precision, stored = linear_splitk.KERNEL_PRECISION[precision], linear_splitk.input_dtype(precision)
    p, wg = f"<{kernel_precision}, {STORED_TYPES[stored]}>", "_wgmma" if form == "wgmma" else ""
    name = {
        "forward": f"linear_forward_fast{p}+splitk_reduce_fast",
        "backward_input": f"linear_backward_input_narrow_fast{p}" if narrow else f"linear_backward_input{wg}_fast{p}",
        "backward_weight": f"linear_backward_weight_fast{p}",
    }[part]
    return Case(f"{name}[fc1]", make, _tol(precision), ops=ops, sm90a=form == "wgmma")


def linear_fast_cases(precision: str) -> list[Case]:
    """Every form of fc1's three products at `precision`."""
    return [
        linear_fast_case("forward", precision=precision),
        linear_fast_case("backward_input", narrow=False, precision=precision),
        linear_fast_case("backward_input", narrow=True, precision=precision),
        linear_fast_case("backward_input", precision=precision, form="wgmma"),
        linear_fast_case("backward_weight", precision=precision),
    ]


def head_fast_case():
    """head_forward_backward_fast + head_sum_parts_fast: fc2, log_softmax, NLL and their backward down to
    fc1's pre-activation (fc1's ReLU mask applied)."""

    def make(rng, d):
        import cupy

        N, H = d.batch, d.hidden
        h = np.maximum(_f32(rng, (N, H)), 0)  # relu outputs: about half are 0
        w, b = _f32(rng, (10, H), 1 / np.sqrt(H)), _f32(rng, 10)
        labels = rng.integers(0, 10, N).astype(np.int32)
        h64 = h.astype(np.float64)
        logits = ref.linear_forward(h64, w.astype(np.float64), b)
        loss, dlogits = ref.nll_loss(logits, labels)
        dh, dw, db = ref.linear_backward(h64, w.astype(np.float64), dlogits)
        d_pre = ref.relu_backward(dh, h64)
        outs = {
            "logits": _poison((N, 10)),
            "d_pre": _poison((N, H)),
            "dw": _poison((10, H)),
            "db": _poison(10),
            "d_bias_fc1": _poison(H),
            "loss": _poison(1),
        }
        log, count = _poison(3), cupy.array([1], dtype=cupy.int32)  # appends at index 1 of a log of 3
        partial = _poison(head.partial_size(N, H))
        args = (_dev(h), _dev(w), _dev(b), _dev(labels, np.int32))

        def run():
            head.forward_backward(*args, N, H, True, outs["logits"], outs["d_pre"], partial)
            head.sum_parts(partial, N, H, outs["dw"], outs["db"], outs["d_bias_fc1"], outs["loss"], log, count)

        return Prepared(
            run,
            {**outs, "logged": log[1:2], "count": count},
            {
                "logits": logits,
                "d_pre": d_pre,
                "dw": dw,
                "db": db,
                "d_bias_fc1": d_pre.sum(0),
                "loss": [loss],
                "logged": [loss],
                "count": [2],
            },
            (8.0 * N * H * 10, _bytes(h) * 2),
        )

    return Case("head_forward_backward_fast+head_sum_parts_fast[fc2]", make, ops=("linear", "relu", "cross_entropy"))
