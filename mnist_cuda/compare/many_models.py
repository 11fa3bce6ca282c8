"""K models trained at once, ours against PyTorch's best ways (scripts/compare_many_models.py is the command).

Ours: K step runners (mnist_cuda.step.Step) stepped in rounds, each model's step graph on its own stream, as
`python -m mnist_cuda.train --seed 0-(K-1)` trains them (mnist_cuda.train_many); and one model's steps one
after another, what K separate runs take.

PyTorch, every model with its own weights, BatchNorm statistics and batch of 64 images:
    alone     one model's step in PyTorch's fastest mode at batch 64 (the comparison's honest baseline:
              compiled, channels_last, the whole step one CUDA graph), times K
    grouped   HFTA's horizontal fusion: one network whose convolutions are grouped by model (conv1 takes model
              m's images as input channel m), whose BatchNorms have the K models' channels (so each channel's
              statistics are over its model's images), and whose linear layers are batched matrix products
    vmap      torch.func: the K models' weights stacked (stack_module_state) and one model's step mapped over
              them with vmap, BatchNorm's running statistics stacked too
each as a whole-step CUDA graph (normalise, forward, the K losses, backward, fused SGD, zero-grad), uncompiled
and under torch.compile; the fastest is PyTorch's many-model figure. check_designs compares each design's
losses with K separate models' over a few eager steps before any is timed.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from .. import data
from ..torch_model import make_torch_model
from .torch_side import byte_table

SIZE = data.IMAGE_SIZE


def grouped_model(torch, k: int, channels, hidden):
    """K copies of the network as one module (HFTA): input [B, K, 28, 28], output [K, B, 10] log-probabilities."""
    nn, F = torch.nn, torch.nn.functional
    c1, c2 = channels

    class GroupedCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(k, k * c1, 3, padding=1, bias=False, groups=k)
            self.bn1 = nn.BatchNorm2d(k * c1)
            self.conv2 = nn.Conv2d(k * c1, k * c2, 3, padding=1, bias=False, groups=k)
            self.bn2 = nn.BatchNorm2d(k * c2)
            self.fc1_weight = nn.Parameter(torch.empty(k, hidden, c2 * 49))
            self.fc1_bias = nn.Parameter(torch.empty(k, 1, hidden))
            self.fc2_weight = nn.Parameter(torch.empty(k, 10, hidden))
            self.fc2_bias = nn.Parameter(torch.empty(k, 1, 10))

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            x = x.reshape(x.shape[0], k, c2 * 49).transpose(0, 1)
            x = F.relu(torch.baddbmm(self.fc1_bias, x, self.fc1_weight.transpose(1, 2)))
            return F.log_softmax(torch.baddbmm(self.fc2_bias, x, self.fc2_weight.transpose(1, 2)), dim=2)

    return GroupedCNN()


def load_grouped(torch, net, states):
    """Model m's state into its slices of the grouped network."""
    cat = lambda name: torch.cat([torch.from_numpy(np.asarray(s[name])) for s in states])
    stack = lambda name: torch.stack([torch.from_numpy(np.asarray(s[name])) for s in states])
    with torch.no_grad():
        for layer in ("conv1", "conv2"):
            getattr(net, layer).weight.copy_(cat(f"{layer}.weight"))
        for bn in ("bn1", "bn2"):
            for field in ("weight", "bias", "running_mean", "running_var"):
                getattr(getattr(net, bn), field).copy_(cat(f"{bn}.{field}"))
        for fc in ("fc1", "fc2"):
            getattr(net, f"{fc}_weight").copy_(stack(f"{fc}.weight"))
            getattr(net, f"{fc}_bias").copy_(stack(f"{fc}.bias")[:, None, :])


