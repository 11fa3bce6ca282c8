"""The fast fully connected cases: fc1's three products in each form and precision, and the head (fc2, the loss
and their backward down to fc1's pre-activation)."""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..ops import head, linear_splitk
from ..ops.common import BF16, STORED_TYPES
from .common import (
    BF16_TOL,
    FP32_TOL,
    Case,
    Prepared,
    _bytes,
    _dev,
    _exact,
    _f32,
    _linear_geometry,
    _poison,
    _tol,
    held_to,
    round_bf16,
)


def linear_fast_case(part, narrow=False, precision="fp32", form="tiled", operands="float32"):
    """fc1's products: forward (+ bias + ReLU in splitk_reduce_fast), input gradient and weight gradient, at
    precision "fp32" (3xTF32) or "bf16", in the tiled form (the input gradient in 64-wide tiles, or 32-wide
    with narrow; the weight gradient split-K where the batch is long enough) or, for the input gradient,
    the wgmma form (sm_90a). operands: w and dy as float32, or (in bf16) as the bf16 step's copies ("bf16": the
    values rounded to the nearest bf16, the reference taking them unrounded)."""

    def make(rng, d):
        N, I, O = _linear_geometry(d, "fc1")
        x, w, b, dy = _f32(rng, (N, I)), _f32(rng, (O, I), 1 / np.sqrt(I)), _f32(rng, O), _f32(rng, (N, O))
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        # x and dx as the step stores fc1's input and its gradient (bf16 in bf16: x with the rounding the products
        # give it anyway, dx rounded once more, within bf16's tolerance)
        stored = linear_splitk.input_dtype(precision)
        xd, wd, bd, dyd = _dev(x, stored), _dev(w, operand_type), _dev(b), _dev(dy, operand_type)
        if part == "forward":
            y = _poison((N, O))
            partial = _poison(linear_splitk.forward_partial_size(N, I, O))
            run = lambda: linear_splitk.forward(xd, wd, bd, partial, y, N, I, O, precision)
            return Prepared(
                run,
                {"y": y},
                {"y": ref.relu_forward(ref.linear_forward(x64, w64, b))},
                (2.0 * N * I * O, _bytes(xd, wd, y)),
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
        return Prepared(run, {"dw": dw}, {"dw": dw_want}, (2.0 * N * I * O, _bytes(xd, dyd, dw)))

    assert part in ("forward", "backward_input", "backward_weight") and form in linear_splitk.FORMS
    assert not narrow or (part, form) == ("backward_input", "tiled")
    assert form == "tiled" or part == "backward_input"
    assert precision in ("fp32", "bf16"), "fc1 runs in 3xTF32 or in bf16 (linear_splitk.KERNEL_PRECISION)"
    assert operands in ("float32", "bf16") and (operands == "float32" or precision == "bf16")
    operand_type = np.dtype(BF16 if operands == "bf16" else np.float32)
    ops = ("linear", "relu") if part == "forward" else ("linear",)  # the forward's ReLU is in splitk_reduce
    # the kernels' template arguments: the products' precision, x's stored type and w's and dy's
    kernel_precision, stored = linear_splitk.KERNEL_PRECISION[precision], linear_splitk.input_dtype(precision)
    types = f"{STORED_TYPES[stored]}, {STORED_TYPES[operand_type]}"
    p, wg = f"<{kernel_precision}, {types}>", "_wgmma" if form == "wgmma" else ""
    name = {
        "forward": f"linear_forward_fast{p}+splitk_reduce_fast",
        "backward_input": f"linear_backward_input_narrow_fast{p}" if narrow else f"linear_backward_input{wg}_fast{p}",
        "backward_weight": f"linear_backward_weight_fast{p}",
    }[part]
    return Case(f"{name}[fc1]", make, _tol(precision), ops=ops, sm90a=form == "wgmma")


def linear_fast_cases(precision: str) -> list[Case]:
    """Every form of fc1's three products at `precision`, in bf16 with both operand types; and in bf16 the weight's
    copy."""
    return [
        case
        for operands in (("float32", "bf16") if precision == "bf16" else ("float32",))
        for case in (
            linear_fast_case("forward", precision=precision, operands=operands),
            linear_fast_case("backward_input", narrow=False, precision=precision, operands=operands),
            linear_fast_case("backward_input", narrow=True, precision=precision, operands=operands),
            linear_fast_case("backward_input", precision=precision, form="wgmma", operands=operands),
            linear_fast_case("backward_weight", precision=precision, operands=operands),
        )
    ] + ([linear_weight_to_bf16_case()] if precision == "bf16" else [])


def linear_weight_to_bf16_case():
    """linear_weight_to_bf16_fast: fc1's weight as the bf16 step's products read it, each value rounded to the
    nearest bf16 (ties to even): exactly round_bf16's values."""

    def make(rng, d):
        N, I, O = _linear_geometry(d, "fc1")
        w = _f32(rng, (O, I), 1 / np.sqrt(I))
        wd, copy = _dev(w), _poison(O * I, BF16)
        run = lambda: linear_splitk.weight_to_bf16(wd, copy, O * I)
        return Prepared(run, {"copy": copy}, {"copy": round_bf16(w).ravel()}, (0.0, 6.0 * O * I), {"copy": _exact})

    return Case("linear_weight_to_bf16_fast[fc1]", make, ops=("linear",))


def head_fast_case(d_pre_type="float32"):
    """head_forward_backward_fast + head_sum_parts_fast: fc2, log_softmax, NLL and their backward down to
    fc1's pre-activation (fc1's ReLU mask applied), d_pre float32 or bf16 (the bf16 step's: held to BF16_TOL)."""
    d_pre_dtype = np.dtype(BF16 if d_pre_type == "bf16" else np.float32)

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
            "d_pre": _poison((N, H), d_pre_dtype),
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
            {"d_pre": held_to(BF16_TOL, FP32_TOL)} if d_pre_type == "bf16" else {},
        )

    name = f"head_forward_backward_fast<{STORED_TYPES[d_pre_dtype]}>+head_sum_parts_fast[fc2]"
    return Case(name, make, ops=("linear", "relu", "cross_entropy"))
