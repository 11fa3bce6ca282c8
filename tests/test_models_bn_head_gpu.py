"""Several models in one launch (GPU; skipped without one): block 2's BatchNorm kernels (statistics, the fused
BatchNorm + ReLU + maxpool, the backward's reduction and apply: kernels/fast/3_bn_relu_pool.cu) and the head
(kernels/fast/5_head.cu), launched once for K = 3 models with different inputs and parameters each, give every
model the bits of a launch on that model's buffers alone, in every buffer the launches write (outputs, scratch,
gradients, running statistics, loss log and counters). The single-model launches are checked against the
float64 reference elsewhere (mnist_cuda.kernel_cases, tests/test_gpu_kernels.py), so bit-equality checks the
K-model launches too. Each model's parameters, gradients and running statistics sit in a block padded to an
odd size, so a wrong stride cannot pass by luck. Block 2's kernels run with conv2's output and its gradient
stored as float32 and as bf16 (--precision bf16)."""

import numpy as np
import pytest

from mnist_cuda.ops import bn_relu_pool, head
from mnist_cuda.ops.common import BF16

K = 3  # models
BATCHES = [1, 3, 64, 65]  # per model
S = 14  # conv2's output, block 2's input
EPS, MOMENTUM = 1e-5, 0.1
CAPACITY = 4  # each model's loss log


def _stacked_vs_single(per_model: list[dict], run) -> None:
    """run(buffers, models) once on the models' host arrays stacked ([K][...]) and once per model on copies of
    its own; every buffer, after, must hold the same bits."""
    import cupy

    stacked = {k: cupy.asarray(np.concatenate([m[k] for m in per_model])) for k in per_model[0]}
    run(stacked, len(per_model))
    singles = []
    for m in per_model:
        own = {k: cupy.asarray(v) for k, v in m.items()}
        run(own, 1)
        singles.append({k: v.get() for k, v in own.items()})
    for k, buf in stacked.items():
        got, want = _bits(buf.get()), _bits(np.concatenate([s[k] for s in singles]))
        assert got.shape == want.shape, k
        assert np.array_equal(got, want), f"{k}: {int((got != want).sum())} of {got.size} differ"


def _bits(a: np.ndarray) -> np.ndarray:
    """Four-byte values as uint32 (NaNs compare by their bits), bytes and bf16 bits as they are."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint32) if a.dtype.itemsize == 4 else a


def _poison(shape, dtype=np.float32):
    return np.full(shape, 255 if dtype == np.uint8 else np.nan, dtype)


def _normal(rng, shape, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


# ---- block 2's BatchNorm ---------------------------------------------------------------------------


def _bn_layout(channels: int) -> dict:
    """Offsets in a model's parameter (and gradient) block of P floats and running block of R floats."""
    C = channels
    gamma, beta = 5, 5 + C + 3
    mean, var = 2, 2 + C + 4
    return {"gamma": gamma, "beta": beta, "P": beta + C + 9, "mean": mean, "var": var, "R": var + C + 3}


def _bn_model(rng, m: int, B: int, C: int, lay: dict, stored) -> dict:
    """Model m's buffers: inputs (its own scale and offset) and outputs (poisoned); a, d_a, pooled, a_at and d_pooled
    stored as `stored` (float32, or BF16: bf16 bits, NaN patterns for the poison)."""
    So, groups = S // 2, -(-C // bn_relu_pool.BN_CHANNELS)
    a, d_pooled = _normal(rng, (B, C, S, S), 1.0 + m, 0.3 * m), _normal(rng, (B, C, So, So))
    d_a, pooled_out, a_at = _poison((B, C, S, S)), _poison((B, C, So, So)), _poison((B, C, So, So))
    if stored == BF16:  # the upper halves: truncated, which is as good as rounded for inputs
        arrays = (np.ascontiguousarray(v).view(np.uint32) >> 16 for v in (a, d_pooled, d_a, pooled_out, a_at))
        a, d_pooled, d_a, pooled_out, a_at = (v.astype(BF16) for v in arrays)
    running = _normal(rng, lay["R"])
    running[lay["var"] : lay["var"] + C] = np.abs(running[lay["var"] : lay["var"] + C]) + 0.5
    pooled = (B, C, So, So)
    return {
        "a": a,
        "params": _normal(rng, lay["P"]),  # gamma, beta and padding
        "grads": _normal(rng, lay["P"]),  # dgamma, dbeta written; the rest must stay
        "running": running,
        "d_pooled": d_pooled,
        "mean": _poison(C),
        "invstd": _poison(C),
        "stats_partial": _poison(bn_relu_pool.partial_size(C)),
        "backward_partial": _poison(bn_relu_pool.partial_size(C)),
        "stats_counter": np.zeros(groups, np.uint32),
        "backward_counter": np.zeros(groups, np.uint32),
        "pooled": pooled_out,
        "argmax": _poison(pooled, np.uint8),
        "a_at": a_at,
        "d_a": d_a,
    }