class TorchMany:
    """K models' steps at once in PyTorch as one whole-step CUDA graph: design "grouped" or "vmap", compiled
    (torch.compile's default mode) or not; SGD fused, at one rate."""

    def __init__(self, torch, design: str, states, batch: int, lr: float, channels, hidden, compiled: bool):
        self.torch, self.design, self.k, self.batch = torch, design, len(states), batch
        F, dev = torch.nn.functional, torch.device("cuda")
        self.F = F
        self.table = byte_table(torch, dev)
        if design == "grouped":
            self.net = grouped_model(torch, self.k, channels, hidden).to(dev)
            load_grouped(torch, self.net, states)
            params = list(self.net.parameters())
            self.model_losses = self._grouped_losses
        else:
            params = self._make_vmap(states, channels, hidden, dev)
            self.model_losses = self._vmap_losses
        if compiled:
            torch._dynamo.reset()
            self.model_losses = torch.compile(self.model_losses, dynamic=False)
        self.params = params
        self.opt = torch.optim.SGD(params, lr=lr, fused=True)
        self.x_bytes = torch.zeros((self.k, batch, 1, SIZE, SIZE), dtype=torch.uint8, device=dev)
        self.y = torch.zeros((self.k, batch), dtype=torch.int64, device=dev)
        self.stage_x = torch.empty((self.k, batch, 1, SIZE, SIZE), dtype=torch.uint8, pin_memory=True)
        self.stage_y = torch.empty((self.k, batch), dtype=torch.int64, pin_memory=True)
        self.stage_free = torch.cuda.Event()
        self.graph = None

    def _make_vmap(self, states, channels, hidden, dev):
        torch = self.torch
        from torch.func import functional_call, stack_module_state, vmap

        base = make_torch_model(channels, hidden).to(dev).train()
        models = []  # copies of one module: stack_module_state takes models of one class
        for s in states:
            m = copy.deepcopy(base)
            m.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in s.items()})
            models.append(m)
        self.stacked, self.buffers = stack_module_state(models)
        base = base.to("meta")

        def one(p, b, x, y):
            return self.F.nll_loss(functional_call(base, (p, b), (x,)), y)

        self.mapped = vmap(one)
        return list(self.stacked.values())

    def _grouped_losses(self, x_bytes, y):
        x = self.table[x_bytes.long()].view(self.k, self.batch, SIZE, SIZE).transpose(0, 1)
        out = self.net(x)
        return self.F.nll_loss(out.reshape(-1, 10), y.reshape(-1), reduction="none").view(self.k, -1).mean(1)

    def _vmap_losses(self, x_bytes, y):
        return self.mapped(self.stacked, self.buffers, self.table[x_bytes.long()], y)

    def _body(self):
        losses = self.model_losses(self.x_bytes, self.y)
        losses.sum().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return losses

    def stage(self, x, y, idxs):
        """The K models' batches (idxs, one per model) into the device inputs."""
        self.stage_free.synchronize()
        for m, idx in enumerate(idxs):
            data.gather(x, y, idx, self.stage_x[m].numpy(), self.stage_y[m].numpy())
        self.x_bytes.copy_(self.stage_x, non_blocking=True)
        self.y.copy_(self.stage_y, non_blocking=True)
        self.stage_free.record()

    def capture(self):
        """Three warm-up steps on a side stream (the compile among them), then the step as one CUDA graph."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_losses = self._body()
        torch.cuda.synchronize()

    def step(self, x, y, idxs):
        self.stage(x, y, idxs)
        if self.graph is not None:
            self.graph.replay()
            return self.static_losses
        return self._body()


def check_designs(torch, ds, states, batch, lr, channels, hidden, steps: int = 3) -> dict:
    """Each design's per-model losses over `steps` eager steps against K separate torch models' (same weights,
    batches and rate), TF32 off (cuDNN's TF32 convolutions would differ by their own rounding): the largest
    absolute difference, per design."""
    tf32, torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.allow_tf32, False
    try:
        return _check_designs(torch, ds, states, batch, lr, channels, hidden, steps)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _check_designs(torch, ds, states, batch, lr, channels, hidden, steps) -> dict:
    dev = torch.device("cuda")
    orders = [data.epoch_order(len(ds.train_x), m, 0) for m in range(len(states))]
    idxs = [[order[i * batch : (i + 1) * batch] for order in orders] for i in range(steps)]
    table = byte_table(torch, dev)
    alone = []
    for m, s in enumerate(states):
        net = make_torch_model(channels, hidden).to(dev).train()
        net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in s.items()})
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        for i in range(steps):
            x = table[torch.from_numpy(ds.train_x[idxs[i][m]]).to(dev).long()]
            loss = torch.nn.functional.nll_loss(net(x), torch.from_numpy(ds.train_y[idxs[i][m]]).to(dev).long())
            loss.backward()
            opt.step()
            opt.zero_grad()
            alone.append((i, m, loss.item()))
    expected = np.zeros((steps, len(states)))
    for i, m, v in alone:
        expected[i, m] = v
    out = {}
    for design in ("grouped", "vmap"):
        try:
            side = TorchMany(torch, design, states, batch, lr, channels, hidden, False)
            got = np.array([side.step(ds.train_x, ds.train_y, idxs[i]).detach().cpu().numpy() for i in range(steps)])
            out[design] = float(np.abs(got - expected).max())
        except Exception as e:  # a design PyTorch cannot run here is reported, not fatal
            out[design] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return out


def time_rounds(step_round, synchronize, rounds: int, warmup: int) -> float:
    """Seconds per round of step_round(i) over `rounds` rounds after `warmup`, from the host's clock between
    two synchronisations (the K models' steps run on several streams: the wall clock is what they take)."""
    for i in range(warmup):
        step_round(i)
    synchronize()
    t0 = time.perf_counter()
    for i in range(warmup, warmup + rounds):
        step_round(i)
    synchronize()
    return (time.perf_counter() - t0) / rounds
