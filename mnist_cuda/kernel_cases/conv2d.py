"""The conv2d family's cases: the naive convolution's three products (either layer), conv2's fast implicit-GEMM
products at each precision (conv2_product_cases), the staging of conv2's weights, and weight_quads, the host
mirror of that staging (with the TF32 and bf16 roundings it uses)."""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..cuda import ceil_div
from ..ops import bn_relu_pool, naive
from ..ops import conv2_implicit_gemm as conv2
from ..ops.common import BF16, bf16_values
from ..ops.splitk_reduce import splitk_reduce
from .common import (
    EPS,
    FP32_TOL,
    MOMENTUM,
    PAIRED_TOL,
    Case,
    Prepared,
    _bytes,
    _check_precision,
    _dev,
    _f32,
    _geometry,
    _poison,
    _same_bits,
    _tol,
    held_to,
    round_bf16_bits,
)


def _weight_quads(wd, C, K, precision, forward="forward", input_grad="backward_input"):
    """conv2's weights staged for both fast products by conv2_stage_weights_fast (once, as the step does
    once per step; the timings of the products leave it out), the forward's for `forward`, the input
    gradient's for `input_grad`."""
    import cupy

    fq = cupy.full((conv2.weight_quads(C, K, precision, forward), 4), np.nan, cupy.float32)
    gq = cupy.full((conv2.weight_quads(K, C, precision, input_grad), 4), np.nan, cupy.float32)
    conv2.stage_weights(wd, C, K, fq, gq, precision, forward, input_grad)
    return fq, gq


def split_tf32(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 v as the kernels split it (tensor_core.cuh): big = v with its low 13 mantissa bits cleared,
    small = v - big (exact in float32)."""
    v = np.asarray(v, np.float32)
    big = (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return big, v - big


def round_tf32(v: np.ndarray) -> np.ndarray:
    """float32 v rounded to the nearest TF32, ties away from zero (PTX cvt.rna.tf32.f32; finite v)."""
    bits = np.asarray(v, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def weight_quads(w: np.ndarray, product: str, precision: str = "fp32") -> np.ndarray:
    """What conv2_stage_weights_fast writes for one product, from w [K, C, 3, 3]
    (fast/2_conv2_implicit_gemm.cu): the forward's (`product` "forward" or "forward_stacked") or the input
    gradient's (flipped; `product` "backward_input" or "backward_input_paired"). Float4s
    [tile][chunk][tap][quad][row] holding channels chunk*8 + quad*4 + 0..3 of an output channel of the tile.
    In fp32 the rows hold the big TF32 parts of the tile's channels, then their small parts: 64 channels (128
    rows) for "forward", 32 (64 rows) for "forward_stacked" and "backward_input". "backward_input_paired" lays
    out a kernel row's three taps together, [tile][chunk][kernel row][quad][192 rows]: runs of 32 rows holding
    the small parts of column 0, the big parts of columns 0 and 1, the small parts of column 1, the big and
    small parts of column 2. With tf32: output channel tile*64 + row, rounded to the nearest TF32. With bf16:
    quads of 8 bf16 values (channels chunk*16 + quad*8 + 0..7, as float32 bit patterns, 4 per quad) of output
    channel tile*64 + row."""
    flipped = product.startswith("backward_input")
    wt = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1] if flipped else w  # [out, in, 3, 3], taps flipped
    c_out, c_in = wt.shape[:2]
    tile, chunk = conv2.tile_channels(product, precision), conv2.chunk_channels(precision)
    tiles, chunks = ceil_div(c_out, tile), ceil_div(c_in, chunk)
    padded = np.zeros((tiles * tile, chunks * chunk, 9), np.float32)
    padded[:c_out, :c_in] = wt.reshape(c_out, c_in, 9)
    # [tile, row, chunk, quad, i, tap] -> [tile, chunk, tap, quad, row, i]
    v = padded.reshape(tiles, tile, chunks, 2, chunk // 2, 9).transpose(0, 2, 5, 3, 1, 4)
    if precision == "bf16":
        return np.ascontiguousarray(round_bf16_bits(v)).view(np.float32).reshape(-1, 4)
    if precision == "tf32":
        return round_tf32(v).reshape(-1, 4)
    big, small = split_tf32(v)
    if product != "backward_input_paired":
        return np.concatenate([big, small], axis=4).reshape(-1, 4)
    big, small = (a.reshape(tiles, chunks, 3, 3, 2, tile, 4) for a in (big, small))  # taps as (row, column)
    runs = (small[:, :, :, 0], big[:, :, :, 0], big[:, :, :, 1], small[:, :, :, 1], big[:, :, :, 2], small[:, :, :, 2])
    return np.concatenate(runs, axis=4).reshape(-1, 4)


def conv_stage_weights_case(precision="fp32", forward="forward", input_grad="backward_input"):
    """conv2_stage_weights_fast, the forward's weights for `forward` ("forward", or "forward_stacked" in fp32) and
    the input gradient's for `input_grad` ("backward_input", or "backward_input_paired" in fp32)."""
    _check_precision(precision)

    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        w = _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        fq = _poison((conv2.weight_quads(C, K, precision, forward), 4))
        gq = _poison((conv2.weight_quads(K, C, precision, input_grad), 4))
        wd = _dev(w)
        run = lambda: conv2.stage_weights(wd, C, K, fq, gq, precision, forward, input_grad)
        return Prepared(
            run,
            {"forward_quads": fq, "input_grad_quads": gq},
            {
                "forward_quads": weight_quads(w, forward, precision),
                "input_grad_quads": weight_quads(w, input_grad, precision),
            },
            (0.0, _bytes(w, fq, gq)),
            compare={"forward_quads": _same_bits, "input_grad_quads": _same_bits},
        )

    suffix = (" stacked forward" if forward == "forward_stacked" else "") + (
        " paired input gradient" if input_grad == "backward_input_paired" else ""
    )
    return Case(f"conv2_stage_weights_fast<{precision}>[conv2]{suffix}", make, ops=("conv2d",))


