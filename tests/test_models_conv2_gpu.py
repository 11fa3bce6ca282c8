"""conv2's kernels (mnist_cuda.ops.conv2_implicit_gemm) for K models in one launch (GPU; skipped without one):
the weight staging, the forward, the input gradient and the weight gradient's partial results. K = 3 models, each
with its own random weights and images, are launched once on stacked buffers ([K][...]; conv2.weight of model m at
+m * param_stride in padded parameter blocks, so a wrong stride reads other numbers), and once per model on copies
of that model's buffers alone; every K-model output must equal the single-model outputs bit for bit. The
single-model launches are checked against the float64 reference by mnist_cuda.kernel_cases
(tests/test_gpu_kernels.py), so bit-equality checks the K-model launches too.

Each product runs in every form (the 3xTF32 forms at every batch, not only where the step picks them) and both
ways it is compiled: for sm_90a (wgmma; Hopper only) and for plain sm_XY (mma.sync). conv2's input, its output and
their gradients are stored as the step stores them at each precision (bf16 in bf16)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MODELS = 3
BATCHES = (1, 3, 64, 65)  # images per model
PRECISIONS = ("fp32", "tf32", "bf16")
CHANNELS = [(32, 64), (5, 7)]  # (c_in, c_out): the model's, and an odd pair that fills no tile or chunk
PAD = 37  # floats of other parameters before a model's conv2.weight (and more after it) in its block
S = 14


def _forward_forms(precision):
    return ("forward", "forward_stacked") if precision == "fp32" else ("forward",)


def _input_grad_forms(precision):
    return ("backward_input", "backward_input_paired") if precision == "fp32" else ("backward_input",)


@pytest.fixture(scope="module", params=["wgmma", "mma_sync"])
def compiled(request):
    """The products compiled for sm_90a (their wgmma form, on a Hopper GPU) or for plain sm_XY (mma.sync).
    Module-scoped, so the kernels are compiled once per form."""
    from mnist_cuda import cuda

    if request.param == "wgmma":
        if not cuda.arch_specific():
            pytest.skip("the wgmma form needs a Hopper GPU (sm_90a)")
        yield request.param
        return
    cuda.use_arch_specific(False)
    yield request.param
    cuda.use_arch_specific(True)


class Models:
    """MODELS models' conv2 weights in padded parameter blocks of `stride` floats and their batches of `batch`
    images (x and dy, [MODELS][batch][...]), random and different for each model."""

    def __init__(self, batch: int, c_in: int, c_out: int, seed: int, precision: str = "fp32"):
        import cupy

        from mnist_cuda.kernel_cases import round_bf16_bits
        from mnist_cuda.ops import conv2_implicit_gemm as conv2

        rng = np.random.default_rng(seed)
        self.batch, self.c_in, self.c_out = batch, c_in, c_out
        self.size = c_out * c_in * 9
        self.stride = self.size + 2 * PAD + 1  # P, larger than the weights
        params = (rng.standard_normal(MODELS * self.stride) / np.sqrt(9 * c_in)).astype(np.float32)
        self.params = cupy.asarray(params)
        self.w = self.params[PAD:]  # model 0's conv2.weight; model m's at +m * stride
        self.own_w = [
            cupy.asarray(params[m * self.stride + PAD :][: self.size].reshape(c_out, c_in, 3, 3)) for m in range(MODELS)
        ]
        x = rng.standard_normal((MODELS * batch, c_in, S, S)).astype(np.float32)
        dy = rng.standard_normal((MODELS * batch, c_out, S, S)).astype(np.float32)
        self.stored = conv2.stored_dtype(precision)  # x and dy as conv2 stores them
        self.x, self.dy = (cupy.asarray(round_bf16_bits(a) if self.stored != np.float32 else a) for a in (x, dy))

    def own(self, a, m: int):
        """A copy of model m's part of the stacked batch a."""
        return a[m * self.batch : (m + 1) * self.batch].copy()


def _poison(shape, dtype=np.float32):
    import cupy

    return cupy.full(shape, np.nan if dtype == np.float32 else 0x7FC0, dtype)  # a float32 or a bf16 NaN


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a.get())
    return a.view(np.uint32) if a.dtype == np.float32 else a


def _assert_same(stacked, singles, what: str):
    """stacked [MODELS][...] holds each model's single-model output (flattened), bit for bit."""
    stacked = _bits(stacked).reshape(MODELS, -1)
    for m, single in enumerate(singles):
        assert np.array_equal(stacked[m], _bits(single).ravel()), f"{what}: model {m} differs from its own launch"


