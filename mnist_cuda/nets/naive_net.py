"""NaiveNet: the step as the plain kernels of kernels/naive/, one op per launch."""

from __future__ import annotations

from ..ops import naive
from .base import CLASSES, EPS, MOMENTUM, S1, S2, _Net
from .parameters import Parameters


class _NaiveBlock:
    """The activations of one conv -> BatchNorm -> ReLU -> maxpool block of the naive net."""

    def __init__(self, cp, index: int, c_in: int, c_out: int, size: int, batch: int, params: Parameters):
        self.c_in, self.c_out, self.size = c_in, c_out, size
        self.w, self.dw = params.p[f"conv{index}.weight"], params.g[f"conv{index}.weight"]
        self.gamma, self.beta = params.p[f"bn{index}.weight"], params.p[f"bn{index}.bias"]
        self.dgamma, self.dbeta = params.g[f"bn{index}.weight"], params.g[f"bn{index}.bias"]
        self.running_mean = params.running[f"bn{index}.running_mean"]
        self.running_var = params.running[f"bn{index}.running_var"]
        full, half = (batch, c_out, size, size), (batch, c_out, size // 2, size // 2)
        self.a, self.z, self.r = (cp.empty(full, cp.float32) for _ in range(3))  # conv, BatchNorm, ReLU outputs
        self.out, self.argmax = cp.empty(half, cp.float32), cp.empty(half, cp.uint8)  # pooled
        self.mean, self.invstd = cp.empty(c_out, cp.float32), cp.empty(c_out, cp.float32)
        self.d_r, self.d_z, self.d_a = (cp.empty(full, cp.float32) for _ in range(3))
        self.d_in = cp.empty((batch, c_in, size, size), cp.float32) if index > 1 else None
        self.x = None

    def forward(self, x, n: int, train: bool):
        self.x = x
        C, K, S, hw = self.c_in, self.c_out, self.size, self.size * self.size
        naive.conv2d_forward(x, self.w, self.a, n, C, K, S)
        if train:
            naive.batchnorm_stats(
                self.a, self.mean, self.invstd, self.running_mean, self.running_var, n, K, hw, EPS, MOMENTUM
            )
            naive.batchnorm_apply(self.a, self.mean, self.invstd, self.gamma, self.beta, self.z, n, K, hw)
        else:
            naive.batchnorm_eval(
                self.a, self.running_mean, self.running_var, self.gamma, self.beta, self.z, n, K, hw, EPS
            )
        naive.relu_forward(self.z, self.r, n * K * hw)
        naive.maxpool_forward(self.r, self.out, self.argmax, n, K, S)
        return self.out

    def backward(self, d_out, n: int, need_input_grad: bool):
        C, K, S, hw = self.c_in, self.c_out, self.size, self.size * self.size
        naive.maxpool_backward(d_out, self.argmax, self.d_r, n, K, S)
        naive.relu_backward(self.d_r, self.r, self.d_z, n * K * hw)
        naive.batchnorm_backward(
            self.d_z, self.a, self.mean, self.invstd, self.gamma, self.d_a, self.dgamma, self.dbeta, n, K, hw
        )
        naive.conv2d_backward_weight(self.x, self.d_a, self.dw, n, C, K, S)
        if need_input_grad:
            naive.conv2d_backward_input(self.d_a, self.w, self.d_in, n, C, K, S)
        return self.d_in


class NaiveNet(_Net):
    """The step as one plain kernel per op (kernels/naive/)."""

    # the optimizer's kernels (_Net.update): plain SGD, and SGD with its options; the zero-grad is a memset
    sgd, sgd_momentum = staticmethod(naive.sgd), staticmethod(naive.sgd_momentum)

    version = "naive"

    def __init__(self, params: Parameters, batch_size: int):
        super().__init__(params, batch_size)
        cp, B, H = self.cp, batch_size, self.hidden
        self.images = cp.empty((B, 1, S1, S1), cp.float32)  # the batch normalised
        self.block1 = _NaiveBlock(cp, 1, 1, self.c1, S1, B, params)
        self.block2 = _NaiveBlock(cp, 2, self.c1, self.c2, S2, B, params)
        self.fc1_pre, self.fc1_out = cp.empty((B, H), cp.float32), cp.empty((B, H), cp.float32)
        self.d_fc1_out, self.d_fc1_pre = cp.empty((B, H), cp.float32), cp.empty((B, H), cp.float32)
        self.d_features = cp.empty((B, self.features), cp.float32)
        self.d_logits = cp.empty((B, CLASSES), cp.float32)

    def forward(self, x, labels, n: int, train: bool = True, slot: int = 0):
        """Logits of the n images x (bytes); in training also the loss (logged) and its gradient."""
        p, F, H = self.p, self.features, self.hidden
        naive.normalize(x, self.images, n * S1 * S1)
        h = self.block1.forward(self.images, n, train)
        h = self.block2.forward(h, n, train)
        naive.linear_forward(h, p["fc1.weight"], p["fc1.bias"], self.fc1_pre, n, F, H)
        naive.relu_forward(self.fc1_pre, self.fc1_out, n * H)
        naive.linear_forward(self.fc1_out, p["fc2.weight"], p["fc2.bias"], self.logits, n, H, CLASSES)
        if train:
            naive.cross_entropy(self.logits, labels, self.d_logits, self.loss, self.loss_log, self.loss_count, n)

    def backward(self, n: int):
        p, g, F, H = self.p, self.g, self.features, self.hidden
        naive.linear_backward_params(self.fc1_out, self.d_logits, g["fc2.weight"], g["fc2.bias"], n, H, CLASSES)
        naive.linear_backward_input(self.d_logits, p["fc2.weight"], self.d_fc1_out, n, H, CLASSES)
        naive.relu_backward(self.d_fc1_out, self.fc1_out, self.d_fc1_pre, n * H)
        naive.linear_backward_params(self.block2.out, self.d_fc1_pre, g["fc1.weight"], g["fc1.bias"], n, F, H)
        naive.linear_backward_input(self.d_fc1_pre, p["fc1.weight"], self.d_features, n, F, H)
        d = self.block2.backward(self.d_features, n, need_input_grad=True)
        self.block1.backward(d, n, need_input_grad=False)

    def zero_grad(self):
        grads = self.params.grads
        rt = self.cp.cuda.runtime
        rt.memsetAsync(grads.data.ptr, 0, grads.nbytes, self.cp.cuda.get_current_stream().ptr)

    def decisions(self, n: int) -> dict:
        """The ReLU and max-pool choices of the last training forward (reference.ReferenceModel.forward):
        each block's argmax and open windows, fc1's ReLU mask."""
        return {
            "block1": (self.block1.argmax[:n].get(), self.block1.out[:n].get() > 0),
            "block2": (self.block2.argmax[:n].get(), self.block2.out[:n].get() > 0),
            "fc1": self.fc1_out[:n].get() > 0,
        }