def conv_forward_case(layer, version="naive", forward="forward", persistent=False):
    """conv2d_forward_naive (layer 1 or 2), or conv2's fast forward `forward` ("forward": conv2_forward_fast, or
    "forward_stacked": conv2_forward_stacked_fast, fp32 only) at precision `version` (layer 2); persistent: the
    forward's persistent form, conv2_forward_persistent_fast (conv2_implicit_gemm.PERSISTENT_PRECISIONS; in fp32
    conv2_forward_warp_specialized_fast, or by name one of FP32_PERSISTENT_FORMS), at every batch size."""
    if version != "naive":
        _check_precision(version)
        assert layer == 2, "the implicit-GEMM products are conv2's"

    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        C = _pair_in_channels(C) if persistent and version == "fp32" else C
        x, w = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        stored = np.float32 if version == "naive" else conv2.stored_dtype(version)  # x and y: bf16 in bf16
        xd, wd, y = _dev(x, stored), _dev(w), _poison((N, K, S, S), stored)
        if version == "naive":
            run = lambda: naive.conv2d_forward(xd, wd, y, N, C, K, S)
        else:
            forward_quads, _ = _weight_quads(wd, C, K, version, forward)
            run = lambda: conv2.forward(xd, forward_quads, y, N, C, K, version, forward, persistent=persistent)
        return Prepared(
            run, {"y": y}, {"y": ref.conv2d_forward(x.astype(np.float64), w)}, (2.0 * y.size * C * 9, _bytes(xd, w, y))
        )

    name = (
        "conv2d_forward_naive"
        if version == "naive"
        else "conv2_forward_stacked_fast"
        if forward == "forward_stacked"
        else _persistent_name(version, False, persistent)
        if persistent
        else f"conv2_forward_fast<{version}>"
    )
    return Case(f"{name}[conv{layer}]", make, _tol(version), ops=("conv2d",))


def _pair_in_channels(c: int) -> int:
    """The input channels of a case of the fp32 forward's warpgroup pair: at most those whose weights its block
    holds (wider shapes are refused, tests/test_gpu_kernels.py)."""
    return min(c, conv2.PAIR_MAX_IN_CHANNELS)


def _persistent_name(version: str, moments: bool, persistent: bool | str = True) -> str:
    """The forward's persistent kernel at precision `version`: in fp32 the form `persistent` names
    (conv2_implicit_gemm.FP32_PERSISTENT_FORMS; True: the step's, the warp-specialised pair)."""
    if version == "fp32":
        form = conv2.FP32_PERSISTENT_FORMS[0] if persistent is True else persistent
        return conv2._fp32_persistent[form][1][moments].name
    return f"conv2_forward_persistent_fast<{conv2.KERNEL_PRECISION[version]}, {str(moments).lower()}>"


