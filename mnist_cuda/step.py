"""The one step runner: train, compare, the tests and the dev/ programs all drive a net through it.

A step = load (one host-to-device copy of the batch's bytes and labels, then the net's work on the images
alone) -> forward (+ loss) -> backward -> update -> zero-grad, launched on the runner's stream; nothing waits
for the host unless a caller reads the losses. Three ways to run it:

    "graph"    the whole step as one CUDA graph (one per input slot), replayed per batch. The graph also
               loads the *next* batch, staged one step ahead, into the other device input buffer on a
               branch of its own while it computes on this one (a batch copied right after the host wrote
               it is slow to copy, and at the head of the step nothing would overlap it).
    "eager"    the kernels launched one by one (with CUDA events between the phases, if given).
    "phases"   one graph per phase, replayed with CUDA events between them (per-phase timing).

Two pinned staging slots and two device input buffers (slot = step % 2): the host gathers a batch into
one slot while the GPU still copies from the other. Every launch goes through mnist_cuda.cuda, so a
profiler sees the step's kernels with cuda.launch_hook.
"""

from __future__ import annotations

import numpy as np

from . import cuda, data, nets, ops, optim
from .nets import SLOTS

PHASES = ("load", "forward", "backward", "update", "zero_grad")
MODES = ("graph", "eager", "phases")


