"""The fast conv blocks' cases: conv1's image moments and fused forward and backward (block 1), BN2's statistics
and block 2's fused BatchNorm + ReLU + maxpool forward and backward, with the comparisons that accept an argmax
within rounding of a tie."""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..ops import bn_relu_pool
from ..ops import conv1_bn_relu_pool as conv1
from ..ops.common import NO_POSITION, STORED_TYPES
from .common import (
    BF16_TOL,
    BLOCK1_OPS,
    BLOCK2_OPS,
    EPS,
    FP32_TOL,
    MOMENTUM,
    Case,
    Prepared,
    _block_input,
    _bytes,
    _dev,
    _f32,
    _geometry,
    _poison,
    held_to,
    round_bf16,
)

# The type the blocks' stored activations and gradients take (conv2's input and output, the pooled outputs and their
# gradients), as the case names show it: float32, or bf16 in --precision bf16 (conv2_implicit_gemm.stored_dtype)
STORED = {name: dtype for dtype, name in STORED_TYPES.items()}


def argmax_near_ties(windows):
    """A comparison for a fused kernel's argmax: it computes the pooled values itself in float32, so a
    window whose two largest values are within rounding may pick either. Accept a different choice only
    where its reference value is within 1e-5 of the window's maximum."""

    def compare(got, want):
        got, want = got.reshape(want.shape).astype(np.int64), want.astype(np.int64)
        if np.array_equal(got, want):
            return 0.0
        if got.min() < 0 or got.max() > 3:
            return float("inf")
        picked = np.take_along_axis(windows, got[..., None], -1)[..., 0]
        best = windows.max(axis=-1)
        ok = (got == want) | (np.abs(best - picked) <= 1e-5 * np.maximum(1.0, np.abs(best)))
        return 0.0 if ok.all() else float("inf")

    return compare


def blocked_positions(pooled, argmax):
    """A block's argmax as its fast kernels store it: NO_POSITION where the ReLU blocked the window."""
    return np.where(pooled > 0, argmax, NO_POSITION).astype(np.uint8)


def positions_near_ties(windows, peak):
    """argmax_near_ties for the fast kernels' argmax with NO_POSITION. peak: each window's largest value before the
    ReLU, in float64. A window may be marked blocked or not against the reference only where its peak is
    within 1e-5 of zero; a byte that is neither a position nor NO_POSITION fails."""

    def compare(got, want):
        got = got.reshape(want.shape)
        if np.any((got > 3) & (got != NO_POSITION)):
            return float("inf")
        blocked_got, blocked_want = got == NO_POSITION, want == NO_POSITION
        if np.any((blocked_got != blocked_want) & (np.abs(peak) > 1e-5)):
            return float("inf")
        both = ~blocked_got & ~blocked_want
        return argmax_near_ties(windows[both])(got[both], want[both])

    return compare


def values_at_positions(a_windows, z_windows, peak):
    """A comparison for batchnorm_relu_maxpool_fast's a_at, a's value at the window's chosen position: where
    the ReLU passed the window (peak above 1e-5), it must be exactly a's value at a position whose z is within
    1e-5 of the peak (argmax_near_ties' rule). Blocked windows are not compared: their position is never read."""

    def compare(got, want):
        got = got.reshape(peak.shape).astype(np.float64)
        passed = peak > 1e-5
        near = np.abs(z_windows - peak[..., None]) <= 1e-5 * np.maximum(1.0, np.abs(peak))[..., None]
        ok = ((a_windows == got[..., None]) & near).any(axis=-1)
        return 0.0 if ok[passed].all() else float("inf")

    return compare


def _pool_reference(z):
    """relu then maxpool of float64 z: (pooled, argmax, windows)."""
    r = ref.relu_forward(z)
    pooled, argmax = ref.maxpool_forward(r)
    return pooled, argmax, ref._pool_windows(r)


def _bn_batch_stats(a):
    mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
    return mean, var, 1 / np.sqrt(var + ref.BN_EPS)


def image_moments(x) -> np.ndarray:
    """What conv1_image_moments_fast computes: the sums S_t of the zero-padded images shifted by tap t over
    the 28x28 outputs of the batch x [N,1,28,28], then G_tu = sum X_t X_u for t <= u, row by row."""
    xp = np.pad(np.asarray(x, np.float64)[:, 0], ((0, 0), (1, 1), (1, 1)))
    shifted = np.stack([xp[:, i : i + 28, j : j + 28].ravel() for i in range(3) for j in range(3)])
    gram = shifted @ shifted.T
    return np.concatenate([shifted.sum(axis=1)] + [gram[t, t:] for t in range(9)])


