"""The network on the GPU: its parameters in flat buffers, and the two kernel versions of its step.

    Parameters   every parameter in one flat float32 buffer and every gradient in another (each layer's
                 tensors are views), the BatchNorm running statistics; state_dict() / load_state_dict()
                 with torch's names, so a checkpoint moves between this, mnist_cuda.reference and torch.
    NaiveNet     the step as the plain kernels of kernels/naive/: one op per launch.
    FastNet      the step as the fused kernels of kernels/fast/, with side streams for the work nothing
                 reads until the update (a graph captures them as branches).
Both launch the kernels of kernels/both/ too: the augmentation's shift, the optimizer's schedule, the accuracy count.

A net holds the activations of one batch size, allocated once: a step allocates nothing. Its methods
launch on the current stream; mnist_cuda.step drives them (staging, loads, graphs, evaluation).

    parameters   Parameters
    base         the sizes and constants both nets use, and their shared base (the loss log, the accuracy count)
    naive_net    NaiveNet
    fast_net     FastNet
    models_net   ModelsNet: K models of FastNet's step, each kernel launched once for all K
This module holds make_net, the net of a kernel version, and kernel_sources, the sources a net launches from.
"""

from __future__ import annotations

from .. import cuda
from ..ops import both
from .base import CLASSES, EPS, KERNEL_VERSIONS, LOSS_CAPACITY, MOMENTUM, PRECISIONS, S1, S2, S3, SLOTS
from .fast_net import FastNet
from .models_net import ModelsNet
from .naive_net import NaiveNet
from .parameters import ALIGN, Parameters

__all__ = [
    "ALIGN",
    "CLASSES",
    "EPS",
    "KERNEL_VERSIONS",
    "LOSS_CAPACITY",
    "MOMENTUM",
    "PRECISIONS",
    "S1",
    "S2",
    "S3",
    "SLOTS",
    "FastNet",
    "ModelsNet",
    "NaiveNet",
    "Parameters",
    "kernel_sources",
    "make_net",
]


def kernel_sources(kernels: str | None) -> list[cuda.Source]:
    """The kernel sources a step and the evaluation of a net of `kernels` launch from, the ones
    mnist_cuda.cuda.preload compiles for it: its folder's (kernels/naive/ or kernels/fast/) and kernels/both/,
    the ones every net launches (the augmentation's shift, the optimizer's schedule, the accuracy count);
    every declared source for None."""
    if kernels is None:
        return cuda.sources()
    if kernels not in KERNEL_VERSIONS:
        raise ValueError(f"unknown kernel version {kernels!r}; choose from {KERNEL_VERSIONS}")
    own = [s for s in cuda.sources() if s.path.startswith(f"{kernels}/")]
    return list(dict.fromkeys(own + list(both.SOURCES)))


def make_net(params: Parameters, batch_size: int, kernels: str = "fast", precision: str = "fp32"):
    """The net of a kernel version ("naive" or "fast") at a precision of PRECISIONS (tf32 and bf16: fast only)."""
    if kernels not in KERNEL_VERSIONS:
        raise ValueError(f"unknown kernel version {kernels!r}; choose from {KERNEL_VERSIONS}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
    if kernels == "naive":
        if precision != "fp32":
            raise ValueError(f"{precision} needs the fast kernels (the naive ones compute in plain fp32)")
        return NaiveNet(params, batch_size)
    return FastNet(params, batch_size, precision)
