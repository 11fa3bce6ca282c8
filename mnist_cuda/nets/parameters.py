"""Parameters: every parameter of the network in one flat float32 buffer on the GPU and every gradient in
another (each layer's tensors are views), the BatchNorm running statistics; state_dict() / load_state_dict()
with torch's names, so a checkpoint moves between this, mnist_cuda.reference and torch."""

from __future__ import annotations

import numpy as np

from .. import cuda, reference

ALIGN = 4  # every parameter view starts on a 16-byte boundary (room for float4 loads)


class Parameters:
    """Parameters, gradients and BatchNorm running statistics on the GPU, with torch's names."""

    def __init__(self, channels=(32, 64), hidden=128):
        self.cp = cp = cuda.require_gpu()
        self.channels, self.hidden = tuple(channels), hidden
        self.shapes = reference.param_shapes(self.channels, hidden)
        offsets, total = {}, 0
        for name, shape in self.shapes.items():
            offsets[name] = total
            total += cuda.ceil_div(int(np.prod(shape)), ALIGN) * ALIGN
        self.offsets = offsets
        self.params = cp.zeros(total, dtype=cp.float32)
        self.grads = cp.zeros(total, dtype=cp.float32)
        self.p, self.g = self.views(self.params), self.views(self.grads)
        c1, c2 = self.channels
        self.stats = cp.zeros(2 * c1 + 2 * c2, dtype=cp.float32)  # one flat buffer as well
        self.running = {
            "bn1.running_mean": self.stats[:c1],
            "bn1.running_var": self.stats[c1 : 2 * c1],
            "bn2.running_mean": self.stats[2 * c1 : 2 * c1 + c2],
            "bn2.running_var": self.stats[2 * c1 + c2 :],
        }
        self.num_batches_tracked = 0

    def views(self, flat) -> dict:
        """Each parameter's view into a flat buffer of this layout (parameters, gradients, momentum)."""
        return {
            k: flat[o : o + int(np.prod(s))].reshape(s) for (k, s), o in zip(self.shapes.items(), self.offsets.values())
        }

    def state_spec(self):
        return reference.state_dict_spec(self.channels, self.hidden)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies in torch's order and names (conv1.weight, bn1.weight, ..., fc2.bias)."""
        self.cp.cuda.runtime.deviceSynchronize()  # training may run on another (non-blocking) stream
        out = {}
        for name in self.state_spec():
            if name.endswith("num_batches_tracked"):
                out[name] = np.array(self.num_batches_tracked, dtype=np.int64)
            else:
                out[name] = (self.p[name] if name in self.p else self.running[name]).get()
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]):
        for name, (shape, _) in self.state_spec().items():
            if name not in state:
                raise KeyError(f"state_dict lacks {name}")
            value = np.asarray(state[name])
            if value.shape != tuple(shape):
                raise ValueError(f"{name}: shape {value.shape}, expected {tuple(shape)}")
            if name.endswith("num_batches_tracked"):
                self.num_batches_tracked = int(value)
            else:
                target = self.p[name] if name in self.p else self.running[name]
                target.set(np.ascontiguousarray(value, dtype=np.float32))
        self.cp.cuda.runtime.deviceSynchronize()  # the steps run on non-blocking streams
