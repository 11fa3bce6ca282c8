"""Every kernel against the float64 reference on fresh random inputs (GPU; skipped without one). The
cases are mnist_cuda.kernel_cases', which dev/bench_kernels.py times."""

import pytest

from mnist_cuda import kernel_cases as kc

pytestmark = pytest.mark.gpu

# batch sizes 1, 3, 64, 65; the default channels and hidden size, and odd ones that fit no tile
DIMS = [
    kc.Dims(1, 32, 64, 128),
    kc.Dims(3, 5, 7, 33),
    kc.Dims(64, 32, 64, 128),
    kc.Dims(65, 5, 7, 33),
    kc.Dims(65, 32, 64, 128),
]


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("case", kc.all_cases(), ids=lambda c: c.name)
def test_kernel_matches_reference(case, dims):
    _check_against_reference(case, dims)


def _check_against_reference(case, dims):
    import numpy as np

    if not kc.runnable(case):
        pytest.skip("its kernels need a Hopper GPU (sm_90a)")
    prepared = case.make(np.random.default_rng(), dims)  # fresh inputs every run
    errors = kc.check(prepared)
    bad = {k: v for k, v in errors.items() if not v < case.tol}
    assert not bad, f"{case.name} at {dims}: relative errors {errors}"


def test_the_cases_launch_every_declared_kernel():
    """Every kernel some ops module declares is launched by a case, and each case's run() launches just
    the kernels its name lists (a case that ran another kernel would check the wrong code)."""
    import numpy as np

    from mnist_cuda import cuda

    rng, launched, seen = np.random.default_rng(), set(), set()

    def record(kernel, grid, block, args, shared_mem, launch):
        seen.add(kernel.name)
        launch()

    for case in filter(kc.runnable, kc.all_cases()):
        prepared = case.make(rng, DIMS[1])  # (conv2's product cases stage its weights here, unrecorded)
        seen.clear()
        with cuda.launch_hook(record):
            kc.check(prepared)
        assert seen == kc.listed_kernels(case), (case.name, seen)
        launched |= seen
    declared = {name for s in cuda.sources() for name in s.kernels}
    if not cuda.arch_specific():  # the wgmma forms, compiled here as empty kernels, are never launched
        declared = {name for name in declared if "wgmma" not in name}
    assert launched == declared


def _conv2_product_cases():
    return [case for p in ("fp32", "tf32", "bf16") for case in kc.conv2_product_cases(p)]


@pytest.fixture
def without_arch_specific():
    """Kernels compiled for plain sm_XY: on a Hopper GPU, 2_conv2_implicit_gemm.cu's mma.sync form instead of
    wgmma."""
    from mnist_cuda import cuda

    cuda.use_arch_specific(False)
    yield
    cuda.use_arch_specific(True)


@pytest.mark.parametrize("dims", DIMS[:2], ids=str)
@pytest.mark.parametrize("case", _conv2_product_cases(), ids=lambda c: c.name)
def test_conv2_products_without_wgmma(case, dims, without_arch_specific):
    """conv2's three products in their form for GPUs other than Hopper (on Hopper the default
    compilation takes the wgmma form, tested above)."""
    _check_against_reference(case, dims)


@pytest.mark.parametrize("case", _conv2_product_cases(), ids=lambda c: c.name)
def test_conv2_products_with_several_channel_tiles(case):
    """Channel counts over one block's tile (conv2's products: 64 output channels per block forward, 32 in
    the stacked forms, 64 x 32 for the weight gradient), with partial last tiles."""
    _check_against_reference(case, kc.Dims(6, 40, 72, 33))


# (images, input channels, output channels) for the persistent forward
PERSISTENT_SHAPES = [(1, 32, 64), (3, 5, 7), (65, 32, 64), (300, 48, 64), (7, 40, 80), (33, 16, 130)]
PERSISTENT_SHAPES += [(512, 32, 64), (400, 16, 64), (1000, 64, 32)]


