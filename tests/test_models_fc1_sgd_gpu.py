"""fc1's split-K products with their split-K sum, and the update with its schedule, launched once for K = 3
models (GPU; skipped without one): every output of a K-model launch, and every buffer it updates in place, is
the bits of the single-model launch on that model's own buffers (copies). The single-model launches are checked
against the float64 reference elsewhere (mnist_cuda.kernel_cases, tests/test_gpu_kernels.py), so the equality
checks the K-model launches too.

Each model gets its own random inputs and parameters. A model's parameters lie in a block of P floats with room
to spare around its views (and the padding holds random values too), so that a wrong stride reads other numbers
and cannot pass by luck."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
K = 3
BATCHES = (1, 3, 64, 65)
WEIGHT_BATCHES = BATCHES + (133, 256)  # the weight gradient is cut into splits only from 128 samples on
SHAPES = [(3136, 128), (7 * 49, 33)]  # fc1's (inputs, outputs): the model's, and an odd one that fits no tile
PRECISIONS = ("fp32", "bf16")  # fc1 runs in 3xTF32 under fp32 and tf32 alike (linear_splitk.KERNEL_PRECISION)
W_AT = 8  # fc1.weight's offset in a model's parameter block (16-byte aligned, as Parameters' views are)


@pytest.fixture
def cp():
    from mnist_cuda import cuda

    return cuda.require_gpu()


def _same(got, want, what=""):
    """Bit-for-bit equality of two device arrays (NaNs included, by their bits)."""
    got, want = got.get(), want.get()
    assert got.shape == want.shape, what
    if got.dtype.kind == "f":
        got, want = got.view(np.uint32), want.view(np.uint32)
    assert np.array_equal(got, want), f"{what}: {np.count_nonzero(got != want)} of {got.size} differ"


def _random(cp, rng, *shape):
    return cp.asarray(rng.standard_normal(shape).astype(np.float32))


def _poison(cp, precision, *shape):
    """fc1's input gradient dx as the step stores it (linear_splitk.input_dtype), filled with NaN."""
    from mnist_cuda.kernel_cases.common import _poison as poison
    from mnist_cuda.ops import linear_splitk as fc1

    return poison(shape, fc1.input_dtype(precision))


def _input(cp, rng, precision, *shape):
    """fc1's input x as the step stores it (linear_splitk.input_dtype: bf16 bits in bf16)."""
    from mnist_cuda.kernel_cases.common import _dev
    from mnist_cuda.ops import linear_splitk as fc1

    return _dev(rng.standard_normal(shape), fc1.input_dtype(precision))


