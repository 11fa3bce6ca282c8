"""Parameters: every parameter of the network in one flat float32 buffer on the GPU and every gradient in
another (each layer's tensors are views), the BatchNorm running statistics; state_dict() / load_state_dict()
with torch's names, so a checkpoint moves between this, mnist_cuda.reference and torch."""

from __future__ import annotations

import numpy as np

from .. import cuda, reference

ALIGN = 4  # every parameter view starts on a 16-byte boundary (room for float4 loads)


def flat_layout(shapes: dict) -> tuple[dict, int]:
    """Each parameter's offset in the flat buffer (each on an ALIGN boundary) and the buffer's size."""
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name] = total
        total += cuda.ceil_div(int(np.prod(shape)), ALIGN) * ALIGN
    return offsets, total


class Parameters:
    """Parameters, gradients and BatchNorm running statistics on the GPU, with torch's names."""

    def __init__(self, channels=(32, 64), hidden=128, buffers=None):
        """buffers: (params, grads, stats), flat views this model's values live in (stacked); default: its own."""
        self.cp = cp = cuda.require_gpu()
        self.channels, self.hidden = tuple(channels), hidden
        self.shapes = reference.param_shapes(self.channels, hidden)
        self.offsets, total = flat_layout(self.shapes)
        c1, c2 = self.channels
        if buffers is None:
            buffers = (cp.zeros(total, cp.float32), cp.zeros(total, cp.float32), cp.zeros(2 * (c1 + c2), cp.float32))
        self.params, self.grads, self.stats = buffers  # the running statistics in one flat buffer as well
        self.p, self.g = self.views(self.params), self.views(self.grads)
        self.running = {
            "bn1.running_mean": self.stats[:c1],
            "bn1.running_var": self.stats[c1 : 2 * c1],
            "bn2.running_mean": self.stats[2 * c1 : 2 * c1 + c2],
            "bn2.running_var": self.stats[2 * c1 + c2 :],
        }
        self.num_batches_tracked = 0
        self.stack = None  # Parameters.stacked's: all the models' (params, grads, stats), as ModelsNet launches on them

    @classmethod
    def stacked(cls, count: int, channels=(32, 64), hidden=128) -> list[Parameters]:
        """count models whose flat buffers lie one after another in three shared ones (model m's parameters at
        m * size, the layout the model-index kernels read: kernels/include/common.cuh), each a Parameters."""
        cp = cuda.require_gpu()
        size = flat_layout(reference.param_shapes(tuple(channels), hidden))[1]
        stats = 2 * (channels[0] + channels[1])
        params, grads = cp.zeros(count * size, cp.float32), cp.zeros(count * size, cp.float32)
        running = cp.zeros(count * stats, cp.float32)
        models = [
            cls(
                channels,
                hidden,
                (
                    params[m * size : (m + 1) * size],
                    grads[m * size : (m + 1) * size],
                    running[m * stats : (m + 1) * stats],
                ),
            )
            for m in range(count)
        ]
        for model in models:
            model.stack = (params, grads, running)
        return models

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