def _pair_fits(c: int) -> bool:
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    return conv2.pair_fits(c, conv2.shared_memory_per_block())


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp32"])
@pytest.mark.parametrize("n,c,k", PERSISTENT_SHAPES + [(4500, 32, 64)])
def test_conv2_persistent_forward_is_the_block_per_tile_forward_bit_for_bit(n, c, k, precision):
    """The forward's persistent form sums each output in the block-per-tile form's order: the same bits, at one
    and several chunks (weights staged once, or again for every tile), partial channel tiles and several of them,
    fewer tiles than the grid's slots, and several tiles per block (from 512 images; at 32 input channels in bf16,
    the step's path, with the weights staged once). In fp32 the warpgroup pair, at the input channels whose weights
    its block holds (a block's warpgroups with one tile each, or many, by turns), in each of its forms
    (FP32_PERSISTENT_FORMS); past them it is refused."""
    import cupy
    import numpy as np

    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    if precision == "fp32" and not _pair_fits(c):
        quads = cupy.empty((conv2.weight_quads(c, k, precision, "forward"), 4), cupy.float32)
        x, y = cupy.zeros((n, c, 14, 14), cupy.float32), cupy.zeros((n, k, 14, 14), cupy.float32)
        for persistent in (True, *conv2.FP32_PERSISTENT_FORMS):
            with pytest.raises(ValueError, match="shared memory for"):
                conv2.forward(x, quads, y, n, c, k, precision, persistent=persistent)
        return

    rng, stored = np.random.default_rng(n + c + k), conv2.stored_dtype(precision)
    x = rng.standard_normal((n, c, 14, 14), np.float32)
    x = cupy.asarray(kc.round_bf16_bits(x) if precision == "bf16" else x)  # as conv2 stores its input
    w = cupy.asarray(rng.standard_normal((k, c, 3, 3), np.float32) / 17)
    quads = cupy.empty((conv2.weight_quads(c, k, precision, "forward"), 4), cupy.float32)
    unused = cupy.empty((conv2.weight_quads(k, c, precision, "backward_input"), 4), cupy.float32)
    conv2.stage_weights(w, c, k, quads, unused, precision)
    outs = []
    for persistent in (False, True, *(conv2.FP32_PERSISTENT_FORMS if precision == "fp32" else ())):
        y = cupy.full((n, k, 14, 14), 7, stored)  # poisoned: every value must be written
        conv2.forward(x, quads, y, n, c, k, precision, persistent=persistent)
        outs.append(y.get())
    for out in outs[1:]:
        assert np.array_equal(outs[0].view(np.uint8), out.view(np.uint8))


# (n, c, k, precision, sms): the persistent form's moments on this GPU and on one taken to have one SM; fp32's a
# tile's, also past 8,192 tiles (its merge's first pass of loads): a block per tile (sms None), and each persistent
# form (FP32_PERSISTENT_FORMS) where its block holds the weights (sms the form's name: on this GPU; with a 1 after it:
# on one taken to have one SM)
FP32_FORMS = ("warp_specialized", "pair")
MOMENT_SHAPES = PERSISTENT_SHAPES + [(4500, 32, 64)]
MOMENT_CASES = [(*shape, p, sms) for shape in PERSISTENT_SHAPES for p in ("tf32", "bf16") for sms in (None, 1)]
MOMENT_CASES += [(*shape, "fp32", None) for shape in MOMENT_SHAPES]
MOMENT_CASES += [
    (*shape, "fp32", form + one)
    for shape in MOMENT_SHAPES
    if shape[1] <= 32
    for form in FP32_FORMS
    for one in ("", "1")
]