def conv1_moments_case():
    """conv1_image_moments_fast: the batch's image moments (conv1's BatchNorm statistics come from them)."""

    def make(rng, d):
        N = d.batch
        x, xd = _block_input(rng, d, 1, 1.0, 0.0)
        parts, _ = conv1.moments_parts(N)
        moment_partial = _poison((parts, conv1.CONV1_MOMENTS), np.float64)
        counter = _dev(np.zeros(1), np.uint32)
        moments = _poison(conv1.CONV1_MOMENTS, np.float64)
        run = lambda: conv1.image_moments(xd, N, moment_partial, counter, moments)
        return Prepared(
            run,
            {"moments": moments, "counter": counter},
            {"moments": image_moments(x), "counter": [0]},
            (2.0 * 4 * conv1.CONV1_MOMENTS * N * 196, _bytes(xd)),
        )  # 4 outputs per window, in double

    return Case("conv1_image_moments_fast[block1]", make, ops=("normalize", "conv2d", "batchnorm"))


def bn_stats_fast_case(stored="float"):
    """batchnorm_stats_fast (BN2's statistics over conv2's output, stored as `stored`: "float" or "bfloat16"; the
    reference takes the values the kernel reads, so float32's tolerance holds for both)."""

    def make(rng, d):
        N, C_in, K, S = _geometry(d, 2)
        x, xd = _block_input(rng, d, 2, 2.0, 0.5, STORED[stored])
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        mean, var, invstd = _bn_batch_stats(x.astype(np.float64))
        want_rm, want_rv = ref.batchnorm_running_update(
            rm.astype(np.float64), rv.astype(np.float64), mean, var, N * S * S
        )
        partial = _poison(bn_relu_pool.partial_size(K))
        counter = _dev(np.zeros(K), np.uint32)  # at least one per channel group
        outs = {k: _poison(K) for k in ("mean", "invstd")}
        rmd, rvd = _dev(rm), _dev(rv)
        run = lambda: bn_relu_pool.stats(
            xd, N, K, S * S, partial, counter, EPS, MOMENTUM, outs["mean"], outs["invstd"], rmd, rvd
        )
        return Prepared(
            run,
            {**outs, "running_mean": rmd, "running_var": rvd, "counter": counter},
            {"mean": mean, "invstd": invstd, "running_mean": want_rm, "running_var": want_rv, "counter": np.zeros(K)},
            (3.0 * x.size, 2 * _bytes(xd)),
        )

    return Case(f"batchnorm_stats_fast<{stored}>[bn2]", make, ops=("batchnorm",))


def bn_eval_stats_fast_case():
    """batchnorm_eval_stats_fast: for evaluation, the statistics the fused forwards normalise with become
    the running ones (mean = running_mean, invstd = 1/sqrt(running_var + eps))."""

    def make(rng, d):
        K = d.c2
        rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
        mean, invstd = _poison(K), _poison(K)
        rmd, rvd = _dev(rm), _dev(rv)
        run = lambda: bn_relu_pool.eval_stats(rmd, rvd, EPS, K, mean, invstd)
        return Prepared(
            run,
            {"mean": mean, "invstd": invstd},
            {"mean": rm, "invstd": 1 / np.sqrt(rv.astype(np.float64) + ref.BN_EPS)},
            (2.0 * K, 4 * _bytes(rm)),
        )

    return Case("batchnorm_eval_stats_fast[bn2]", make, ops=("batchnorm",))