def _stage(ms: Models, precision: str, forward: str, input_grad: str):
    """Both products' staged weights, of all models by one launch ((MODELS, quads, 4) for the forward, (MODELS *
    quads, 4) for the input gradient: both shapes are taken), and of each model by a launch of its own."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    c_in, c_out = ms.c_in, ms.c_out
    fq_n, gq_n = (
        conv2.weight_quads(c_in, c_out, precision, forward),
        conv2.weight_quads(c_out, c_in, precision, input_grad),
    )
    fq, gq = _poison((MODELS, fq_n, 4)), _poison((MODELS * gq_n, 4))
    conv2.stage_weights(
        ms.w, c_in, c_out, fq, gq, precision, forward, input_grad, models=MODELS, param_stride=ms.stride
    )
    singles = []
    for m in range(MODELS):
        own_fq, own_gq = _poison((fq_n, 4)), _poison((gq_n, 4))
        conv2.stage_weights(ms.own_w[m], c_in, c_out, own_fq, own_gq, precision, forward, input_grad)
        singles.append((own_fq, own_gq))
    return (fq, gq), singles


@pytest.mark.parametrize("channels", CHANNELS, ids=str)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_stage_weights_for_models(precision, channels):
    for forward, input_grad in zip(_forward_forms(precision), _input_grad_forms(precision)):
        ms = Models(1, *channels, seed=1)
        (fq, gq), singles = _stage(ms, precision, forward, input_grad)
        _assert_same(fq, [s[0] for s in singles], f"{forward}'s staged weights")
        _assert_same(gq, [s[1] for s in singles], f"{input_grad}'s staged weights")


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("channels", CHANNELS, ids=str)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_forward_for_models(precision, channels, batch, compiled):
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    c_in, c_out = channels
    for product in _forward_forms(precision):
        ms = Models(batch, c_in, c_out, seed=2, precision=precision)
        (fq, _), singles = _stage(ms, precision, product, "backward_input")
        y = _poison((MODELS * batch, c_out, S, S), ms.stored)
        conv2.forward(ms.x, fq, y, batch, c_in, c_out, precision, product, models=MODELS)
        own_y = []
        for m, (own_fq, _) in enumerate(singles):
            own_y.append(_poison((batch, c_out, S, S), ms.stored))
            conv2.forward(ms.own(ms.x, m), own_fq, own_y[-1], batch, c_in, c_out, precision, product)
        _assert_same(y, own_y, f"{product} ({compiled})")


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("channels", CHANNELS, ids=str)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_input_grad_for_models(precision, channels, batch, compiled):
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    c_in, c_out = channels
    for product in _input_grad_forms(precision):
        ms = Models(batch, c_in, c_out, seed=3, precision=precision)
        (_, gq), singles = _stage(ms, precision, "forward", product)
        dx = _poison((MODELS * batch, c_in, S, S), ms.stored)
        conv2.backward_input(ms.dy, gq, dx, batch, c_in, c_out, precision, product, models=MODELS)
        own_dx = []
        for m, (_, own_gq) in enumerate(singles):
            own_dx.append(_poison((batch, c_in, S, S), ms.stored))
            conv2.backward_input(ms.own(ms.dy, m), own_gq, own_dx[-1], batch, c_in, c_out, precision, product)
        _assert_same(dx, own_dx, f"{product} ({compiled})")


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("channels", CHANNELS, ids=str)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_weight_grad_partials_for_models(precision, channels, batch, compiled):
    """Each model's parts, [MODELS][parts][c_out * c_in * 9] at the start of the K-model scratch (the layout the
    caller hands to splitk_reduce), are those of its own launch; the rest of the scratch is not written."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    c_in, c_out = channels
    ms = Models(batch, c_in, c_out, seed=4, precision=precision)
    size = conv2.weight_grad_partial_size(c_in, c_out)
    partial = _poison(MODELS * size)
    parts = conv2.backward_weight(ms.x, ms.dy, partial, batch, c_in, c_out, precision, models=MODELS)
    used = parts * ms.size
    own = []
    for m in range(MODELS):
        own.append(_poison(size))
        own_parts = conv2.backward_weight(ms.own(ms.x, m), ms.own(ms.dy, m), own[-1], batch, c_in, c_out, precision)
        assert own_parts == parts
    _assert_same(partial[: MODELS * used], [p[:used] for p in own], f"weight gradient parts ({compiled})")
    assert np.isnan(partial[MODELS * used :].get()).all(), "written past the models' parts"


@pytest.mark.parametrize("batch", BATCHES + (100,))
@pytest.mark.parametrize("channels", CHANNELS, ids=str)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_weight_grad_from_its_layout(precision, channels, batch, compiled):
    """x and dy in the weight gradient's layout (to_weight_grad_layout: each model's image groups, the last one's
    images past the batch zeros) give the weight gradient's parts of x and dy as they are, bit for bit, for one
    model and for MODELS at once; the layout's buffers are written only within their models' sizes."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    c_in, c_out = channels
    ms = Models(batch, c_in, c_out, seed=5, precision=precision)
    size = conv2.weight_grad_partial_size(c_in, c_out)
    for models, x, dy in ((MODELS, ms.x, ms.dy), (1, ms.own(ms.x, 1), ms.own(ms.dy, 1))):
        want, got = _poison(models * size), _poison(models * size)
        parts = conv2.backward_weight(x, dy, want, batch, c_in, c_out, precision, models=models)
        layouts = []
        for a, channels_of in ((x, c_in), (dy, c_out)):
            values = conv2.weight_grad_layout_size(batch, channels_of, precision)
            layouts.append(_poison(models * values + 8, ms.stored))
            conv2.to_weight_grad_layout(a, layouts[-1], batch, channels_of, precision, models=models)
            tail = layouts[-1][models * values :].get()
            poisoned = np.isnan(tail) if ms.stored == np.float32 else tail == 0x7FC0
            assert poisoned.all(), "written past the models' layouts"
        got_parts = conv2.backward_weight(*layouts, got, batch, c_in, c_out, precision, models=models, from_layout=True)
        assert got_parts == parts
        used = models * parts * ms.size
        assert np.array_equal(_bits(got[:used]), _bits(want[:used])), f"{models} model(s): the parts differ"
