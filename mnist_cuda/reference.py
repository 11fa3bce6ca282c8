"""The oracle: a float64 NumPy forward and backward of the whole model, exactly as docs/design.md defines it.

    conv1 3x3 pad 1 (no bias) -> bn1 -> relu -> maxpool 2x2      [N,C1,14,14]
    conv2 3x3 pad 1 (no bias) -> bn2 -> relu -> maxpool 2x2      [N,C2,7,7]
    flatten -> fc1 -> relu -> fc2 -> log_softmax -> NLL (mean)

Every layer is a pair of plain functions (forward returns what backward needs). The GPU kernels are
tested against these, and these are tested against finite differences and against PyTorch.
"""

from __future__ import annotations

import math

import numpy as np

BN_EPS = 1e-5
BN_MOMENTUM = 0.1


# ----------------------------------------------------------------------------------------------
# Layers


def _windows(x: np.ndarray) -> np.ndarray:
    """[N,C,H,W] -> [N,C,H,W,3,3]: the 3x3 neighbourhood of every pixel, zero padded."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))


def conv2d_forward(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[n,k,h,w] = sum_{c,i,j} x[n,c,h+i-1,w+j-1] * w[k,c,i,j]  (3x3, stride 1, pad 1)."""
    y = np.tensordot(_windows(x), w, axes=([1, 4, 5], [1, 2, 3]))  # [N,H,W,K]
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def conv2d_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray):
    """Returns (dx, dw). dx is a convolution of dy with the flipped, transposed kernel."""
    dw = np.tensordot(dy, _windows(x), axes=([0, 2, 3], [0, 2, 3]))  # [K,C,3,3]
    w_flip = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))  # [C,K,3,3]
    return conv2d_forward(dy, w_flip), dw


def batchnorm_forward_train(x, gamma, beta, eps=BN_EPS):
    """Normalise with the batch mean and biased variance per channel. Returns (y, cache)."""
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean[:, None, None]) * invstd[:, None, None]
    y = gamma[:, None, None] * xhat + beta[:, None, None]
    return y, (xhat, invstd, mean, var)


def batchnorm_running_update(running_mean, running_var, mean, var, count, momentum=BN_MOMENTUM):
    """PyTorch's update: the running variance takes the unbiased batch variance."""
    unbiased = var * count / max(count - 1, 1)
    return ((1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * unbiased)


def batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, eps=BN_EPS):
    invstd = 1.0 / np.sqrt(running_var + eps)
    scale = gamma * invstd
    return scale[:, None, None] * (x - running_mean[:, None, None]) + beta[:, None, None]


def batchnorm_backward(dy, gamma, cache):
    """Returns (dx, dgamma, dbeta) through the batch statistics."""
    xhat, invstd, _, _ = cache
    count = dy.shape[0] * dy.shape[2] * dy.shape[3]
    dbeta = dy.sum(axis=(0, 2, 3))
    dgamma = (dy * xhat).sum(axis=(0, 2, 3))
    dx = (gamma * invstd / count)[:, None, None] * (count * dy - dbeta[:, None, None] - xhat * dgamma[:, None, None])
    return dx, dgamma, dbeta


def relu_forward(x):
    return np.maximum(x, 0.0)


def relu_backward(dy, y):
    """y is relu's output; like PyTorch, the gradient passes where y > 0."""
    return dy * (y > 0)


def _pool_windows(x):
    """[N,C,H,W] -> [N,C,H//2,W//2,4], window order (0,0),(0,1),(1,0),(1,1) like PyTorch's scan."""
    n, c, h, w = x.shape
    ho, wo = h // 2, w // 2
    v = x[:, :, : 2 * ho, : 2 * wo].reshape(n, c, ho, 2, wo, 2).transpose(0, 1, 2, 4, 3, 5)
    return v.reshape(n, c, ho, wo, 4)


def maxpool_forward(x):
    """2x2 stride 2 max pool. Returns (y, argmax), argmax in 0..3 = the first maximum in the window."""
    win = _pool_windows(x)
    argmax = np.argmax(win, axis=-1)  # first occurrence of the max (NaN counts as max, as in torch)
    y = np.take_along_axis(win, argmax[..., None], axis=-1)[..., 0]
    return y, argmax.astype(np.uint8)


def maxpool_backward(dy, argmax, input_shape):
    """The gradient goes to the window position that was the (first) maximum; zero elsewhere."""
    n, c, h, w = input_shape
    ho, wo = dy.shape[2], dy.shape[3]
    onehot = (argmax[..., None] == np.arange(4)) * dy[..., None]  # [N,C,Ho,Wo,4]
    dx = np.zeros(input_shape, dtype=dy.dtype)
    dx[:, :, : 2 * ho, : 2 * wo] = (
        onehot.reshape(n, c, ho, wo, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, 2 * ho, 2 * wo)
    )
    return dx


def linear_forward(x, w, b):
    return x @ w.T + b