class Fc1Params:
    """K models' fc1 parameters, each in a block of P floats: weight [H][F] at W_AT, bias [H] after it, padding
    around both; model 0's views (model m's at + m * P) and each model's own copy of its block."""

    def __init__(self, cp, rng, F, H):
        self.F, self.H = F, H
        self.b_at = W_AT + -(-F * H // 4) * 4 + 4
        self.P = self.b_at + -(-H // 4) * 4 + 12  # a multiple of 4, as the flat buffers are
        self.flat = _random(cp, rng, K * self.P)

    def weight(self, block):
        return block[W_AT : W_AT + self.F * self.H]

    def bias(self, block):
        return block[self.b_at : self.b_at + self.H]

    def block(self, m):
        """Model m's block, as a buffer of its own."""
        return self.flat[m * self.P : (m + 1) * self.P].copy()


def _part(a, m, size):
    """Model m's part of a [K][size] buffer (flat), as a buffer of its own."""
    return a.ravel()[m * size : (m + 1) * size].copy()


# ---- fc1 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", BATCHES)
def test_forward(cp, n, shape, precision):
    """relu(x W^T + b): the split products into partial, then their sum with the bias and the ReLU."""
    from mnist_cuda.cuda import ceil_div
    from mnist_cuda.ops import linear_splitk as fc1

    F, H = shape
    rng = np.random.default_rng([n, F, H])
    p = Fc1Params(cp, rng, F, H)
    x = _input(cp, rng, precision, K * n, F)
    size = fc1.forward_partial_size(n, F, H)
    partial, out = cp.full(K * size, np.nan, cp.float32), cp.full((K * n, H), np.nan, cp.float32)
    fc1.forward(x, p.weight(p.flat), p.bias(p.flat), partial, out, n, F, H, precision, models=K, param_stride=p.P)
    splits, _ = fc1.split_k(F, ceil_div(H, fc1.TILE) * ceil_div(n, fc1.TILE))
    dense = splits * n * H  # a model's partial results, one after another
    for m in range(K):
        block = p.block(m)
        partial_m, out_m = cp.full(size, np.nan, cp.float32), cp.full((n, H), np.nan, cp.float32)
        fc1.forward(_part(x, m, n * F), p.weight(block), p.bias(block), partial_m, out_m, n, F, H, precision)
        _same(out[m * n : (m + 1) * n], out_m, f"model {m}'s output")
        _same(partial[m * dense : (m + 1) * dense], partial_m[:dense], f"model {m}'s partial results")


def _input_grad_forms():
    """backward_input's choices: the default, each tiled width forced, and the wgmma form (on sm_90a only)."""
    return [("default", {}), ("wide", {"narrow": False}), ("narrow", {"narrow": True}), ("wgmma", {"form": "wgmma"})]


@pytest.mark.parametrize("form", _input_grad_forms(), ids=lambda f: f[0])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", BATCHES)
def test_backward_input(cp, n, shape, precision, form):
    """dx = dy W, in each of its forms (dx as the step stores it: bf16 in bf16)."""
    from mnist_cuda import cuda
    from mnist_cuda.ops import linear_splitk as fc1

    name, options = form
    if name == "wgmma" and not cuda.arch_specific():
        pytest.skip("the wgmma form needs kernels compiled for sm_90a (a Hopper GPU)")
    F, H = shape
    rng = np.random.default_rng([n, F, H, 1])
    p = Fc1Params(cp, rng, F, H)
    dy = _random(cp, rng, K * n, H)
    dx = _poison(cp, precision, K * n, F)
    fc1.backward_input(dy, p.weight(p.flat), dx, n, F, H, precision=precision, models=K, param_stride=p.P, **options)
    for m in range(K):
        dx_m = _poison(cp, precision, n, F)
        fc1.backward_input(_part(dy, m, n * H), p.weight(p.block(m)), dx_m, n, F, H, precision=precision, **options)
        _same(dx[m * n : (m + 1) * n], dx_m, f"model {m}'s input gradient")


@pytest.mark.parametrize("sum_splits", [True, False], ids=["summed", "summed_by_caller"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", WEIGHT_BATCHES)
def test_backward_weight(cp, n, shape, precision, sum_splits):
    """dW = dy^T x into each model's gradient block (straight from a single split, else through partial and
    splitk_reduce: by backward_weight itself, or by its caller as the step runs it). The whole gradient
    block is compared, so a write outside fc1.weight's view shows."""
    from mnist_cuda.ops import linear_splitk as fc1
    from mnist_cuda.ops.splitk_reduce import splitk_reduce

    F, H = shape
    rng = np.random.default_rng([n, F, H, 2])
    p = Fc1Params(cp, rng, F, H)  # here the gradients' blocks
    x, dy = _input(cp, rng, precision, K * n, F), _random(cp, rng, K * n, H)
    size = fc1.weight_partial_size(n, F, H)
    splits, _ = fc1.weight_splits(n, F, H)

    def run(x, dy, grads, partial, **k):
        fc1.backward_weight(x, dy, p.weight(grads), partial, n, F, H, precision, sum_splits, **k)
        if splits > 1 and not sum_splits:
            splitk_reduce(partial, splits, p.weight(grads), **({"models": K, "out_stride": p.P} if k else {}))

    blocks = [p.block(m) for m in range(K)]  # each model's gradient block as it was
    partial = cp.full(K * size, np.nan, cp.float32)
    run(x, dy, p.flat, partial, models=K, param_stride=p.P)
    for m, grads_m in enumerate(blocks):
        partial_m = cp.full(size, np.nan, cp.float32)
        run(_part(x, m, n * F), _part(dy, m, n * H), grads_m, partial_m)
        _same(p.flat[m * p.P : (m + 1) * p.P], grads_m, f"model {m}'s gradient block")
        if splits > 1:
            dense = splits * H * F
            _same(partial[m * dense : (m + 1) * dense], partial_m[:dense], f"model {m}'s partial results")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", BATCHES + (256,))
def test_bf16_operands_give_the_bf16_products_bits(cp, n, shape):
    """In bf16, W's copy (weight_to_bf16: each model's, from its parameter block) and dy as bf16 give the three
    products' bits from float32 W and dy, in every form, for one model and for K at once (the copies' own stride)."""
    from mnist_cuda import cuda
    from mnist_cuda.kernel_cases.common import round_bf16_bits
    from mnist_cuda.ops import linear_splitk as fc1

    F, H = shape
    rng = np.random.default_rng([n, F, H, 3])
    p = Fc1Params(cp, rng, F, H)
    x, dy = _input(cp, rng, "bf16", K * n, F), _random(cp, rng, K * n, H)
    w16, dy16 = cp.full(K * F * H + 8, 0x7FC0, np.uint16), cp.empty(K * n * H, np.uint16)
    fc1.weight_to_bf16(p.weight(p.flat), w16, F * H, models=K, param_stride=p.P)
    fc1.weight_to_bf16(dy, dy16, K * n * H)
    for m in range(K):
        _same(w16[m * F * H : (m + 1) * F * H], cp.asarray(round_bf16_bits(p.weight(p.block(m)).get())), f"copy {m}")
    assert (w16[K * F * H :] == 0x7FC0).all(), "written past the models' copies"
    forms = [{}, {"form": "tiled", "narrow": False}, {"form": "tiled", "narrow": True}]
    forms += [{"form": "wgmma"}] if cuda.arch_specific() else []
    for k in ({"models": 1}, {"models": K}):
        m = k["models"]
        outs = []
        for w, d, stride in ((p.weight(p.flat), dy, p.P), (w16, dy16, F * H)):
            y, dx = cp.full((m * n, H), np.nan, cp.float32), [_poison(cp, "bf16", m * n, F) for _ in forms]
            partial = cp.full(m * fc1.forward_partial_size(n, F, H), np.nan, cp.float32)
            fc1.forward(x, w, p.bias(p.flat), partial, y, n, F, H, "bf16", param_stride=p.P, weight_stride=stride, **k)
            for dx_form, form in zip(dx, forms):
                fc1.backward_input(d, w, dx_form, n, F, H, precision="bf16", weight_stride=stride, **k, **form)
            grads, partial = cp.zeros(m * p.P, cp.float32), cp.zeros(m * fc1.weight_partial_size(n, F, H), cp.float32)
            fc1.backward_weight(x, d, p.weight(grads), partial, n, F, H, "bf16", param_stride=p.P, **k)
            outs.append([y, *dx, grads])
        for got, want in zip(*outs[::-1]):
            _same(got, want, f"{m} model(s)")


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("splits", [1, 5, 49])
@pytest.mark.parametrize("count, cols", [(33, 33), (1000, 40), (3 * 128, 128)])
def test_splitk_reduce(cp, count, cols, splits, relu):
    """The split sum on its own: activations (out [K][count], a bias in each parameter block) and a gradient
    (out at param_stride, no bias), with NaNs among the partial results."""
    from mnist_cuda.ops.splitk_reduce import splitk_reduce

    rng = np.random.default_rng([count, splits, relu])
    partial = _random(cp, rng, K * splits * count)
    partial[:: max(1, partial.size // 7)] = np.nan
    P, bias_at, grad_at = -(-count // 4) * 4 + 20, 4, 8
    params, grads = _random(cp, rng, K * P), _random(cp, rng, K * P)
    grads_before = [_part(grads, m, P) for m in range(K)]
    out = cp.full((K * count // cols, cols), np.nan, cp.float32)
    bias = params[bias_at : bias_at + cols]
    splitk_reduce(partial, splits, out, bias=bias, relu=relu, count=count, models=K, out_stride=count, bias_stride=P)
    splitk_reduce(partial, splits, grads[grad_at : grad_at + count], relu=relu, models=K, out_stride=P)
    for m, grads_m in enumerate(grads_before):
        partial_m, params_m = _part(partial, m, splits * count), _part(params, m, P)
        out_m = cp.full((count // cols, cols), np.nan, cp.float32)
        splitk_reduce(partial_m, splits, out_m, bias=params_m[bias_at : bias_at + cols], relu=relu)
        splitk_reduce(partial_m, splits, grads_m[grad_at : grad_at + count], relu=relu)
        _same(out.ravel()[m * count : (m + 1) * count], out_m.ravel(), f"model {m}'s sum with bias")
        _same(grads[m * P : (m + 1) * P], grads_m, f"model {m}'s gradient block")


# ---- the update and its schedule ------------------------------------------------------------------------------


def _option_sets():
    from mnist_cuda.optim import Schedule, SGDOptions

    return {
        # plain; momentum with Nesterov and weight decay (cosine); momentum with dampening (one-cycle)
        "mixed": [
            SGDOptions(0.05),
            SGDOptions(0.02, momentum=0.9, nesterov=True, weight_decay=5e-4, schedule=Schedule("cosine", total=40)),
            SGDOptions(0.1, momentum=0.8, dampening=0.3, schedule=Schedule("onecycle", total=30, anneal="linear")),
        ],
        # weight decay without momentum (the buffers never written; a step schedule); plain; constant momentum
        "no_momentum": [
            SGDOptions(0.03, weight_decay=1e-3, schedule=Schedule("step", step_size=2, gamma=0.5)),
            SGDOptions(0.07),
            SGDOptions(0.01, momentum=0.5),
        ],
    }


class SingleUpdates:
    """Each model's own buffers and optimizer state, stepped by the single-model kernels as _Net.update does."""

    def __init__(self, cp, options, params, buffers, P):
        self.cp, self.options = cp, options
        self.params = [_part(params, m, P) for m in range(K)]
        self.grads = [cp.empty(P, cp.float32) for _ in range(K)]
        self.buffers = [_part(buffers, m, P) for m in range(K)]
        self.state = [cp.zeros(2, cp.int32) for _ in range(K)]
        self.lr = [cp.zeros(1, cp.float32) for _ in range(K)]
        self.first = [cp.zeros(1, cp.int32) for _ in range(K)]

    def step(self, m):
        from mnist_cuda.ops import both
        from mnist_cuda.ops.sgd_zero_grad import sgd_momentum_zero_grad, sgd_zero_grad

        o = self.options[m]
        if o.plain:
            sgd_zero_grad(self.params[m], self.grads[m], o.lr)
            return
        both.sgd_schedule(self.state[m], self.lr[m], self.first[m], o.schedule.kernel_args(o.lr))
        sgd_momentum_zero_grad(
            self.params[m],
            self.grads[m],
            self.buffers[m] if o.momentum else self.grads[m],
            self.lr[m],
            self.first[m],
            o.momentum,
            o.dampening,
            o.weight_decay,
            o.nesterov,
        )


@pytest.mark.parametrize("seed, options", [(1, "mixed"), (2, "no_momentum")])
def test_update(cp, seed, options):
    """The K-model update (sgd_schedule_models, then sgd_models_zero_grad) over several steps from the
    buffers' first, each model with its own options, against each model's own update."""
    from mnist_cuda.ops import both
    from mnist_cuda.ops.sgd_zero_grad import initial_rates, model_hyperparameters, sgd_models_zero_grad

    options = _option_sets()[options]
    rng = np.random.default_rng(seed)
    P = 4 * 2503  # float4s in a partly filled last block
    params, buffers = _random(cp, rng, K * P), _random(cp, rng, K * P)
    grads = cp.empty(K * P, cp.float32)
    single = SingleUpdates(cp, options, params, buffers, P)
    hyper = {k: cp.asarray(v) for k, v in model_hyperparameters(options).items()}
    lr, first, state = cp.asarray(initial_rates(options)), cp.zeros(K, cp.int32), cp.zeros((K, 2), cp.int32)
    args = cp.asarray(both.schedule_rows([None if o.plain else o.schedule.kernel_args(o.lr) for o in options]))
    for t in range(6):
        g = rng.standard_normal((K, P)).astype(np.float32)
        grads.set(g.ravel())
        both.sgd_schedule_models(state, lr, first, args)
        sgd_models_zero_grad(params, grads, buffers, lr, first, **hyper, models=K)
        for m in range(K):
            single.grads[m].set(g[m])
            single.step(m)
            what = f"step {t}, model {m}"
            _same(params[m * P : (m + 1) * P], single.params[m], f"{what}: parameters")
            _same(grads[m * P : (m + 1) * P], single.grads[m], f"{what}: gradients")
            _same(buffers[m * P : (m + 1) * P], single.buffers[m], f"{what}: momentum buffers")
            if options[m].plain:
                assert lr[m].get() == np.float32(options[m].lr) and not state[m].get().any(), what
            else:
                _same(lr[m : m + 1], single.lr[m], f"{what}: rate")
                _same(first[m : m + 1], single.first[m], f"{what}: first flag")
                _same(state[m], single.state[m], f"{what}: state")


def _schedules(kind):
    """Three schedules of `kind` with different arguments, and each one's base rate."""
    from mnist_cuda.optim import Schedule

    if kind == "constant":
        return [(Schedule(), lr) for lr in (0.1, 0.037, 3e-4)]
    if kind == "step":
        steps = ((1, 0.99, 0.1), (7, 0.5, 0.3), (50, 0.1, 1.0))
        return [(Schedule("step", step_size=s, gamma=g), lr) for s, g, lr in steps]
    if kind == "cosine":
        return [(Schedule("cosine", total=t), lr) for t, lr in ((300, 0.1), (97, 0.05), (1, 0.2))]
    return [
        (Schedule("onecycle", total=300, pct_start=0.3, anneal="cos"), 0.1),
        (Schedule("onecycle", total=250, pct_start=0.25, div_factor=10, final_div_factor=100, anneal="linear"), 0.4),
        (Schedule("onecycle", total=300, pct_start=0.5, div_factor=3, anneal="cos"), 0.02),
    ]


@pytest.mark.parametrize("kind", ["constant", "step", "cosine", "onecycle"])
def test_schedule(cp, kind):
    """sgd_schedule_models against sgd_schedule on each model's own state, over 300 steps, one model resumed
    (its counter ahead, its buffers started), beside a plain-SGD model whose rate and state stay as they are."""
    from mnist_cuda.ops import both

    schedules = _schedules(kind)
    rows = [s.kernel_args(lr) for s, lr in schedules] + [None]  # the last: a plain model
    models = len(rows)
    start = np.array([[0, 0], [0, 0], [17, 1], [5, 1]], np.int32)
    state, first = cp.asarray(start), cp.zeros(models, cp.int32)
    lr = cp.asarray(np.array([0, 0, 0, 0.25], np.float32))
    args = cp.asarray(both.schedule_rows(rows))
    single = [(cp.asarray(start[m]), cp.zeros(1, cp.float32), cp.zeros(1, cp.int32)) for m in range(models - 1)]
    for t in range(300):
        both.sgd_schedule_models(state, lr, first, args)
        for m, (state_m, lr_m, first_m) in enumerate(single):
            both.sgd_schedule(state_m, lr_m, first_m, rows[m])
            what = f"step {t}, model {m}"
            _same(lr[m : m + 1], lr_m, f"{what}: rate")
            _same(first[m : m + 1], first_m, f"{what}: first flag")
            _same(state[m], state_m, f"{what}: state")
        assert lr[-1].get() == np.float32(0.25) and np.array_equal(state[-1].get(), start[-1]), f"step {t}: plain"