def bn_relu_pool_fast_case(layer, train=False, per_block=None, stored="float", tensor_cores=False, form="windows"):
    """conv1_bn_relu_pool_fast (layer 1, per_block channels per block; conv1_mma_bn_relu_pool_fast with
    tensor_cores; pooled stored as `stored`, "float" or "bfloat16") or batchnorm_relu_maxpool_fast (a, pooled and
    a_at stored as `stored`: conv2's output and fc1's input; in `form`, one of bn_relu_pool.FORMS): pooled =
    maxpool(relu(bn(a))) with given statistics; for layer 1 in training (train=True) with the batch's own, from its
    image moments (the kernel also saves them and updates the running statistics)."""

    def make(rng, d):
        N, C_in, K, S = _geometry(d, layer)
        (x, xd), w = _block_input(rng, d, layer, 1.0, 0.0, STORED[stored]), _f32(rng, (K, C_in, 3, 3), 1 / 3)
        pooled_type = STORED[stored]
        mean, invstd, gamma, beta = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5, _f32(rng, K), _f32(rng, K, 0.5)
        a = ref.conv2d_forward(x.astype(np.float64), w) if layer == 1 else x.astype(np.float64)
        outs, expected, stats = {}, {}, [_dev(v) for v in (mean, invstd, gamma, beta)]
        if train:
            rm, rv = _f32(rng, K), np.abs(_f32(rng, K)) + 0.5
            mean, var, invstd = _bn_batch_stats(a)
            want_rm, want_rv = ref.batchnorm_running_update(
                rm.astype(np.float64), rv.astype(np.float64), mean, var, N * S * S
            )
            outs.update(mean=_poison(K), invstd=_poison(K), running_mean=_dev(rm), running_var=_dev(rv))
            stats[:2] = outs["mean"], outs["invstd"]  # written by the kernel
            expected.update(mean=mean, invstd=invstd, running_mean=want_rm, running_var=want_rv)
        bn = [v.astype(np.float64)[:, None, None] for v in (mean, invstd, gamma, beta)]
        z = (a - bn[0]) * bn[1] * bn[2] + bn[3]
        pooled, argmax, windows = _pool_reference(z)
        # both blocks mark the windows the ReLU blocked
        peak = ref._pool_windows(z).max(axis=-1)
        argmax, compare = blocked_positions(pooled, argmax), positions_near_ties(windows, peak)
        outs["pooled"], outs["argmax"] = _poison(pooled.shape, pooled_type), _poison(pooled.shape, np.uint8)
        expected.update(pooled=pooled, argmax=argmax)
        y, am = outs["pooled"], outs["argmax"]
        if layer == 1:
            wd, moments = _dev(w), _dev(image_moments(x), np.float64)
            running = (outs["running_mean"], outs["running_var"]) if train else (stats[0], stats[1])  # (unused in eval)
            run = lambda: conv1.forward(
                xd,
                wd,
                train,
                moments,
                EPS,
                MOMENTUM,
                stats[0],
                stats[1],
                *running,
                stats[2],
                stats[3],
                N,
                K,
                y,
                am,
                per_block=per_block,
                tensor_cores=tensor_cores,
            )
            work = (2.0 * a.size * 9, _bytes(xd, y, am))
            # with pooled as bf16 the case's tolerance is bf16's; the statistics are float32's still
            held = held_to(FP32_TOL, BF16_TOL) if stored == "bfloat16" else None
            stats_compare = {k: held for k in ("mean", "invstd", "running_mean", "running_var") if held and k in outs}
            return Prepared(run, outs, expected, work, compare={"argmax": compare, **stats_compare})
        a_windows = ref._pool_windows(x.astype(np.float64))
        outs["a_at"] = _poison(pooled.shape, pooled_type)
        expected["a_at"] = np.take_along_axis(a_windows, argmax.astype(np.int64)[..., None] % 4, -1)[..., 0]
        run = lambda: bn_relu_pool.forward(xd, *stats, N, K, S, y, am, outs["a_at"], form=form)
        work = (3.0 * x.size, _bytes(xd, y, am, outs["a_at"]))
        return Prepared(
            run,
            outs,
            expected,
            work,
            compare={"argmax": compare, "a_at": values_at_positions(a_windows, ref._pool_windows(z), peak)},
        )

    mode = "[train]" if train else "[eval]"
    if layer == 1:
        tol = BF16_TOL if stored == "bfloat16" else FP32_TOL
        name = f"conv1_bn_relu_pool_fast<{per_block}, {stored}>"
        name = f"conv1_mma_bn_relu_pool_fast<{stored}>" if tensor_cores else name
        return Case(f"{name}[block1]{mode}", make, tol, ops=BLOCK1_OPS)
    assert not train, "block 2's training statistics come apart: batchnorm_stats_fast, or conv2's forward's moments"
    tol = BF16_TOL if stored == "bfloat16" else FP32_TOL  # pooled as bf16 carries bf16's rounding
    name = "batchnorm_relu_maxpool_staged_fast" if form == "staged" else "batchnorm_relu_maxpool_fast"
    return Case(f"{name}<{stored}>[block2]", make, tol, ops=BLOCK2_OPS)


