"""docs/design.md's network in torch.nn with torch.optim.SGD, run as one candidate (compare.candidates).

The images arrive as bytes, as ours do, and are normalised in the step; the batch is gathered into a
pinned slot on the host and copied into static device buffers, so a captured whole-step graph replays on
each new batch. With SGD's options inside a graph the rate lives on the device: a table of the torch
scheduler's own rates, indexed by a step counter that the graph advances, so one graph serves every step.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import data, reference
from .candidates import CompileWatch


def scheduler_rates(torch, options, steps: int) -> list[float]:
    """The rate torch.optim.lr_scheduler gives each of `steps` steps, stepped as a training loop steps it."""
    opt, scheduler = options.torch_optimizer(torch, [torch.nn.Parameter(torch.zeros(1))])
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the dummy optimizer has no gradients to step)
        for _ in range(steps):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            if scheduler is not None:
                scheduler.step()
    return rates


def byte_table(torch, dev):
    """The network's input for each of the 256 byte values, (v/255 - MEAN)/STD on the GPU."""
    scale, mean, std = (torch.tensor(v, dtype=torch.float32, device=dev) for v in (255.0, data.MEAN, data.STD))
    return (torch.arange(256, dtype=torch.uint8, device=dev) / scale - mean) / std


class TorchSide:
    name = "torch"

    def __init__(
        self,
        torch,
        state,
        batch,
        candidate,
        channels,
        hidden,
        optimizer,
        *,
        bf16=False,
        augment=0,
        seed=0,
        log_losses=False,
    ):
        """optimizer: a learning rate (plain SGD, fused) or optim.SGDOptions (torch.optim.SGD with them and
        the matching scheduler). bf16: the forward and the loss under torch.autocast(dtype=torch.bfloat16)."""
        import torch.nn.functional as F

        from ..torch_model import make_torch_model

        self.torch, self.F, self.candidate, self.batch, self.bf16 = torch, F, candidate, batch, bf16
        dev = torch.device("cuda")
        self.net = make_torch_model(channels, hidden).to(dev)
        self.net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        if candidate.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.net.train()
        self._make_optimizer(optimizer, dev)
        self.forward_fn, self.compile_s, self.frames_compiled, self.watch = self.net, None, None, None
        if candidate.compiled:
            torch._dynamo.reset()  # compiled for this batch size alone: nothing of an earlier compile is reused
            mode = None if candidate.compile_mode == "default" else candidate.compile_mode
            self.forward_fn = torch.compile(self.net, mode=mode, dynamic=False)
        # the input's 256 possible values, normalised with divisions by (0-dim) tensors on the GPU (a
        # division by a Python number would be a multiplication by its reciprocal: other bits)
        self.table = byte_table(torch, dev)
        if not self._normalizes_exactly(dev):
            raise RuntimeError("torch's normalisation of the input bytes differs from data.normalize")
        self.x_bytes = torch.zeros((batch, 1, 28, 28), dtype=torch.uint8, device=dev)
        self.y = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.stage_x = [torch.empty((batch, 1, 28, 28), dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.stage_y = [torch.empty(batch, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.stage_free = [torch.cuda.Event() for _ in range(2)]
        self.loss_log = torch.zeros(1 << 16, device=dev) if log_losses else None  # parity only
        self.n_logged = 0
        self.graph = None
        self.i = 0
        # train's --augment: the offsets drawn as mnist_cuda.step.Step draws them (from seed and step), each
        # image moved on the GPU by a gather from the zero-padded batch
        self.augment, self.seed = augment, seed
        if augment:
            self.stage_offsets = [torch.empty((batch, 2), dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self.offsets = torch.zeros((batch, 2), dtype=torch.int64, device=dev)
            self.grid = torch.arange(data.IMAGE_SIZE, device=dev)
            if not self._shifts_exactly(dev):
                raise RuntimeError("torch's shift of the images differs from shift_images's")

    def _make_optimizer(self, optimizer, dev):
        """Plain SGD: fused, the rate a number. SGD's options: eagerly, torch's optimizer and its scheduler
        stepped on the host; in a graph, the rate on the device (_advance_rate)."""
        torch, params = self.torch, list(self.net.parameters())
        self.scheduler, self.rates, self.fused = None, None, False
        options = optimizer if not isinstance(optimizer, (int, float)) else None
        if options is None or options.plain:
            lr = float(optimizer) if options is None else options.lr
            try:
                self.opt, self.fused = torch.optim.SGD(params, lr=lr, fused=True), True
            except (TypeError, RuntimeError, ValueError):
                self.opt = torch.optim.SGD(params, lr=lr)
            return
        if not self.candidate.graph:
            self.opt, self.scheduler = options.torch_optimizer(torch, params)
            return
        if options.dampening:
            raise ValueError(
                "PyTorch's graph modes take SGD without dampening: its first step with dampening "
                "differs from the rest, and a captured graph has one path"
            )
        rates = scheduler_rates(torch, options, max(options.schedule.total, 1))
        self.rates = torch.tensor(rates, dtype=torch.float32, device=dev)
        self.lr = self.rates[0].clone()  # this step's rate, a 0-dim tensor the fused update reads
        self.counter = torch.zeros(1, dtype=torch.int64, device=dev)
        self.opt = torch.optim.SGD(
            params,
            lr=self.lr,
            momentum=options.momentum,
            nesterov=options.nesterov,
            weight_decay=options.weight_decay,
            fused=True,
        )
        self.fused = True
        if options.momentum:  # made now, zero: the first step then gives buffer = gradient, as PyTorch's first
            for p in params:  # step does (without dampening), and no step of the graph creates state
                self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)

    def _advance_rate(self):
        last = self.rates.numel() - 1
        self.lr.copy_(self.rates.index_select(0, self.counter.clamp(max=last)).reshape(()))
        self.counter += 1

    # ---- the step ---------------------------------------------------------------------------------------

    def _normalize(self, images):
        """(images/255 - MEAN)/STD in float32: the table of the 256 values, indexed (outside torch.compile in
        every mode: compiled, the arithmetic gives other bits (Triton's division))."""
        return self.table[images.long()]

    def _normalizes_exactly(self, dev):
        """The same bits as data.normalize (and our kernels) for all 256 byte values."""
        values = np.zeros((1, 1, 28, 28), dtype=np.uint8)
        values.flat[:256] = np.arange(256)
        got = self._normalize(self.torch.from_numpy(values).to(dev))
        return bool(np.array_equal(got.cpu().numpy(), data.normalize(values)))

    def _shift(self, images, offsets):
        """Each image moved by its (dx, dy): out[r, c] = images[r - dy, c - dx], 0 where that is outside."""
        a, size = self.augment, data.IMAGE_SIZE
        padded = self.F.pad(images, (a, a, a, a))
        rows = (self.grid[None, :] + a - offsets[:, 1:2])[:, :, None]
        cols = (self.grid[None, :] + a - offsets[:, 0:1])[:, None, :]
        batch = self.torch.arange(len(images), device=images.device)[:, None, None]
        return padded[batch, 0, rows, cols].view(len(images), 1, size, size)

    def _shifts_exactly(self, dev):
        """The same pixels as the numpy shift that checks our kernel, for every offset in range."""
        a, size, torch = self.augment, data.IMAGE_SIZE, self.torch
        offsets = np.array([(dx, dy) for dx in range(-a, a + 1) for dy in range(-a, a + 1)], np.int64)
        images = np.random.default_rng(0).integers(0, 256, (len(offsets), 1, size, size), dtype=np.uint8)
        got = self._shift(torch.from_numpy(images).to(dev), torch.from_numpy(offsets).to(dev)).cpu().numpy()
        return bool(np.array_equal(got, reference.shift_images(images, offsets)))

    def _loss(self):
        """normalise, forward + loss; with bf16 under autocast, its cache off (cast weights kept between
        steps would be stale inside a CUDA graph: PyTorch's advice for graphs)."""
        x = self._normalize(self._shift(self.x_bytes, self.offsets) if self.augment else self.x_bytes)
        if self.candidate.channels_last:
            x = x.contiguous(memory_format=self.torch.channels_last)
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            return self.F.nll_loss(self.forward_fn(x), self.y)

    def _body(self):
        """(the rate), normalise, forward + loss, backward, update, zero-grad (kept allocated, as in a graph)."""
        if self.rates is not None:
            self._advance_rate()
        loss = self._loss()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return loss

    def prepare(self, x, y, order):
        """Compile and capture before anything is timed (the compile time reported apart): three warm-up
        steps on a side stream, as torch.cuda.graph requires; a compiled candidate must compile in the first
        of them and never again (CompileWatch, also over the timed steps: check_no_recompile)."""
        torch, c = self.torch, self.candidate
        if not (c.graph or c.compiled):
            return
        idx = order[: self.batch]
        self.x_bytes.copy_(torch.from_numpy(x[idx]))
        self.y.copy_(torch.from_numpy(y[idx]))
        watch = CompileWatch(torch)
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body()
            torch.cuda.synchronize()
            self.frames_compiled, watch = watch.since(), CompileWatch(torch)
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if c.compiled:
            self.compile_s = time.perf_counter() - t0
            if not self.frames_compiled:
                raise RuntimeError("torch.compile compiled nothing in the first step")
        if c.graph:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_loss = self._body()
        torch.cuda.synchronize()
        watch.expect_none("the warm-up and the capture")
        self.watch_recompiles()

    def watch_recompiles(self):
        """From now on, until check_no_recompile: TorchDynamo's counters are the process's, so a watch spans
        only steps of this side, never another candidate's compile."""
        self.watch = CompileWatch(self.torch) if self.candidate.compiled else None

    def check_no_recompile(self, during: str):
        if self.watch is not None:
            self.watch.expect_none(during)

    def step(self, x, y, idx, mode=None, phase_events=None, next_idx=None):
        slot = self.i % 2
        self.stage_free[slot].synchronize()
        n = data.gather(x, y, idx, self.stage_x[slot].numpy(), self.stage_y[slot].numpy())
        assert n == self.batch
        if self.augment:
            rng = np.random.default_rng([self.seed, self.i])
            self.stage_offsets[slot].numpy()[...] = rng.integers(-self.augment, self.augment + 1, (self.batch, 2))
        rec = (lambda k: phase_events[k].record()) if phase_events else (lambda k: None)
        rec(0)
        self.x_bytes.copy_(self.stage_x[slot], non_blocking=True)
        self.y.copy_(self.stage_y[slot], non_blocking=True)
        if self.augment:
            self.offsets.copy_(self.stage_offsets[slot], non_blocking=True)
        self.stage_free[slot].record()
        rec(1)
        if self.graph is not None:
            self.graph.replay()
            loss = self.static_loss
        else:
            loss = self._loss()
            rec(2)
            loss.backward()
            rec(3)
            self.opt.step()
            if self.scheduler is not None:
                self.scheduler.step()
            rec(4)
            self.opt.zero_grad()  # PyTorch's default (set_to_none=True): its cheapest zero-grad
            rec(5)
        if self.loss_log is not None and self.n_logged < self.loss_log.numel():
            self.loss_log[self.n_logged].copy_(loss.detach(), non_blocking=True)
            self.n_logged += 1
        self.i += 1

    # ---- events, state ----------------------------------------------------------------------------------

    def new_event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def event(self):
        ev = self.new_event()
        ev.record()
        return ev

    def elapsed_ms(self, a, b):
        return a.elapsed_time(b)

    def synchronize(self):
        self.torch.cuda.synchronize()

    def restart(self, state, options, seed=0):
        """The weights of state and a fresh optimizer state, keeping what was compiled and captured (a
        recipe's seeds, timed without recompiling); seed draws the augmentation's offsets. In a graph the
        tensors it reads are refilled in place: the weights, zero momentum buffers, the step counter."""
        torch = self.torch
        self.seed, self.i = seed, 0
        torch.cuda.synchronize()
        self.net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        if self.rates is None:
            self.opt, self.scheduler = options.torch_optimizer(torch, self.net.parameters())
            return
        self.counter.zero_()
        for p in self.net.parameters():
            buf = self.opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                buf.zero_()

    def accuracy(self, x, y) -> float:
        """Test accuracy in evaluation mode, with the uncompiled model (a compiled one would recompile)."""
        torch, correct = self.torch, 0
        self.net.eval()
        with torch.no_grad():
            for start in range(0, len(x), 1000):
                images = torch.from_numpy(np.ascontiguousarray(x[start : start + 1000])).cuda()
                predicted = self.net(self._normalize(images)).argmax(dim=1).cpu().numpy()
                correct += int((predicted == y[start : start + 1000]).sum())
        self.net.train()
        return correct / len(x)

    def losses(self):
        out = self.loss_log[: self.n_logged].cpu().numpy()
        self.n_logged = 0
        return out

    def state_dict(self):
        return {k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}
