"""How both sides are timed: per phase (events between the phases, one synchronisation per step), as
whole-step loops (no synchronisation inside, a timing event every few steps) and as one epoch's wall clock.

A side is anything with step(x, y, idx, mode, phase_events=None, next_idx=None), event(), new_event(),
elapsed_ms(a, b) and synchronize(): compare.ours.OurSide and compare.torch_side.TorchSide.
"""

from __future__ import annotations

import time

import numpy as np

from .. import data
from ..step import PHASES


def summarize_ms(samples_ms) -> dict:
    """{median_us, mean_us, n} of a list of milliseconds."""
    a = np.asarray(samples_ms, dtype=np.float64) * 1000.0
    return {"median_us": float(np.median(a)), "mean_us": float(a.mean()), "n": int(a.size)}


def batches(order, batch, count):
    """count batches of indices, cycling through epochs of `order` (seeded reshuffles)."""
    out, n, epoch = [], len(order), 0
    while len(out) < count:
        perm = order if epoch == 0 else np.random.default_rng([epoch, 7]).permutation(n)
        out += list(data.batch_indices(perm, batch, drop_last=True))
        epoch += 1
    return out[:count]


def measure_phases(side, x, y, order, warmup, steps, mode="eager"):
    """Per-phase times: six events per step, one synchronisation per step."""
    idxs = batches(order, side.batch, warmup + steps)
    samples = []
    for i, idx in enumerate(idxs):
        events = [side.new_event() for _ in range(len(PHASES) + 1)]
        side.step(x, y, idx, mode, phase_events=events)
        side.synchronize()
        if i >= warmup:
            samples.append([side.elapsed_ms(events[k], events[k + 1]) for k in range(len(PHASES))])
    a = np.asarray(samples)
    out = {ph: summarize_ms(a[:, k]) for k, ph in enumerate(PHASES)}
    out["step"] = summarize_ms(a.sum(axis=1))
    return out


def measure_loop(side, x, y, order, warmup, steps, mode, window=1, warmup_s=0.0, clock=time.perf_counter):
    """Whole-step times of a loop with no synchronisation inside: a timing event every `window` steps
    (steps // window windows); each window's mean step is one sample of the median. Untimed first: at
    least `warmup` steps and `warmup_s` seconds of them (on the first `warmup` batches, cycled): under a
    light load the GPU's clocks settle over about a second (docs/performance.md, section 5). Each step is
    handed the batch the one before prefetched (next_idx)."""
    windows = max(1, steps // window)
    steps = windows * window
    idxs = batches(order, side.batch, warmup + steps + 1)
    warm = idxs[: max(warmup, 1)]
    side.synchronize()
    t0, j = clock(), 0
    while j < warmup or clock() - t0 < warmup_s:
        side.step(x, y, warm[j % len(warm)], mode, next_idx=warm[(j + 1) % len(warm)])
        j += 1
    timed = [warm[j % len(warm)]] + idxs[warmup + 1 :] if j else idxs  # (starting with the batch prefetched last)
    side.synchronize()
    marks = [side.event()]
    for i in range(steps):
        side.step(x, y, timed[i], mode, next_idx=timed[i + 1])
        if (i + 1) % window == 0:
            marks.append(side.event())
    side.synchronize()
    per_step = [side.elapsed_ms(a, b) / window for a, b in zip(marks, marks[1:])]
    out = summarize_ms(per_step)
    out["mean_us"] = side.elapsed_ms(marks[0], marks[-1]) * 1000.0 / steps
    out["window_steps"] = window
    return out


def measure_epoch(side, x, y, seed, mode):
    """Wall clock of one epoch: shuffle, gather, load and every step, until the GPU is done."""
    side.synchronize()
    t0 = time.perf_counter()
    order = data.epoch_order(len(x), seed, 1)
    idxs = list(data.batch_indices(order, side.batch, drop_last=True))
    for idx, next_idx in data.with_next(idxs):
        side.step(x, y, idx, mode, next_idx=next_idx)
    side.synchronize()
    return time.perf_counter() - t0