def linear_backward(x, w, dy):
    """Returns (dx, dw, db)."""
    return dy @ w, dy.T @ x, dy.sum(axis=0)


def log_softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def nll_loss(logits, labels):
    """Mean negative log-likelihood of log_softmax(logits) and its gradient wrt the logits."""
    n = logits.shape[0]
    logp = log_softmax(logits)
    loss = -logp[np.arange(n), labels].mean()
    dlogits = np.exp(logp)
    dlogits[np.arange(n), labels] -= 1.0
    return loss, dlogits / n


def shift_images(images, offsets):
    """Data augmentation: image i [.., 1, H, W] moved by offsets[i] = (dx, dy) whole pixels, the pixels moved
    in from outside being 0: out[r, c] = image[r - dy, c - dx]."""
    out = np.zeros_like(images)
    size = images.shape[-1]
    for i, (dx, dy) in enumerate(np.asarray(offsets).astype(int)):
        src = images[i, 0, max(0, -dy) : size - max(0, dy), max(0, -dx) : size - max(0, dx)]
        out[i, 0, max(0, dy) : max(0, dy) + src.shape[0], max(0, dx) : max(0, dx) + src.shape[1]] = src
    return out


# ----------------------------------------------------------------------------------------------
# Parameters: PyTorch's names, shapes and default initialisation


def param_shapes(channels=(32, 64), hidden=128) -> dict[str, tuple]:
    """Trainable parameters in state_dict order."""
    c1, c2 = channels
    return {
        "conv1.weight": (c1, 1, 3, 3),
        "bn1.weight": (c1,),
        "bn1.bias": (c1,),
        "conv2.weight": (c2, c1, 3, 3),
        "bn2.weight": (c2,),
        "bn2.bias": (c2,),
        "fc1.weight": (hidden, c2 * 49),
        "fc1.bias": (hidden,),
        "fc2.weight": (10, hidden),
        "fc2.bias": (10,),
    }


def state_dict_spec(channels=(32, 64), hidden=128) -> dict[str, tuple[tuple, np.dtype]]:
    """Every state_dict entry, in torch's order, with shape and dtype (running stats included)."""
    params = param_shapes(channels, hidden)
    spec = {}
    for name, shape in params.items():
        spec[name] = (shape, np.dtype(np.float32))
        if name.endswith(".bias") and name.startswith("bn"):
            bn = name.split(".")[0]
            spec[f"{bn}.running_mean"] = (shape, np.dtype(np.float32))
            spec[f"{bn}.running_var"] = (shape, np.dtype(np.float32))
            spec[f"{bn}.num_batches_tracked"] = ((), np.dtype(np.int64))
    return spec


def init_state_dict(seed: int, channels=(32, 64), hidden=128) -> dict[str, np.ndarray]:
    """PyTorch's default initialisation from a seeded NumPy generator, as float32.

    Conv and Linear weights: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in));
    Linear biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm weight 1, bias 0, running
    mean 0, running var 1. Draw order: conv1, conv2, fc1 (weight, bias), fc2 (weight, bias).
    """
    rng = np.random.default_rng(seed)
    spec = state_dict_spec(channels, hidden)
    state = {}
    for name, (shape, _dtype) in spec.items():
        if name.endswith("num_batches_tracked"):
            state[name] = np.zeros((), np.int64)
        elif name.startswith("bn"):
            one = name.endswith(".weight") or name.endswith("running_var")
            state[name] = np.full(shape, 1.0 if one else 0.0, np.float32)
    for layer in ("conv1", "conv2", "fc1", "fc2"):
        wshape = spec[f"{layer}.weight"][0]
        bound = 1.0 / math.sqrt(int(np.prod(wshape[1:])))
        state[f"{layer}.weight"] = rng.uniform(-bound, bound, wshape).astype(np.float32)
        if f"{layer}.bias" in spec:
            state[f"{layer}.bias"] = rng.uniform(-bound, bound, spec[f"{layer}.bias"][0]).astype(np.float32)
    return {name: state[name] for name in spec}  # torch's order


# ----------------------------------------------------------------------------------------------
# The whole model


