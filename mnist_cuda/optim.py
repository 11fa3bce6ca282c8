"""torch.optim.SGD's options and learning-rate schedules, on the GPU.

    SGDOptions   lr, momentum, dampening, nesterov, weight_decay and a Schedule, with PyTorch's semantics:
                 weight decay is added to the gradient, the momentum buffer takes the direction as it is on
                 its first step, Nesterov's step is d + momentum * buffer.
    Schedule     constant, step (StepLR), cosine (CosineAnnealingLR, eta_min 0) or onecycle (OneCycleLR
                 with anneal_strategy "cos" or "linear", its momentum not cycled), counted in steps.
    Optimizer    the device state: the momentum buffers (one flat buffer beside the parameters, the same
                 layout) and the step counter the rate is computed from. A step launches a one-thread kernel
                 that computes this step's rate from the counter (and advances it) and then the update, so a
                 captured step graph serves every step without host work.

Plain SGD at a constant rate (the default) keeps its own kernels with the rate as a launch argument, so
the default step computes exactly what it always did.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SCHEDULES = ("constant", "step", "cosine", "onecycle")
ANNEALS = ("cos", "linear")


@dataclasses.dataclass(frozen=True)
class Schedule:
    kind: str = "constant"
    total: int = 0  # steps: cosine's T_max, onecycle's total_steps
    step_size: int = 1  # step: steps between two decays
    gamma: float = 0.1  # step: the decay factor
    pct_start: float = 0.3  # onecycle: the share of the steps that warm up
    div_factor: float = 25.0  # onecycle: initial rate = lr / div_factor
    final_div_factor: float = 1e4  # onecycle: final rate = initial / final_div_factor
    anneal: str = "cos"  # onecycle: "cos" or "linear"

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r}; choose from {SCHEDULES}")
        if self.anneal not in ANNEALS:
            raise ValueError(f"unknown anneal strategy {self.anneal!r}; choose from {ANNEALS}")
        if self.kind in ("cosine", "onecycle") and self.total < 1:
            raise ValueError(f"the {self.kind} schedule needs its total number of steps")
        if self.kind == "onecycle" and not (0 < self.pct_start < 1 and self.pct_start * self.total >= 2):
            raise ValueError("onecycle needs 0 < pct_start < 1 and at least 2 warm-up steps")
        if self.kind == "step" and self.step_size < 1:
            raise ValueError("the step schedule needs step_size >= 1")

    def kernel_args(self, lr: float) -> tuple:
        """The arguments of the sgd_schedule kernel (kernels/include/sgd_options.cuh's LrSchedule)."""
        return (
            SCHEDULES.index(self.kind),
            lr,
            self.step_size,
            self.gamma,
            self.total,
            self.pct_start,
            self.div_factor,
            self.final_div_factor,
            int(self.anneal == "cos"),
        )

    def lr_at(self, lr: float, t: int) -> float:
        """The rate of step t (from 0) in double, as the kernel computes it (the tests' reference)."""
        if self.kind == "step":
            return lr * self.gamma ** (t // self.step_size)
        if self.kind == "cosine":
            return lr * (1 + math.cos(math.pi * t / self.total)) / 2
        if self.kind == "onecycle":
            initial = lr / self.div_factor
            minimum = initial / self.final_div_factor
            warm_end, end = self.pct_start * self.total - 1, self.total - 1

            def anneal(start, stop, pct):
                if self.anneal == "cos":
                    return stop + (start - stop) / 2 * (math.cos(math.pi * pct) + 1)
                return (stop - start) * pct + start

            if t <= warm_end:
                return anneal(initial, lr, t / warm_end)
            return anneal(lr, minimum, (t - warm_end) / (end - warm_end))
        return lr


@dataclasses.dataclass(frozen=True)
class SGDOptions:
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: Schedule = Schedule()

    def __post_init__(self):
        if not 0 <= self.momentum < 1 or self.dampening < 0 or self.weight_decay < 0:
            raise ValueError("momentum must be in [0, 1), dampening and weight decay >= 0")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum needs a momentum > 0 and zero dampening (as torch.optim.SGD)")

    @property
    def plain(self) -> bool:
        """p -= lr * g at a constant rate: the default, with kernels of its own."""
        return self.momentum == 0 and self.weight_decay == 0 and self.schedule.kind == "constant"

    def torch_optimizer(self, torch, parameters, **kw):
        """torch.optim.SGD and the matching scheduler (None for constant), for the comparison."""
        opt = torch.optim.SGD(
            parameters,
            lr=self.lr,
            momentum=self.momentum,
            dampening=self.dampening,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
            **kw,
        )
        s, sched = self.schedule, torch.optim.lr_scheduler
        if s.kind == "step":
            return opt, sched.StepLR(opt, step_size=s.step_size, gamma=s.gamma)
        if s.kind == "cosine":
            return opt, sched.CosineAnnealingLR(opt, T_max=s.total, eta_min=0.0)
        if s.kind == "onecycle":
            return opt, sched.OneCycleLR(
                opt,
                max_lr=self.lr,
                total_steps=s.total,
                pct_start=s.pct_start,
                anneal_strategy=s.anneal,
                cycle_momentum=False,
                div_factor=s.div_factor,
                final_div_factor=s.final_div_factor,
            )
        return opt, None


class Optimizer:
    """The device state of SGD with `options` for the parameters of a nets.Parameters: the momentum buffers
    and the step counter. start_step: the steps already taken (a resumed run); buffers: saved momentum
    buffers by parameter name (a resumed run), else they start on the first step as PyTorch's do."""

    def __init__(self, params, options: SGDOptions, start_step: int = 0, buffers: dict | None = None, buffer=None):
        """buffer: a zeroed flat buffer of the parameters' layout for the momentum buffers (ModelsOptimizer's
        stacked rows); default: its own."""
        cp = params.cp
        self.params, self.options = params, options
        if options.momentum:
            self.buffers = cp.zeros_like(params.params) if buffer is None else buffer
        else:
            self.buffers = None
        self.buffer_views = params.views(self.buffers) if self.buffers is not None else {}
        started = False
        if buffers and self.buffers is not None:
            for name, view in self.buffer_views.items():
                view.set(np.ascontiguousarray(buffers[name], dtype=np.float32))
            started = True
        self.state = cp.array([start_step, int(started)], dtype=cp.int32)  # steps taken, buffers started
        self.lr = cp.zeros(1, cp.float32)  # this step's rate
        self.first = cp.zeros(1, cp.int32)  # this step starts the buffers

    def schedule(self):
        """This step's rate and first-step flag, on the current stream (before the update kernel)."""
        from .ops import both

        both.sgd_schedule(self.state, self.lr, self.first, self.options.schedule.kernel_args(self.options.lr))

    def buffer_state(self) -> dict[str, np.ndarray]:
        """The momentum buffers by checkpoint name (MOMENTUM_PREFIX + parameter name); empty without momentum."""
        if self.buffers is None:
            return {}
        self.params.cp.cuda.runtime.deviceSynchronize()
        from .checkpoint import MOMENTUM_PREFIX

        return {MOMENTUM_PREFIX + k: v.get() for k, v in self.buffer_views.items()}

    def steps_taken(self) -> int:
        self.params.cp.cuda.runtime.deviceSynchronize()
        return int(self.state[0].get())


ARGUMENTS = (
    "momentum",
    "dampening",
    "nesterov",
    "weight_decay",
    "schedule",
    "step_size",
    "gamma",
    "pct_start",
    "anneal",
)
SCHEDULE_ARGUMENTS = ("step_size", "gamma", "pct_start", "anneal", "schedule_total")  # belong to one schedule
# The flags that act only beside another: given without it, such a flag would change nothing, and that is a
# usage error naming what it needs (the README's rule for every command).
NEEDS = {
    "dampening": ("--momentum > 0", lambda v: (v.get("momentum") or 0) > 0),
    "step_size": ("--schedule step", lambda v: v.get("schedule") == "step"),
    "gamma": ("--schedule step", lambda v: v.get("schedule") == "step"),
    "pct_start": ("--schedule onecycle", lambda v: v.get("schedule") == "onecycle"),
    "anneal": ("--schedule onecycle", lambda v: v.get("schedule") == "onecycle"),
}


def unused(values: dict, keys=None) -> str | None:
    """The first of `keys` (default: all of NEEDS) whose value is set in `values` but changes nothing beside
    the others, as a message naming what it needs; None where every one acts."""
    for key in NEEDS if keys is None else keys:
        if key in NEEDS and values.get(key) is not None:
            needs, acts = NEEDS[key]
            if not acts(values):
                return f"--{key.replace('_', '-')} needs {needs} (without it, it changes nothing)"
    return None


def options_from(values: dict, lr: float, total_steps: int) -> SGDOptions:
    """SGDOptions from the flags' values (None: the default); ValueError names what does not fit, or a value
    that would change nothing (unused)."""
    v = {k: values.get(k) for k in ARGUMENTS}
    kind = v["schedule"] or "constant"
    if kind == "step" and v["step_size"] is None:
        raise ValueError("--schedule step needs --step-size")
    problem = unused(v)
    if problem:
        raise ValueError(problem)
    schedule = Schedule(
        kind,
        total=total_steps,
        step_size=v["step_size"] or 1,
        gamma=0.1 if v["gamma"] is None else v["gamma"],
        pct_start=0.3 if v["pct_start"] is None else v["pct_start"],
        anneal=v["anneal"] or "cos",
    )
    return SGDOptions(
        lr,
        momentum=v["momentum"] or 0.0,
        dampening=v["dampening"] or 0.0,
        nesterov=bool(v["nesterov"]),
        weight_decay=v["weight_decay"] or 0.0,
        schedule=schedule,
    )


def describe(o: SGDOptions) -> dict:
    """The options as a checkpoint records them (options_from's values)."""
    s = o.schedule
    record = {
        "momentum": o.momentum,
        "dampening": o.dampening,
        "nesterov": o.nesterov,
        "weight_decay": o.weight_decay,
        "schedule": s.kind,
    }
    if s.kind == "step":
        record.update(step_size=s.step_size, gamma=s.gamma)
    if s.kind in ("cosine", "onecycle"):
        record["schedule_total"] = s.total
    if s.kind == "onecycle":
        record.update(pct_start=s.pct_start, anneal=s.anneal)
    return record


class ModelsOptimizer:
    """SGD for K models stacked (nets.Parameters.stacked) with each model's own options: each model an
    Optimizer whose momentum buffers, step counter, rate and first-step flag are rows of stacked device arrays,
    and the options as per-model device arrays, so one schedule launch and one update launch step all K
    (ops.both.sgd_schedule_models, ops.sgd_zero_grad.sgd_models_zero_grad), each model's numbers those of its
    Optimizer stepped alone."""

    def __init__(self, models, options: list[SGDOptions], start_step: int = 0, buffers: list | None = None):
        cp, K, size = models[0].cp, len(models), models[0].params.size
        self.cp, self.count, self.options = cp, K, options
        self.stacked_buffers = cp.zeros(K * size, cp.float32) if any(o.momentum for o in options) else None
        self.state, self.lr, self.first = cp.zeros((K, 2), cp.int32), cp.zeros(K, cp.float32), cp.zeros(K, cp.int32)
        self.optimizers = []
        for m, (params, o) in enumerate(zip(models, options)):
            row = self.stacked_buffers[m * size : (m + 1) * size] if self.stacked_buffers is not None else None
            opt = Optimizer(params, o, start_step, (buffers or [None] * K)[m], buffer=row)
            self.state[m] = opt.state
            opt.state, opt.lr, opt.first = self.state[m], self.lr[m : m + 1], self.first[m : m + 1]
            self.optimizers.append(opt)
        from .ops import both, sgd_zero_grad

        self.lr[...] = cp.asarray(sgd_zero_grad.initial_rates(options))  # the plain models' constant rates
        self.hyper = {k: cp.asarray(v) for k, v in sgd_zero_grad.model_hyperparameters(options).items()}
        rows = both.schedule_rows([None if o.plain else o.schedule.kernel_args(o.lr) for o in options])
        self.schedule_rows = cp.asarray(rows)
        self.scheduled = any(not o.plain for o in options)

    def step(self, params, grads):
        """This step's rates (the scheduled models'), then the update of every model, on the current stream."""
        from .ops import both, sgd_zero_grad

        if self.scheduled:
            both.sgd_schedule_models(self.state, self.lr, self.first, self.schedule_rows)
        buffers = self.stacked_buffers if self.stacked_buffers is not None else grads
        sgd_zero_grad.sgd_models_zero_grad(params, grads, buffers, self.lr, self.first, **self.hyper, models=self.count)