def _bn_step(b: dict, models: int, B: int, C: int, lay: dict, form: str) -> None:
    """Block 2's BatchNorm in training, forward and backward, as the nets launch it; one model's launches as
    today's (no strides), several with theirs."""
    p, g, r = b["params"], b["grads"], b["running"]
    gamma, beta = p[lay["gamma"] :], p[lay["beta"] :]
    dgamma, dbeta = g[lay["gamma"] :], g[lay["beta"] :]
    params = {} if models == 1 else {"models": models, "param_stride": lay["P"]}
    running = {} if models == 1 else {"models": models, "running_stride": lay["R"]}
    bn_relu_pool.stats(
        b["a"], B, C, S * S, b["stats_partial"], b["stats_counter"], EPS, MOMENTUM, b["mean"], b["invstd"],
        r[lay["mean"] :], r[lay["var"] :], **running,
    )  # fmt: skip
    bn_relu_pool.forward(
        b["a"], b["mean"], b["invstd"], gamma, beta, B, C, S, b["pooled"], b["argmax"], b["a_at"], form=form, **params
    )
    bn_relu_pool.backward_reduce(
        b["a_at"], b["mean"], b["invstd"], b["d_pooled"], b["argmax"], B, C, S, b["backward_partial"],
        b["backward_counter"], dgamma, dbeta, **params,
    )  # fmt: skip
    bn_relu_pool.backward_apply(
        b["a"], b["mean"], b["invstd"], gamma, dgamma, dbeta, b["d_pooled"], b["argmax"], B, C, S, b["d_a"],
        form=form, **params,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("form", bn_relu_pool.FORMS)
@pytest.mark.parametrize("stored", [np.float32, BF16], ids=["float32", "bf16"])
@pytest.mark.parametrize("channels", [64, 7])
@pytest.mark.parametrize("batch", BATCHES)
def test_block2_batchnorm_models_match_single_launches(batch, channels, stored, form):
    """Each form of the forward and the apply (the staged ones' runs of another model's part, or of 3 x 7 planes, not in
    16-byte units)."""
    rng = np.random.default_rng(1000 * batch + channels)
    lay = _bn_layout(channels)
    per_model = [_bn_model(rng, m, batch, channels, lay, stored) for m in range(K)]
    _stacked_vs_single(per_model, lambda b, models: _bn_step(b, models, batch, channels, lay, form))


@pytest.mark.gpu
@pytest.mark.parametrize("stored", [np.float32, BF16], ids=["float32", "bf16"])
@pytest.mark.parametrize("channels", [64, 7])
@pytest.mark.parametrize("batch", [3, 64, 65])
def test_block2_forms_give_the_same_bits(batch, channels, stored):
    """forward's and backward_apply's two forms run the same arithmetic on each value: the same bits in every buffer,
    for runs in whole 16-byte units (64 images of 64 channels) and not (3 x 7 planes), and for grids of several blocks
    whose last is partial (65 x 7 planes)."""
    import cupy

    model = _bn_model(np.random.default_rng(batch + channels), 0, batch, channels, _bn_layout(channels), stored)
    outs = []
    for form in bn_relu_pool.FORMS:
        own = {k: cupy.asarray(v) for k, v in model.items()}
        _bn_step(own, 1, batch, channels, _bn_layout(channels), form)
        outs.append({k: _bits(v.get()) for k, v in own.items()})
    for k in outs[0]:
        assert np.array_equal(outs[0][k], outs[1][k]), k


# ---- the head --------------------------------------------------------------------------------------


def _head_layout(hidden: int) -> dict:
    """Offsets in a model's parameter (and gradient) block of P floats: fc2's weight and bias, fc1's bias."""
    H = hidden
    w = 3
    b = w + 10 * H + 2
    fc1_bias = b + 10 + 5
    return {"w": w, "b": b, "fc1_bias": fc1_bias, "P": fc1_bias + H + 7}


def _head_model(rng, m: int, B: int, H: int, lay: dict) -> dict:
    """Model m's buffers; its loss log already holds m * 2 of CAPACITY losses (the last model's is full)."""
    return {
        "h": np.maximum(_normal(rng, (B, H), 1.0 + m), 0),  # fc1's ReLU outputs: about half are 0
        "params": _normal(rng, lay["P"], 1 / np.sqrt(H)),
        "grads": _normal(rng, lay["P"]),  # fc2's dw, db and fc1's bias gradient written; the rest must stay
        "labels": rng.integers(0, 10, B).astype(np.int32),
        "logits": _poison((B, 10)),
        "d_pre": _poison((B, H)),
        "partial": _poison(head.partial_size(B, H)),
        "loss": _poison(1),
        "loss_log": _normal(rng, CAPACITY),
        "loss_count": np.array([min(2 * m, CAPACITY)], np.int32),
    }


def _head_step(b: dict, models: int, B: int, H: int, train: bool, lay: dict) -> None:
    p, g = b["params"], b["grads"]
    kw = {} if models == 1 else {"models": models, "param_stride": lay["P"]}
    head.forward_backward(
        b["h"], p[lay["w"] :], p[lay["b"] :], b["labels"], B, H, train, b["logits"], b["d_pre"], b["partial"], **kw
    )
    if train:
        head.sum_parts(
            b["partial"], B, H, g[lay["w"] :], g[lay["b"] :], g[lay["fc1_bias"] :], b["loss"], b["loss_log"],
            b["loss_count"], **kw,
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("hidden", [128, 33])
@pytest.mark.parametrize("batch", BATCHES)
def test_head_models_match_single_launches(batch, hidden, train):
    rng = np.random.default_rng(1000 * batch + hidden)
    lay = _head_layout(hidden)
    per_model = [_head_model(rng, m, batch, hidden, lay) for m in range(K)]
    _stacked_vs_single(per_model, lambda b, models: _head_step(b, models, batch, hidden, train, lay))


def test_head_sum_parts_rejects_a_log_that_does_not_split():
    """(No GPU: the check comes before the launch.)"""
    with pytest.raises(ValueError, match="equal logs"):
        head.sum_parts(*[None] * 7, np.zeros(7, np.float32), None, models=3)