class Step:
    """Runs training steps of `net` on its batch size with an optimizer: a learning rate (plain SGD), an
    optim.SGDOptions or an optim.Optimizer (its device state, e.g. restored from a checkpoint)."""

    def __init__(self, net, optimizer, mode: str = "graph", augment: int = 0, seed: int = 0, first_step: int = 0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
        self.cp = cp = net.cp
        if not isinstance(optimizer, (optim.Optimizer, optim.ModelsOptimizer)):
            options = optimizer if isinstance(optimizer, optim.SGDOptions) else optim.SGDOptions(float(optimizer))
            optimizer = optim.Optimizer(net.params, options)
        self.net, self.optimizer, self.mode = net, optimizer, mode
        # augment: each training image moved by up to this many pixels each way, the offsets drawn on the
        # host from (seed, step number) and copied with the batch; evaluation sees the images as they are
        self.augment, self.seed = augment, seed
        B = self.batch_size = net.images_per_step  # the images a step loads (of every model it steps)
        # One byte buffer holds a batch's images (uint8, as MNIST stores them: the kernels normalise) and
        # then its labels (int32; B * 784 bytes keep them aligned), on the host (pinned) and on the device,
        # so that the load is a single copy of a quarter of the float32 batch. x, y and stage_x, stage_y
        # are views into them, per slot.
        pixels = data.IMAGE_SIZE * data.IMAGE_SIZE
        labels_end = B * pixels + 4 * B
        size = labels_end + (2 * B if augment else 0)  # then each image's offset (dx, dy), int8
        self.batch = [cp.zeros(size, cp.uint8) for _ in range(SLOTS)]
        self.x = [b[: B * pixels].reshape(B, 1, data.IMAGE_SIZE, data.IMAGE_SIZE) for b in self.batch]
        self.y = [b[B * pixels : labels_end].view(cp.int32) for b in self.batch]
        self.stage = [cuda.pinned_empty((size,), np.uint8) for _ in range(SLOTS)]
        self.stage_x = [st[: B * pixels].reshape(B, 1, data.IMAGE_SIZE, data.IMAGE_SIZE) for st in self.stage]
        self.stage_y = [st[B * pixels : labels_end].view(np.int32) for st in self.stage]
        self.offsets = [b[labels_end:].view(cp.int8) for b in self.batch] if augment else None
        self.stage_offsets = [st[labels_end:].view(np.int8).reshape(B, 2) for st in self.stage] if augment else None
        self.shifted = [cp.empty_like(x) for x in self.x] if augment else None
        self.inputs = self.shifted if augment else self.x  # what a training step's forward reads
        for st in self.stage:
            st[...] = 0  # labels of unfilled rows (a partial last batch) stay valid class numbers
        self.stage_free = [cp.cuda.Event(disable_timing=True) for _ in range(SLOTS)]
        self.prefetch = cuda.SideStream(cp)  # the step graph's load of the next batch
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.correct = cp.zeros(1, cp.int32)
        self.graphs = self.phase_graphs = None
        self.prefetched_step = None  # the step whose batch the last graph loaded (any other step loads its own)
        self.count = first_step  # steps run (a resumed run counts on): the next step's slot is count % 2
        self.sources = nets.kernel_sources(getattr(net, "version", None))  # what this step launches from
        cuda.preload(self.sources)

    # ---- the phases ---------------------------------------------------------------------------

    def stage_batch(self, slot: int, x, y, idx, step: int) -> int:
        """Gather the samples idx of (x, y) for training step number `step` into pinned slot `slot`, once the
        GPU has stopped reading it (stage_free[slot]: recorded after whatever reads the slot), with their
        offsets when augmenting. Returns the batch length."""
        self.stage_free[slot].synchronize()
        if self.augment:
            rng = np.random.default_rng([self.seed, step])
            self.stage_offsets[slot][...] = rng.integers(
                -self.augment, self.augment + 1, self.stage_offsets[slot].shape
            )
        return data.gather(x, y, idx, self.stage_x[slot], self.stage_y[slot])

    def load(self, slot: int, n: int, train: bool = True):
        """Async copy of the batch staged in pinned slot `slot` into device input buffer `slot` (the whole
        buffer, even if n < B: one copy), the augmentation's shift of a training batch, then the net's work on
        its images."""
        rt, stream = self.cp.cuda.runtime, self.cp.cuda.get_current_stream().ptr
        src = self.stage[slot]
        rt.memcpyAsync(self.batch[slot].data.ptr, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, stream)
        if self.augment and train:
            ops.both.shift_images(self.x[slot], self.offsets[slot], self.shifted[slot], n)
        self.net.prepare_batch(self.inputs[slot] if train else self.x[slot], n, slot)

    def phases(self, slot: int):
        """The five phases of a training step on the batch staged in `slot`, as callables."""
        n, net = self.batch_size, self.net
        return (
            lambda: self.load(slot, n),
            lambda: net.forward(self.inputs[slot], self.y[slot], n, True, slot),
            lambda: net.backward(n),
            lambda: net.update(self.optimizer),
            net.zero_grad,
        )

    def capture_step(self, slot: int):
        """The whole step as one CUDA graph: forward, backward, update and zero-grad on device input buffer
        `slot`, and on a branch beside them the load of the next batch (pinned slot 1 - slot) into the other
        device buffer."""
        _, forward, backward, update, zero_grad = self.phases(slot)
        load_next = lambda: self.prefetch.run(lambda: self.load(1 - slot, self.batch_size))
        return cuda.capture(load_next, forward, backward, update, zero_grad, self.prefetch.join, sources=self.sources)

    # ---- one step -----------------------------------------------------------------------------

    def run(self, x, y, idx, next_idx=None, mode: str | None = None, events=None):
        """One training step on the samples idx of (x, y) (a full batch), in `mode` (default: the runner's).
        next_idx, the next step's samples where known, lets a graph step load them while it computes.
        events: len(PHASES) + 1 CUDA events to record the phase boundaries ("eager" and "phases")."""
        mode = mode or self.mode
        slot = self.count % SLOTS
        if mode == "graph":
            self._graph_step(slot, x, y, idx, next_idx)
        else:
            self.stage_batch(slot, x, y, idx, self.count)
            with self.stream:
                if events is not None:
                    events[0].record(self.stream)
                if mode == "phases":
                    if self.phase_graphs is None:
                        self.phase_graphs = [
                            [cuda.capture(ph, sources=self.sources) for ph in self.phases(s)] for s in range(SLOTS)
                        ]
                    work = [lambda g=g: g.launch(self.stream) for g in self.phase_graphs[slot]]
                else:
                    work = self.phases(slot)
                for k, phase in enumerate(work):
                    phase()
                    if events is not None:
                        events[k + 1].record(self.stream)
                self.stage_free[slot].record(self.stream)
        self.net.count_step()
        self.count += 1

    def _graph_step(self, slot, x, y, idx, next_idx):
        """Replay slot's step graph. The batch is on the device already if the step before prefetched it;
        otherwise it is staged and loaded here first. next_idx is staged now, for this graph to load."""
        if self.graphs is None:
            self.graphs = [self.capture_step(s) for s in range(SLOTS)]
        other, stream = 1 - slot, self.stream
        with stream:
            if self.prefetched_step != self.count:
                self.stage_batch(slot, x, y, idx, self.count)
                self.load(slot, self.batch_size)
                self.stage_free[slot].record(stream)
            if next_idx is not None:
                self.stage_batch(other, x, y, next_idx, self.count + 1)
            self.graphs[slot].launch(stream)
            self.stage_free[other].record(stream)  # the graph copied from the other slot
        self.prefetched_step = self.count + 1 if next_idx is not None else None

    def synchronize(self):
        self.stream.synchronize()

    def losses(self, reset: bool = False) -> np.ndarray:
        """The losses logged on the GPU since the last reset (synchronises the device)."""
        return self.net.losses(reset)

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, x, y) -> float:
        """Accuracy over every sample of (x, y), the last partial batch included, in evaluation mode (the
        running statistics), on the current stream; counted on the GPU."""
        self.correct.fill(0)
        self._eval_forward(x, y, lambda slot, n, start: self.net.count_correct(self.y[slot], self.correct, n))
        return int(self.correct.get()[0]) / len(x)

    def logits(self, x, y=None) -> np.ndarray:
        """The logits [N, classes] (float32, on the host) of every sample of x in evaluation mode, computed
        as evaluate() computes them. y: labels for the staging buffers (any valid classes; they do not
        change the logits)."""
        out = np.empty((len(x), self.net.logits.shape[1]), np.float32)
        y = np.zeros(len(x), np.int32) if y is None else y

        def copy(slot, n, start):
            out[start : start + n] = self.net.logits[:n].get()

        self._eval_forward(x, y, copy)
        return out

    def _eval_forward(self, x, y, after_forward):
        """The evaluation forward over (x, y) batch by batch; after_forward(slot, n, first sample) after each."""
        self.cp.cuda.runtime.deviceSynchronize()  # training may still run on the runner's stream
        for i, idx in enumerate(data.batch_indices(np.arange(len(x)), self.batch_size, drop_last=False)):
            slot = i % SLOTS
            self.stage_free[slot].synchronize()
            n = data.gather(x, y, idx, self.stage_x[slot], self.stage_y[slot])
            self.prefetched_step = None  # this overwrites a device input buffer
            self.load(slot, n, train=False)
            self.net.forward(self.x[slot], self.y[slot], n, False, slot)
            after_forward(slot, n, i * self.batch_size)
            self.stage_free[slot].record()


def phase_times_ms(event_lists) -> np.ndarray:
    """[steps, len(PHASES)] milliseconds from the events that Step.run recorded (waits for the last)."""
    if not event_lists:
        return np.zeros((0, len(PHASES)))
    event_lists[-1][-1].synchronize()
    cp = cuda.require_gpu()
    return np.array([[cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i in range(len(PHASES))] for ev in event_lists])