def conv_forward_moments_case(version: str, form: str | None = None, persistent: bool | str | None = None):
    """conv2's forward with its output's moments, then BN2's statistics merged from them, at every batch size: the
    persistent form's blocks' (form "blocks": conv2_forward_persistent_fast<P, true>, batchnorm_stats_from_parts_fast)
    or, in fp32, a tile's ("tiles", batchnorm_stats_from_tiles_fast after conv2_forward_tile_moments_fast, a block per
    tile, or persistent conv2_forward_warp_specialized_fast<true>, or the form `persistent` names). y is held to the
    product's tolerance against the float64 convolution; the statistics to float32's against y as the kernel stored it
    (the values BN2 normalises), which the float64 reference takes. By default: "tiles" in fp32, "blocks" otherwise; the
    blocks' form is always persistent."""
    form = form or ("tiles" if version == "fp32" else "blocks")
    persistent = form == "blocks" if persistent is None else persistent
    assert form == "blocks" or version == "fp32", "a tile's moments are the 3xTF32 forward's"
    assert form == "tiles" or version != "fp32", "the 3xTF32 forward leaves a tile's moments"
    assert form == "tiles" or persistent, "the blocks' moments come from the persistent form"

    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        C = _pair_in_channels(C) if persistent and version == "fp32" else C
        x, w = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3), 1 / np.sqrt(9 * C))
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        stored = conv2.stored_dtype(version)
        xd, wd, y = _dev(x, stored), _dev(w), _poison((N, K, S, S), stored)
        forward_quads, _ = _weight_quads(wd, C, K, version)
        moment_parts = _poison(conv2.moment_parts_size(K, N, form))
        tiles, tile_values = conv2.moment_counts(N)
        outs = {"mean": _poison(K), "invstd": _poison(K), "running_mean": _dev(rm), "running_var": _dev(rv)}

        def run():
            stats = (EPS, MOMENTUM, *outs.values())
            if form == "tiles":
                conv2.forward(xd, forward_quads, y, N, C, K, version, persistent=persistent, moment_parts=moment_parts)
                bn_relu_pool.stats_from_tiles(moment_parts, tiles, tile_values, K, *stats)
                return
            conv2.forward(xd, forward_quads, y, N, C, K, version, persistent=True, moment_parts=moment_parts)
            parts = conv2.moment_part_count(N, K, version)
            bn_relu_pool.stats_from_parts(moment_parts, parts, tiles, tile_values, K, *stats)

        def statistics(a):
            mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
            running = ref.batchnorm_running_update(rm.astype(np.float64), rv.astype(np.float64), mean, var, a.size / K)
            return dict(zip(outs, (mean, 1 / np.sqrt(var + EPS), *running)))

        def of_stored_y(name):  # the statistics of y as stored, held to float32's tolerance
            def compare(got, want):
                a = y.get()
                a = bf16_values(a) if a.dtype == np.dtype(BF16) else a
                return held_to(FP32_TOL, _tol(version))(got, statistics(a.astype(np.float64))[name])

            return compare

        want_y = ref.conv2d_forward(x.astype(np.float64), w)
        return Prepared(
            run,
            {"y": y, **outs},
            {"y": want_y, **statistics(want_y)},
            (2.0 * y.size * C * 9 + 3.0 * y.size, _bytes(xd, w, y)),
            compare={name: of_stored_y(name) for name in outs},
        )

    forward = _persistent_name(version, True, persistent) if persistent else "conv2_forward_tile_moments_fast"
    kernels = f"{forward}+batchnorm_stats_from_{'tiles' if form == 'tiles' else 'parts'}_fast"
    return Case(f"{kernels}[conv2]", make, _tol(version), ops=("conv2d", "batchnorm"))


def conv_backward_input_case(version="naive", product="backward_input"):
    """conv2d_backward_input_naive, or conv2's fast input gradient `product` ("backward_input":
    conv2_backward_input_fast, or "backward_input_paired": conv2_backward_input_paired_fast, fp32 only) at
    precision `version`."""
    if version != "naive":
        _check_precision(version)

    def make(rng, d):
        N, C, K, S = _geometry(d, 2)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        # dy and dx as conv2 stores them (bf16 in bf16: dy with the rounding the product's operands get anyway, dx
        # rounded once more, within bf16's tolerance)
        stored = np.float32 if version == "naive" else conv2.stored_dtype(version)
        dyd, wd, dx = _dev(dy, stored), _dev(w), _poison((N, C, S, S), stored)
        if version == "naive":
            run = lambda: naive.conv2d_backward_input(dyd, wd, dx, N, C, K, S)
        else:
            _, input_grad_quads = _weight_quads(wd, C, K, version, input_grad=product)
            run = lambda: conv2.backward_input(dyd, input_grad_quads, dx, N, C, K, version, product)
        want, _ = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dx": dx}, {"dx": want}, (2.0 * dx.size * K * 9, _bytes(dyd, w, dx)))

    name = (
        "conv2d_backward_input_naive"
        if version == "naive"
        else "conv2_backward_input_paired_fast"
        if product == "backward_input_paired"
        else f"conv2_backward_input_fast<{version}>"
    )
    return Case(
        f"{name}[conv2]", make, PAIRED_TOL if product == "backward_input_paired" else _tol(version), ops=("conv2d",)
    )