class ReferenceModel:
    """The network in float64. Holds a state_dict (as float64 copies) and trains with plain SGD."""

    def __init__(self, state: dict[str, np.ndarray]):
        self.state = {k: np.array(v, dtype=np.int64 if k.endswith("tracked") else np.float64) for k, v in state.items()}
        self.channels = (self.state["conv1.weight"].shape[0], self.state["conv2.weight"].shape[0])
        self.hidden = self.state["fc1.weight"].shape[0]

    def state_dict(self, dtype=np.float32) -> dict[str, np.ndarray]:
        return {k: (v.copy() if k.endswith("tracked") else v.astype(dtype)) for k, v in self.state.items()}

    def forward(self, x, train=True, decisions=None):
        """Logits for a batch [N,1,28,28]; in training mode also the cache for backward.

        decisions (optional, from decisions_of) imposes another computation's discrete choices: for
        each block the pooled window's argmax and whether the ReLU let it through, and fc1's ReLU mask.
        A float32 computation can take a different choice where values sit within its rounding of a
        tie or of zero, and then one gradient path flips; with its choices imposed, this float64 model
        computes exactly what that computation should have computed. cache["pooled1"], ["pooled2"] and
        ["fc1"] hold the outputs, so a caller can check that the imposed choices were near-ties."""
        s, cache = self.state, {"x": np.asarray(x, np.float64)}
        h = cache["x"]
        for i in (1, 2):
            a = conv2d_forward(h, s[f"conv{i}.weight"])
            if train:
                z, cache[f"bn{i}"] = batchnorm_forward_train(a, s[f"bn{i}.weight"], s[f"bn{i}.bias"])
            else:
                z = batchnorm_forward_eval(
                    a, s[f"bn{i}.weight"], s[f"bn{i}.bias"], s[f"bn{i}.running_mean"], s[f"bn{i}.running_var"]
                )
            if decisions is None:
                r = relu_forward(z)
                p, argmax = maxpool_forward(r)
                passes = r > 0
            else:
                argmax, open_ = decisions[f"block{i}"]
                picked = np.take_along_axis(_pool_windows(z), argmax[..., None].astype(np.intp), axis=-1)[..., 0]
                p = np.where(open_, picked, 0.0)
                passes = maxpool_backward(open_.astype(np.float64), argmax, z.shape) > 0
            cache[f"block{i}"] = (h, a, passes, argmax)
            cache[f"pooled{i}"] = h = p
        flat = h.reshape(h.shape[0], -1)
        pre = linear_forward(flat, s["fc1.weight"], s["fc1.bias"])
        if decisions is None:
            f1 = relu_forward(pre)
            f1_passes = f1 > 0
        else:
            f1_passes = decisions["fc1"]
            f1 = np.where(f1_passes, pre, 0.0)
        logits = linear_forward(f1, s["fc2.weight"], s["fc2.bias"])
        cache["fc"] = (flat, f1, f1_passes)
        cache["fc1"] = f1
        return logits, cache

    def loss_and_grads(self, x, labels, decisions=None):
        """Forward in training mode, loss, backward. Returns (loss, grads by parameter name, cache).
        decisions: as in forward()."""
        s = self.state
        logits, cache = self.forward(x, train=True, decisions=decisions)
        loss, dlogits = nll_loss(logits, np.asarray(labels))
        g = {}
        flat, f1, f1_passes = cache["fc"]
        df1, g["fc2.weight"], g["fc2.bias"] = linear_backward(f1, s["fc2.weight"], dlogits)
        dflat, g["fc1.weight"], g["fc1.bias"] = linear_backward(flat, s["fc1.weight"], df1 * f1_passes)
        dh = dflat.reshape(flat.shape[0], self.channels[1], 7, 7)
        for i in (2, 1):
            h_in, a, passes, argmax = cache[f"block{i}"]
            dz = maxpool_backward(dh, argmax, a.shape) * passes  # through the pool, then the ReLU
            da, g[f"bn{i}.weight"], g[f"bn{i}.bias"] = batchnorm_backward(dz, s[f"bn{i}.weight"], cache[f"bn{i}"])
            dh, g[f"conv{i}.weight"] = conv2d_backward(h_in, s[f"conv{i}.weight"], da)
        cache["logits"] = logits
        return loss, {k: g[k] for k in param_shapes(self.channels, self.hidden)}, cache

    @staticmethod
    def decisions_of(cache) -> dict:
        """The discrete choices a training forward took (its cache), in the form forward() accepts:
        {"block1": (argmax, open), "block2": (argmax, open), "fc1": mask}; open = the pooled value
        passed the ReLU (> 0), argmax = the window position 0..3."""
        out = {f"block{i}": (cache[f"block{i}"][3], cache[f"pooled{i}"] > 0) for i in (1, 2)}
        out["fc1"] = cache["fc"][2]
        return out

    def train_step(self, x, labels, lr, decisions=None):
        """One SGD step (p -= lr * grad) and the BN running-statistics update. Returns the loss.
        decisions: as in forward()."""
        loss, grads, cache = self.loss_and_grads(x, labels, decisions)
        s = self.state
        for name, grad in grads.items():
            s[name] = s[name] - lr * grad
        for i in (1, 2):
            _, _, mean, var = cache[f"bn{i}"]
            count = x.shape[0] * cache[f"block{i}"][1].shape[2] * cache[f"block{i}"][1].shape[3]
            s[f"bn{i}.running_mean"], s[f"bn{i}.running_var"] = batchnorm_running_update(
                s[f"bn{i}.running_mean"], s[f"bn{i}.running_var"], mean, var, count
            )
            s[f"bn{i}.num_batches_tracked"] = s[f"bn{i}.num_batches_tracked"] + 1
        return loss

    def predict(self, x):
        logits, _ = self.forward(x, train=False)
        return logits.argmax(axis=1)