@pytest.mark.parametrize("n,c,k,precision,sms", MOMENT_CASES)
def test_conv2_forward_moments_keep_y_and_give_bn2_statistics(monkeypatch, n, c, k, precision, sms):
    """With its output's moments the forward stores the same bits of y, and BN2's statistics merged from them agree
    with float64's over y as stored, and with the statistics pass (batchnorm_stats_fast), to float32's tolerance, at
    partial and several channel tiles: the persistent form's blocks' (stats_from_parts) at one tile per block and
    at several (from 512 images, or on a GPU taken to have one SM: three blocks, each with many tiles, unevenly);
    fp32's a tile's (stats_from_tiles), up to 9,000 tiles, from a block per tile and from each persistent form (on
    one SM: one block, its two warpgroups taking every other tile)."""
    import cupy
    import numpy as np

    from mnist_cuda import reference as ref
    from mnist_cuda.ops import bn_relu_pool
    from mnist_cuda.ops import conv2_implicit_gemm as conv2
    from mnist_cuda.ops.common import bf16_values

    if sms == 1 or str(sms).endswith("1"):
        monkeypatch.setattr(conv2, "sm_count", lambda: 1)
    rng, stored = np.random.default_rng(n + c + k), conv2.stored_dtype(precision)
    x = np.abs(rng.standard_normal((n, c, 14, 14), np.float32))  # as after ReLU and pooling
    x = cupy.asarray(kc.round_bf16_bits(x) if precision == "bf16" else x)
    w = cupy.asarray(rng.standard_normal((k, c, 3, 3), np.float32) / 17)
    quads = cupy.empty((conv2.weight_quads(c, k, precision, "forward"), 4), cupy.float32)
    unused = cupy.empty((conv2.weight_quads(k, c, precision, "backward_input"), 4), cupy.float32)
    conv2.stage_weights(w, c, k, quads, unused, precision)
    form, persistent = ("tiles", sms.rstrip("1") if sms else False) if precision == "fp32" else ("blocks", True)
    parts = cupy.full(conv2.moment_parts_size(k, n, form), np.nan, cupy.float32)
    ys = [cupy.full((n, k, 14, 14), 7, stored) for _ in range(2)]
    conv2.forward(x, quads, ys[0], n, c, k, precision, persistent=persistent)
    conv2.forward(x, quads, ys[1], n, c, k, precision, persistent=persistent, moment_parts=parts)

    def statistics():  # mean, invstd (poisoned), running mean and variance (from 0 and 1)
        return [cupy.full(k, np.nan, cupy.float32) for _ in range(2)] + [
            cupy.zeros(k, cupy.float32),
            cupy.ones(k, cupy.float32),
        ]

    got = statistics()
    tiles, tile_values = conv2.moment_counts(n)
    if form == "tiles":
        bn_relu_pool.stats_from_tiles(parts, tiles, tile_values, k, ref.BN_EPS, ref.BN_MOMENTUM, *got)
    else:
        count = conv2.moment_part_count(n, k, precision)
        bn_relu_pool.stats_from_parts(parts, count, tiles, tile_values, k, ref.BN_EPS, ref.BN_MOMENTUM, *got)
    pass_out = statistics()
    partial, counter = cupy.empty(bn_relu_pool.partial_size(k), cupy.float32), cupy.zeros(k, cupy.uint32)
    bn_relu_pool.stats(ys[1], n, k, 196, partial, counter, ref.BN_EPS, ref.BN_MOMENTUM, *pass_out)
    y0, y1 = ys[0].get(), ys[1].get()
    assert np.array_equal(y0.view(np.uint8), y1.view(np.uint8))
    a = (bf16_values(y1) if precision == "bf16" else y1).astype(np.float64)
    mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
    running = ref.batchnorm_running_update(np.zeros(k), np.ones(k), mean, var, n * 196)
    for i, want in enumerate((mean, 1 / np.sqrt(var + ref.BN_EPS), *running)):
        assert kc.rel_err(got[i].get(), want) < kc.FP32_TOL, (i, kc.rel_err(got[i].get(), want))
        assert kc.rel_err(got[i].get(), pass_out[i].get()) < kc.FP32_TOL, i


@pytest.mark.parametrize("per_block", [8, 32, "tensor_cores"])
@pytest.mark.parametrize("batch", [3, 65])
def test_conv1_stores_bf16_as_its_float_output_rounded(batch, per_block):
    """conv1's block forward with pooled as bf16 (conv2's input in --precision bf16) writes its float32 output
    rounded to the nearest bf16, ties to even (the rounding conv2's products gave it when they staged a float32
    input, so the step computes the same bits), with the same positions."""
    import cupy
    import numpy as np

    from mnist_cuda import reference as ref
    from mnist_cuda.ops import conv1_bn_relu_pool as conv1
    from mnist_cuda.ops.common import BF16

    rng, C = np.random.default_rng(batch), 32
    form = {"tensor_cores": True} if per_block == "tensor_cores" else {"per_block": per_block, "tensor_cores": False}
    x = cupy.asarray(rng.integers(0, 256, (batch, 1, 28, 28), dtype=np.uint8))
    w, gamma, beta = (
        cupy.asarray((rng.standard_normal(n) * s).astype(np.float32)) for n, s in ((9 * C, 0.3), (C, 1), (C, 0.5))
    )
    mean = cupy.asarray(rng.standard_normal(C).astype(np.float32) * 0.3)
    invstd = cupy.asarray((np.abs(rng.standard_normal(C)) + 0.5).astype(np.float32))
    moments, outs = cupy.zeros(conv1.CONV1_MOMENTS, cupy.float64), {}  # (not read in evaluation)
    for dtype in (np.float32, BF16):  # eval: the statistics given, so both launches see the same ones
        pooled, argmax = cupy.empty((batch, C, 14, 14), dtype), cupy.empty((batch, C, 14, 14), cupy.uint8)
        running = cupy.zeros(C, cupy.float32), cupy.ones(C, cupy.float32)
        conv1.forward(x, w, False, moments, ref.BN_EPS, ref.BN_MOMENTUM, mean, invstd, *running, gamma, beta, batch, C,
                      pooled, argmax, **form)  # fmt: skip
        outs[np.dtype(dtype)] = pooled.get(), argmax.get()
    (f32, f32_at), (b16, b16_at) = outs[np.dtype(np.float32)], outs[np.dtype(BF16)]
    assert np.array_equal(b16, kc.round_bf16_bits(f32)) and np.array_equal(b16_at, f32_at)