def conv_backward_weight_case(layer, version="naive", l2_prefetch=True, from_layout=False):
    """conv2d_backward_weight_naive, or conv2_backward_weight_fast's partial results summed by
    splitk_reduce_fast (layer 2), as the fast step runs them (l2_prefetch False: its form without the L2's
    256-byte fetch, fp32 only; from_layout: x and dy first written in its layout by conv2_weight_grad_layout_fast,
    its form that reads them there)."""
    if version != "naive":
        _check_precision(version)
        assert layer == 2, "the implicit-GEMM products are conv2's"

    def make(rng, d):
        N, C, K, S = _geometry(d, layer)
        x, w, dy = _f32(rng, (N, C, S, S)), _f32(rng, (K, C, 3, 3)), _f32(rng, (N, K, S, S))
        stored = np.float32 if version == "naive" else conv2.stored_dtype(version)  # x and dy: bf16 in bf16
        xd, dyd, dw = _dev(x, stored), _dev(dy, stored), _poison((K, C, 3, 3))
        if version == "naive":
            run = lambda: naive.conv2d_backward_weight(xd, dyd, dw, N, C, K, S)
        else:
            partial = _poison(conv2.weight_grad_partial_size(C, K))
            layouts = [_poison(conv2.weight_grad_layout_size(N, c, version), stored) for c in (C, K) if from_layout]

            def run():
                x_in, dy_in = xd, dyd
                if from_layout:
                    conv2.to_weight_grad_layout(xd, layouts[0], N, C, version)
                    conv2.to_weight_grad_layout(dyd, layouts[1], N, K, version)
                    x_in, dy_in = layouts
                parts = conv2.backward_weight(
                    x_in, dy_in, partial, N, C, K, version, l2_prefetch=l2_prefetch, from_layout=from_layout
                )
                splitk_reduce(partial, parts, dw)

        _, want = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64))
        return Prepared(run, {"dw": dw}, {"dw": want}, (2.0 * dw.size * N * S * S, _bytes(xd, dyd, dw)))

    if version == "naive":
        name = "conv2d_backward_weight_naive"
    elif from_layout:
        name = f"conv2_weight_grad_layout_fast<{version}>"
        name += f"+conv2_backward_weight_fast<{conv2.KERNEL_PRECISION[version]}, true, true>+splitk_reduce_fast"
    elif l2_prefetch:
        name = f"conv2_backward_weight_fast<{version}>+splitk_reduce_fast"
    else:
        name = f"conv2_backward_weight_fast<{conv2.KERNEL_PRECISION[version]}, false>+splitk_reduce_fast"
    return Case(f"{name}[conv{layer}]", make, _tol(version), ops=("conv2d",))


def conv2_product_cases(version: str) -> list[Case]:
    """conv2's three products at precision `version` (conv2_implicit_gemm.KERNEL_PRECISION): "fp32" (3xTF32),
    "tf32" (plain TF32, train --precision tf32) or "bf16" (train --precision bf16)."""
    stacked = (
        [conv_forward_case(2, version, "forward_stacked"), conv_forward_moments_case(version, "tiles")]
        if version == "fp32"
        else []
    )
    forms = (
        conv2.FP32_PERSISTENT_FORMS if version == "fp32" else (True,) if version in conv2.PERSISTENT_PRECISIONS else ()
    )
    persistent = [
        case
        for form in forms
        for case in (
            conv_forward_case(2, version, persistent=form),
            conv_forward_moments_case(version, persistent=form),
        )
    ]
    paired = [conv_backward_input_case(version, "backward_input_paired")] if version == "fp32" else []
    unprefetched = [conv_backward_weight_case(2, version, l2_prefetch=False)] if version == "fp32" else []
    return (
        [conv_forward_case(2, version)]
        + stacked
        + persistent
        + [conv_backward_input_case(version)]
        + paired
        + [conv_backward_weight_case(2, version), conv_backward_weight_case(2, version, from_layout=True)]
        + unprefetched
    )
