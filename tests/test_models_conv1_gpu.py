"""Several models in one launch (GPU; skipped without one): conv1's three kernels (the image moments, the fused
conv1 + BatchNorm + ReLU + maxpool forward in training and in evaluation, and the backward to dgamma, dbeta and
dw: kernels/fast/1_conv1_bn_relu_pool.cu), launched once for K = 3 models with different images and parameters
each, give every model the bits of a launch on that model's buffers alone, in every buffer the launches write
(outputs, gradients, saved and running statistics, counters; not the scratch partials, whose rows are the
kernels' own business). The single-model launches are checked against the float64 reference elsewhere
(mnist_cuda.kernel_cases, tests/test_gpu_kernels.py), so bit-equality checks the K-model launches too. Each
model's parameters, gradients and running statistics sit in a block padded to an odd size, so a wrong stride
cannot pass by luck. The forward's channels per block change no bits (forward_channels_per_block), so the
K-model forward is also checked at each choice against the single launch's own."""

import numpy as np
import pytest

from mnist_cuda import data
from mnist_cuda.kernel_cases.common import round_bf16_bits
from mnist_cuda.kernel_cases.fast_blocks import image_moments
from mnist_cuda.ops import conv1_bn_relu_pool as conv1
from mnist_cuda.ops.common import NO_POSITION

pytestmark = pytest.mark.gpu

K = 3  # models
BATCHES = [1, 3, 64, 65]  # per model
CHANNELS = [32, 5]  # the model's, and an odd count that fills no group of channels
EPS, MOMENTUM = 1e-5, 0.1
POOLED = 14
SCRATCH = ("moment_partial", "partial")  # not compared


def _stacked_vs_single(per_model: list[dict], run) -> None:
    """run(buffers, models) once on the models' host arrays stacked ([K][...]) and once per model on copies of
    its own; every buffer but the scratch must hold the same bits after."""
    import cupy

    stacked = {k: cupy.asarray(np.concatenate([m[k] for m in per_model])) for k in per_model[0]}
    run(stacked, len(per_model))
    singles = []
    for m in per_model:
        own = {k: cupy.asarray(v) for k, v in m.items()}
        run(own, 1)
        singles.append({k: v.get() for k, v in own.items()})
    for k, buf in stacked.items():
        if k in SCRATCH:
            continue
        got, want = _bits(buf.get()), _bits(np.concatenate([s[k] for s in singles]))
        assert got.shape == want.shape, k
        assert np.array_equal(got, want), f"{k}: {int((got != want).sum())} of {got.size} differ"