def block_backward_fast_case(layer, per_block=None, stored="float", form="windows"):
    """The BN backward of a block from its pooled gradient: layer 1 runs conv1_backward_fast (-> dgamma,
    dbeta, dw; from the batch's image moments; per_block channels per block); layer 2 runs
    batchnorm_backward_reduce_fast + batchnorm_backward_apply_fast (-> dgamma, dbeta, dx). The pooled gradient is
    stored as `stored` in both (conv2's input gradient, fc1's: "bfloat16" in --precision bf16, rounded here, so that
    float32's tolerance holds), and in layer 2 a and dx too ("bfloat16": dx then carries bf16's rounding, and the
    case bf16's tolerance, while dgamma and dbeta are held to float32's). form: layer 2's apply form
    (bn_relu_pool.FORMS)."""

    def make(rng, d):
        N, C_in, K, S = _geometry(d, layer)
        (x, xd), w = _block_input(rng, d, layer, 1.5, 0.3, STORED[stored]), _f32(rng, (K, C_in, 3, 3), 1 / 3)
        gamma, beta = _f32(rng, K), _f32(rng, K, 0.5)
        a = ref.conv2d_forward(x.astype(np.float64), w) if layer == 1 else x.astype(np.float64)
        z, cache = ref.batchnorm_forward_train(a, gamma.astype(np.float64), beta.astype(np.float64))
        r = ref.relu_forward(z)
        pooled, argmax = ref.maxpool_forward(r)
        d_pooled = _f32(rng, pooled.shape)
        if stored == "bfloat16":
            d_pooled = round_bf16(d_pooled)  # as the step stores it, so the reference sees it too
        dz = ref.relu_backward(ref.maxpool_backward(d_pooled.astype(np.float64), argmax, r.shape), r)
        da, dgamma, dbeta = ref.batchnorm_backward(dz, gamma.astype(np.float64), cache)
        mean, invstd = cache[2].astype(np.float32), cache[1].astype(np.float32)
        counters = _dev(np.zeros((2, K)), np.uint32)  # per kernel, at least one per channel group
        dg, db = _poison(K), _poison(K)
        common = [_dev(v) for v in (mean, invstd)]
        wd, gd = _dev(w), _dev(gamma)
        if layer == 1:
            dw = _poison(w.shape)
            partial = _poison(conv1.backward_partial_size(K))
            moments = _dev(image_moments(x), np.float64)
            pooled_in = (_dev(d_pooled, STORED[stored]), _dev(blocked_positions(pooled, argmax), np.uint8))
            run = lambda: conv1.backward(
                xd, wd, *common, gd, moments, *pooled_in, N, K, partial, counters[0], dg, db, dw, per_block=per_block
            )
            _, want_dw = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), da)
            return Prepared(
                run,
                {"dgamma": dg, "dbeta": db, "dw": dw, "counters": counters},
                {"dgamma": dgamma, "dbeta": dbeta, "dw": want_dw, "counters": np.zeros((2, K))},
                (2.0 * pooled.size * conv1.CONV1_GRAD_SUMS, _bytes(xd, *pooled_in)),
            )
        dx = _poison(x.shape, STORED[stored])
        partial = _poison(bn_relu_pool.partial_size(K))
        pooled_in = (_dev(d_pooled, STORED[stored]), _dev(blocked_positions(pooled, argmax), np.uint8))
        # a_at, a (here the block's input x) at the argmax, as the forward stores it (x's values picked, so exact)
        a_at = _dev(
            np.take_along_axis(ref._pool_windows(x), argmax.astype(np.int64)[..., None], -1)[..., 0], STORED[stored]
        )

        def run():
            bn_relu_pool.backward_reduce(a_at, *common, *pooled_in, N, K, S, partial, counters[0], dg, db)
            bn_relu_pool.backward_apply(xd, *common, gd, dg, db, *pooled_in, N, K, S, dx, form=form)

        # reads: x once, the pooled gradient and argmax twice (the reduce and the apply), a_at once; writes dx
        sums = held_to(FP32_TOL, tol) if stored == "bfloat16" else None
        return Prepared(
            run,
            {"dgamma": dg, "dbeta": db, "dx": dx, "counters": counters},
            {"dgamma": dgamma, "dbeta": dbeta, "dx": da, "counters": np.zeros((2, K))},
            (8.0 * x.size, _bytes(xd, dx, a_at) + 2 * _bytes(*pooled_in)),
            compare={"dgamma": sums, "dbeta": sums} if sums else {},
        )

    if layer == 1:
        return Case(f"conv1_backward_fast<{per_block}, {stored}>[block1]", make, ops=BLOCK1_OPS)
    tol = BF16_TOL if stored == "bfloat16" else FP32_TOL
    apply = "batchnorm_backward_apply_staged_fast" if form == "staged" else "batchnorm_backward_apply_fast"
    name = f"batchnorm_backward_reduce_fast<{stored}>+{apply}<{stored}>[block2]"
    return Case(name, make, tol, ops=BLOCK2_OPS)