def _bits(a: np.ndarray) -> np.ndarray:
    """Values as unsigned integers of their size (NaNs compare by their bits)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _poison(shape, dtype=np.float32):
    return np.full(shape, 255 if dtype == np.uint8 else np.nan, dtype)


def _normal(rng, shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def _images(rng, B: int) -> np.ndarray:
    """[B, 1, 28, 28] bytes, about half of them 0 (MNIST's background: windows of one value)."""
    shape = (B, 1, 28, 28)
    return np.where(rng.random(shape) < 0.5, 0, rng.integers(0, 256, shape)).astype(np.uint8)


def _layout(channels: int) -> dict:
    """Offsets in a model's parameter (and gradient) block of P floats: conv1's weight, BN1's gamma and beta;
    and in its running block of R floats: the running mean and variance."""
    C = channels
    w = 3
    gamma = w + 9 * C + 2
    beta = gamma + C + 5
    mean, var = 2, 2 + C + 4
    return {"w": w, "gamma": gamma, "beta": beta, "P": beta + C + 7, "mean": mean, "var": var, "R": var + C + 3}


def _model(rng, m: int, B: int, C: int, lay: dict, train: bool) -> dict:
    """Model m's buffers: inputs of its own (weights and BatchNorm's parameters scaled by model) and outputs
    (poisoned); mean and invstd are the statistics the forward normalises with in evaluation."""
    images = _images(rng, B)
    params = _normal(rng, lay["P"])
    params[lay["w"] : lay["w"] + 9 * C] *= (1 + m) / 3
    params[lay["gamma"] : lay["gamma"] + C] += 1.0
    running = _normal(rng, lay["R"])
    running[lay["var"] : lay["var"] + C] = np.abs(running[lay["var"] : lay["var"] + C]) + 0.5
    pooled = (B, C, POOLED, POOLED)
    return {
        "x": images,
        "moments": image_moments(data.normalize(images)),
        "params": params,
        "grads": _normal(rng, lay["P"]),  # dw, dgamma, dbeta written; the rest must stay
        "running": running,
        "mean": _poison(C) if train else _normal(rng, C, 0.5),
        "invstd": _poison(C) if train else np.abs(_normal(rng, C)) + 0.5,
        "pooled": _poison(pooled),
        "argmax": _poison(pooled, np.uint8),
        "d_pooled": _normal(rng, pooled),
        # the positions backward reads: a window position, or NO_POSITION where the ReLU blocked it
        "positions": rng.choice(np.array([0, 1, 2, 3, NO_POSITION], np.uint8), pooled, p=[0.15] * 4 + [0.4]),
        "moment_partial": _poison(conv1.moment_partial_shape(), np.float64),
        "partial": _poison(conv1.backward_partial_size(C)),
        "moments_counter": np.zeros(1, np.uint32),
        "backward_counter": np.zeros(C, np.uint32),  # one per channel group at least
        "moments_out": _poison(conv1.CONV1_MOMENTS, np.float64),
    }


def _models(batch: int, channels: int, train: bool = True) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(1000 * batch + 10 * channels + train)
    lay = _layout(channels)
    return lay, [_model(rng, m, batch, channels, lay, train) for m in range(K)]


# ---- the image moments -------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
def test_image_moments_of_models_match_single_launches(batch):
    def run(b, models):
        kw = {} if models == 1 else {"models": models}
        conv1.image_moments(b["x"], batch, b["moment_partial"], b["moments_counter"], b["moments_out"], **kw)

    _stacked_vs_single(_models(batch, 32)[1], run)


# ---- the forward ------------------------------------------------------------------------------------


def _forward(b: dict, models: int, B: int, C: int, lay: dict, train: bool, per_block, tensor_cores=None) -> None:
    """conv1's forward as the nets launch it: one model's launch as today's (no strides; its own choice of
    channels per block), several with their strides and per_block (None: the launch's choice); tensor_cores in
    both (None: the launches' choice)."""
    p, r = b["params"], b["running"]
    kw = {} if models == 1 else {"models": models, "param_stride": lay["P"], "running_stride": lay["R"]}
    if models > 1:
        kw["per_block"] = per_block
    kw["tensor_cores"] = tensor_cores
    conv1.forward(
        b["x"], p[lay["w"] :], train, b["moments"], EPS, MOMENTUM, b["mean"], b["invstd"], r[lay["mean"] :],
        r[lay["var"] :], p[lay["gamma"] :], p[lay["beta"] :], B, C, b["pooled"], b["argmax"], **kw,
    )  # fmt: skip


@pytest.mark.parametrize("per_block", [None, *conv1.FORWARD_CHANNELS])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("batch", BATCHES)
def test_forward_of_models_matches_single_launches(batch, channels, train, per_block):
    lay, per_model = _models(batch, channels, train)
    _stacked_vs_single(per_model, lambda b, models: _forward(b, models, batch, channels, lay, train, per_block))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("batch", BATCHES)
def test_forward_on_tensor_cores_of_models_matches_single_launches(batch, channels, train):
    lay, per_model = _models(batch, channels, train)
    _stacked_vs_single(per_model, lambda b, models: _forward(b, models, batch, channels, lay, train, None, True))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_forward_of_models_chooses_channels_per_block_from_all_images(train):
    """At a batch where the models' images together take more channels per block than one model's, and would take
    the tensor cores, the K-model forward's own choice still gives each model its single launch's bits."""
    from mnist_cuda.cuda import sm_count

    batch = -(-2 * sm_count() // K)  # K models' images give every SM two blocks of 32 channels; one model's not
    assert conv1.forward_channels_per_block(K * batch, 32) != conv1.forward_channels_per_block(batch, 32)
    # ... and the tensor cores, which round conv1 otherwise, where one model's would not take them
    assert conv1.forward_tensor_cores(K * batch, 32) and not conv1.forward_tensor_cores(batch, 32)
    lay, per_model = _models(batch, 32, train)
    _stacked_vs_single(per_model, lambda b, models: _forward(b, models, batch, 32, lay, train, None))


# ---- the backward -----------------------------------------------------------------------------------


def _backward(b: dict, models: int, B: int, C: int, lay: dict, per_block) -> None:
    """conv1's backward as the nets launch it, with per_block channels per block (None: the launch's choice)
    in both."""
    p, g = b["params"], b["grads"]
    kw = {} if models == 1 else {"models": models, "param_stride": lay["P"]}
    conv1.backward(
        b["x"], p[lay["w"] :], b["mean"], b["invstd"], p[lay["gamma"] :], b["moments"], b["d_pooled"],
        b["positions"], B, C, b["partial"], b["backward_counter"], g[lay["gamma"] :], g[lay["beta"] :],
        g[lay["w"] :], per_block=per_block, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("stored", ["float32", "bf16"])
@pytest.mark.parametrize("per_block", [None, *conv1.BACKWARD_CHANNELS])
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("batch", BATCHES)
def test_backward_of_models_matches_single_launches(batch, channels, per_block, stored):
    """mean and invstd here are the forward's inputs in evaluation (any statistics do: the bits are compared).
    stored: the pooled gradient's type (bf16 in --precision bf16, conv2's input gradient; with 5 channels its
    rows are not 16-byte aligned)."""
    lay, per_model = _models(batch, channels, train=False)
    if stored == "bf16":
        for m in per_model:
            m["d_pooled"] = round_bf16_bits(m["d_pooled"])
    _stacked_vs_single(per_model, lambda b, models: _backward(b, models, batch, channels, lay, per_block))
