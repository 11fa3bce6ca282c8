"""What the kernels and the machine can take. Every size a user gives (channels, fc1's width, a batch size, a
number of epochs or steps) is checked against these bounds before anything is allocated, so that a size too
large costs one line and exit status 2, not a MemoryError after minutes of swapping.

    the kernels   take element counts and offsets as 32-bit ints: no buffer of a net may hold more than
                  INDEX_LIMIT elements, and the nets hold batch x channels x 784 below it too (mnist_cuda.nets).
                  CUDA's grid has at most 65535 blocks in y and z, where the channel groups (MAX_CHANNELS)
                  and fc1's output tiles (MAX_HIDDEN) go. The step counter and a schedule's length are int32
                  on the GPU (MAX_STEPS).
    the host      draws the initial weights in float64 (reference.init_state_dict) beside the float32 state,
                  and a checkpoint's copies beside those (host_bytes): they must fit the memory the host has
                  available now.
    the GPU       holds the parameters, their gradients and momentum buffers and a net's buffers at its batch
                  size (device_buffers): they must fit the GPU's free memory, checked once the GPU is known
                  and before the first of them is allocated.

Each check returns None, or (flag, message) for the flag to blame; mnist_cuda.cli turns that into the usage
error. The caller says whom a problem with the model blames (Blame): the trainer's flags, whose values make
the model, or the argument that holds it (a checkpoint), whose model no flag changes.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from . import data, nets, reference
from .ops import bn_relu_pool, conv1_bn_relu_pool, conv2_implicit_gemm, head, linear_splitk

INDEX_LIMIT = 2**31 - 1
GRID_LIMIT = 65535  # CUDA's blocks in y and z
MAX_CHANNELS = GRID_LIMIT * bn_relu_pool.BN_CHANNELS  # BatchNorm's channel groups go in y
MAX_HIDDEN = GRID_LIMIT * linear_splitk.TILE  # fc1's weight gradient puts its output tiles in y
MAX_BATCH = max(data.TRAIN_SAMPLES.values())  # a training batch is at most the training set
MAX_STEPS = 2**31 - 1  # the step counter on the GPU is int32
MAX_TIMED = 100_000  # timed steps, replays or windows of a measurement: each keeps an event or a sample on the host
MAX_SECONDS = 600  # a warm-up of at most ten minutes
MAX_BLOCK_THREADS = 1024  # CUDA's threads per block
# bytes of host memory per parameter: the float32 state, a checkpoint's copy of it and of the momentum buffers,
# with a layer's float64 draw beside them (reference.init_state_dict)
HOST_BYTES_PER_PARAMETER = 12
HOST_BYTES_FIXED = 256 << 20  # the data set (as bytes, pinned and not), the interpreter and its libraries
DEFAULT_CHANNELS, DEFAULT_HIDDEN = (32, 64), 128  # training.DEFAULTS' model, the yardstick of what is unusual


def _count(n: int) -> str:
    return f"{n:,}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _model_flag(channels, hidden) -> str:
    """The flag to blame for a model too large: the one further from its default."""
    return "--hidden" if hidden / DEFAULT_HIDDEN >= max(channels) / max(DEFAULT_CHANNELS) else "--channels"


class Blame(NamedTuple):
    """Whom a problem with the model blames, and how its message names the model. The trainer's (flag None):
    --channels or --hidden, whichever is further from its default, the model named by those flags. A command
    that reads the model from a file (evaluate's and predict's CHECKPOINT): that argument, the model named
    `what` (channels C1,C2, hidden H), as no flag of that command changes it."""

    flag: str | None = None
    what: str = ""

    def model_flag(self, channels, hidden) -> str:
        return self.flag or _model_flag(channels, hidden)

    def model(self, channels, hidden) -> str:
        c1, c2 = channels
        if self.flag is None:
            return f"--channels {c1},{c2} --hidden {hidden}"
        return f"{self.what} (channels {c1},{c2}, hidden {hidden})"


FLAGS = Blame()
CHECKPOINT = Blame("CHECKPOINT", "the checkpoint's model")


def model_problem(channels, hidden, blame: Blame = FLAGS):
    """What the kernels cannot take about a model of `channels` (conv1, conv2) and `hidden` (fc1's width).
    The trainer's message names the flag's value; another's names the model (blame.model)."""
    c1, c2 = channels
    model = blame.model(channels, hidden)
    say = lambda flag, ours, theirs: (flag, ours) if blame.flag is None else (blame.flag, theirs)
    indexing = f"more than the kernels' 32-bit indexing takes ({_count(INDEX_LIMIT)})"
    if max(channels) > MAX_CHANNELS:
        why = (
            f"more than the kernels take (at most {MAX_CHANNELS:,}: BatchNorm's groups of "
            f"{bn_relu_pool.BN_CHANNELS} channels fill at most {GRID_LIMIT} rows of CUDA's grid)"
        )
        return say(
            "--channels", f"{max(channels):,} channels are {why}", f"{model} has {max(channels):,} channels, {why}"
        )
    if hidden > MAX_HIDDEN:
        why = (
            f"more than the kernels take (at most {MAX_HIDDEN:,}: fc1's weight gradient in tiles of "
            f"{linear_splitk.TILE} outputs fills at most {GRID_LIMIT} rows of CUDA's grid)"
        )
        return say("--hidden", f"{hidden:,} is {why}", f"{model} has {hidden:,} units in fc1, {why}")
    if c1 * c2 * 9 > INDEX_LIMIT:
        weight = f"conv2's weight {c2:,} x {c1:,} x 9 = {_count(c1 * c2 * 9)} values, {indexing}"
        return say("--channels", f"{c1},{c2} make {weight}", f"{model} makes {weight}")
    features = c2 * (data.IMAGE_SIZE // 4) ** 2
    if hidden * features > INDEX_LIMIT:
        weight = f"fc1's weight {hidden:,} x {features:,} = {_count(hidden * features)} values, {indexing}"
        return say(
            _model_flag(channels, hidden),
            f"--hidden {hidden:,} with conv2's {c2:,} channels makes {weight}: "
            f"at most --hidden {INDEX_LIMIT // features:,} with these channels",
            f"{model} makes {weight}",
        )
    total = parameter_count(channels, hidden)
    if total > INDEX_LIMIT:
        parameters = f"{_count(total)} parameters, more than the kernels' 32-bit indexing takes"
        return say(_model_flag(channels, hidden), f"{model} make {parameters}", f"{model} has {parameters}")
    return None


def parameter_count(channels, hidden) -> int:
    return sum(math.prod(shape) for shape in reference.param_shapes(tuple(channels), hidden).values())


def batch_problem(
    channels,
    hidden,
    batch: int,
    flag: str = "--batch-size",
    kernels=("naive", "fast"),
    sms: int = 1,
    blame: Blame = FLAGS,
):
    """What the kernels cannot take about a batch of `batch` images through the model (channels, hidden) with
    each of `kernels`: every buffer must stay within the 32-bit indexing. sms: the GPU's SMs, where some
    buffers hold a part per SM (1 before the GPU is known: the least any GPU has)."""
    if batch > MAX_BATCH:
        return flag, f"{batch:,} is larger than any training set ({MAX_BATCH:,} samples)"
    for name, elements in index_extents(channels, hidden, batch, kernels, sms).items():
        if elements > INDEX_LIMIT:
            fits = lambda c, h: _indexable(c, h, batch, kernels, sms)
            return _blame(channels, hidden, flag, fits, blame), (
                f"batch {batch:,} with {blame.model(channels, hidden)} needs {name} of "
                f"{_count(elements)} values, more than the kernels' 32-bit indexing takes ({_count(INDEX_LIMIT)}): "
                f"at most batch {largest_batch(channels, hidden, kernels, sms):,} with this model"
            )
    return None


def index_extents(channels, hidden, batch: int, kernels, sms: int) -> dict[str, int]:
    """{what: elements} of everything the kernels index with 32-bit ints for a batch through the model: each
    buffer of the nets of `kernels` (device_buffers), and the extent the nets hold every activation to,
    batch x channels x 784 for the larger layer's channels (mnist_cuda.nets)."""
    extents = {"an activation (batch x channels x 784)": batch * max(channels) * data.IMAGE_SIZE**2}
    for version in kernels:
        extents.update(
            {
                f"a buffer ({name})": elements
                for name, (elements, _, _) in device_buffers(channels, hidden, batch, version, sms).items()
            }
        )
    return extents


def _indexable(channels, hidden, batch: int, kernels, sms: int) -> bool:
    return all(e <= INDEX_LIMIT for e in index_extents(channels, hidden, batch, kernels, sms).values())


def _blame(channels, hidden, flag: str, fits, blame: Blame) -> str:
    """A batch too large for a model is the batch size's fault where the default model does not fit at that
    batch either (fits(channels, hidden) is False), else the model's."""
    return flag if not fits(DEFAULT_CHANNELS, DEFAULT_HIDDEN) else blame.model_flag(channels, hidden)


def largest_batch(channels, hidden, kernels=("naive", "fast"), sms: int = 1) -> int:
    """The largest batch whose buffers the 32-bit indexing takes (a bisection: every size grows with the batch)."""
    low, high = 0, MAX_BATCH
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _indexable(channels, hidden, mid, kernels, sms) else (low, mid - 1)
    return low


def steps_problem(start_step: int, steps: int, flag: str, per_epoch: int | None = None):
    """A run of `steps` more steps after `start_step`: the step counter on the GPU is int32."""
    if start_step + steps <= MAX_STEPS:
        return None
    room = MAX_STEPS - start_step
    most = f"at most {room // per_epoch:,} epochs of {per_epoch:,} steps" if per_epoch else f"at most {room:,} steps"
    return flag, (
        f"{_count(steps)} steps from step {start_step:,} pass the GPU's 32-bit step counter "
        f"({_count(MAX_STEPS)}): {most}"
    )


def host_bytes(channels, hidden) -> int:
    """Host memory a run takes at most: the state and its copies, the largest layer drawn in float64, the rest."""
    shapes = reference.param_shapes(tuple(channels), hidden)
    largest = max(math.prod(s) for s in shapes.values())
    return HOST_BYTES_PER_PARAMETER * parameter_count(channels, hidden) + 8 * largest + HOST_BYTES_FIXED


def available_host_bytes() -> int | None:
    """The memory the host can give now without swapping (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def host_problem(channels, hidden, available: int | None = None):
    """A model whose weights do not fit the host's available memory."""
    available = available_host_bytes() if available is None else available
    need = host_bytes(channels, hidden)
    if available is None or need <= available:
        return None
    return _model_flag(channels, hidden), (
        f"--channels {channels[0]},{channels[1]} --hidden {hidden} make a model of "
        f"{_count(parameter_count(channels, hidden))} parameters, which needs about {_gb(need)} of host memory to "
        f"initialise and save; this machine has {_gb(available)} available"
    )


def device_buffers(
    channels,
    hidden,
    batch: int,
    kernels: str,
    sms: int,
    precision: str = "fp32",
    momentum: bool = True,
    augment: bool = True,
) -> dict[str, tuple[int, int, int]]:
    """{name: (elements, bytes per element, buffers of that size)} of what a step allocates on the GPU for a
    net of `kernels` at `batch` on a GPU of `sms` SMs: the parameters' flat buffers and a net's buffers as
    mnist_cuda.nets allocates them, and the step runner's input buffers (mnist_cuda.step)."""
    c1, c2 = channels
    B, H, S1, S2, S3 = batch, hidden, data.IMAGE_SIZE**2, (data.IMAGE_SIZE // 2) ** 2, (data.IMAGE_SIZE // 4) ** 2
    F, P = c2 * S3, parameter_count(channels, hidden) + 3 * 10  # each view starts on a multiple of 4 floats
    out = {
        "parameters and gradients": (P, 4, 2 + momentum),
        "batch inputs": (B * (S1 + 6), 1, 2),
        # the loss log, the logits and their gradient, each channel's statistics and counters, conv1's image
        # moments (float64: two floats each)
        "the loss log and the small buffers": (
            nets.LOSS_CAPACITY + 2 * B * 10 + 8 * (c1 + c2) + 16 + 2 * (sms + 2) * conv1_bn_relu_pool.CONV1_MOMENTS,
            4,
            1,
        ),
    }
    if augment:
        out["shifted images"] = (B * S1, 1, 2)
    if kernels == "naive":
        out.update(
            {
                "conv1's activations": (B * c1 * S1, 4, 6),
                "block 1's pooled output": (B * c1 * S2, 5, 1),
                "conv2's activations": (B * c2 * S2, 4, 6),
                "conv2's input gradient": (B * c1 * S2, 4, 1),
                "block 2's pooled output": (B * c2 * S3, 5, 1),
                "fc1's activations": (B * H, 4, 4),
                "fc1's input gradient": (B * F, 4, 1),
                "the images": (B * S1, 4, 1),
            }
        )
        return out
    quads = max(
        conv2_implicit_gemm.weight_quads(a, b, precision, product(B, precision))
        for a, b, product in (
            (c1, c2, conv2_implicit_gemm.forward_product),
            (c2, c1, conv2_implicit_gemm.input_grad_product),
        )
    )
    out.update(
        {
            # as bf16 in bf16: conv2's input and its gradient
            "block 1's pooled output": (B * c1 * S2, conv2_implicit_gemm.stored_dtype(precision).itemsize, 1),
            "conv2's input gradient": (B * c1 * S2, conv2_implicit_gemm.stored_dtype(precision).itemsize, 1),
            "block 1's pooling choices": (B * c1 * S2, 1, 1),
            "conv1's sums": (sms * c1 * conv1_bn_relu_pool.CONV1_GRAD_SUMS, 4, 1),
            # and its gradient, as bf16 in bf16
            "conv2's output": (B * c2 * S2, conv2_implicit_gemm.stored_dtype(precision).itemsize, 2),
            "BatchNorm 2's partial sums": (bn_relu_pool.partial_size(c2), 4, 1),
            "conv2's output moments per part": (
                conv2_implicit_gemm.moment_parts_size(c2, B, conv2_implicit_gemm.moment_source(B, precision)),
                4,
                1,
            ),
            # as bf16 in bf16: fc1's input, and conv2's output at each window's position
            "block 2's pooled output": (B * c2 * S3, linear_splitk.input_dtype(precision).itemsize, 1),
            "block 2's a at each window's position": (
                B * c2 * S3,
                conv2_implicit_gemm.stored_dtype(precision).itemsize,
                1,
            ),
            "block 2's pooling choices": (B * c2 * S3, 1, 1),
            "conv2's weight-gradient parts": (sms * c1 * c2 * 9, 4, 1),
            # conv2's input and its output's gradient in the weight gradient's layout, where the step writes them
            "conv2's input and output gradient in the weight gradient's layout": (
                sum(conv2_implicit_gemm.weight_grad_layout_size(B, c, precision) for c in (c1, c2))
                if conv2_implicit_gemm.weight_grad_from_layout(B, precision)
                else 0,
                conv2_implicit_gemm.stored_dtype(precision).itemsize,
                1,
            ),
            "conv2's staged weights": (4 * quads, 4, 2),
            "fc1's activations": (B * H, 4, 1),
            # as bf16 in bf16 from linear_splitk's threshold: the gradient at fc1's pre-activation and fc1's weight copy
            "the gradient at fc1's pre-activation": (B * H, linear_splitk.operand_dtype(precision, B).itemsize, 1),
            "fc1's weight copy": (H * F if linear_splitk.operand_dtype(precision, B).itemsize == 2 else 0, 2, 1),
            "fc1's input gradient": (B * F, linear_splitk.input_dtype(precision).itemsize, 1),
            "fc1's partial sums": (linear_splitk.forward_partial_size(B, F, H), 4, 1),
            "fc1's weight-gradient parts": (linear_splitk.weight_partial_size(B, F, H), 4, 1),
            "the head's partial sums": (head.partial_size(B, H), 4, 1),
        }
    )
    return out


def device_bytes(*args, **kwargs) -> int:
    return sum(elements * size * copies for elements, size, copies in device_buffers(*args, **kwargs).values())


def device_problem(
    channels,
    hidden,
    batch: int,
    kernels: str,
    precision: str,
    momentum: bool,
    augment: bool,
    free_bytes: int,
    sms: int,
    flag: str = "--batch-size",
    blame: Blame = FLAGS,
):
    """A net that does not fit the GPU's free memory, or has a buffer of a part per SM that passes the 32-bit
    indexing on this GPU of `sms` SMs."""
    problem = batch_problem(channels, hidden, batch, flag, (kernels,), sms, blame)
    if problem:
        return problem
    need = device_bytes(channels, hidden, batch, kernels, sms, precision, momentum, augment)
    if need <= free_bytes:
        return None
    fits = lambda c, h: device_bytes(c, h, batch, kernels, sms, precision, momentum, augment) <= free_bytes
    return _blame(channels, hidden, flag, fits, blame), (
        f"batch {batch:,} with {blame.model(channels, hidden)} ({kernels} kernels) needs "
        f"about {_gb(need)} of GPU memory; the GPU has {_gb(free_bytes)} free"
    )


def stacked_blocks_z(channels, batch: int) -> int:
    """The most blocks a launch for several models gives each model in its grid's z (which holds models x these):
    fc1's splits of its forward (over its inputs) and of its weight gradient (over the batch), at most
    linear_splitk.max_splits of each, and conv2's weight gradient's groups of input channels."""
    c1, c2 = channels
    features = c2 * (data.IMAGE_SIZE // 4) ** 2
    wgrad_groups = math.ceil(c1 / conv2_implicit_gemm.WGRAD_CHANNELS)
    return max(linear_splitk.max_splits(features), linear_splitk.max_splits(batch), wgrad_groups)


def _stacked_activation(count: int, channels, batch: int) -> int:
    return count * batch * max(channels) * data.IMAGE_SIZE**2


def most_stacked_models(channels, batch: int, at_most: int) -> int:
    """The most models, up to at_most, of `batch` images each that step together (nets.ModelsNet): their batches
    are one batch to the kernels, whose activations must stay within the 32-bit indexing, and each launch's z
    holds the models times each model's blocks there (stacked_blocks_z). Each model's own buffers are reached at a
    64-bit offset (model_part in kernels/include/common.cuh), and each passed the single run's checks."""
    by_index = INDEX_LIMIT // _stacked_activation(1, channels, batch)
    return min(at_most, by_index, GRID_LIMIT // stacked_blocks_z(channels, batch))


def stacked_problem(count: int, channels, batch: int, flag: str):
    """count models stepped together past what most_stacked_models allows: why, and the most that step together."""
    most = most_stacked_models(channels, batch, count)
    if count == 1 or most >= count:
        return None
    activation, z = _stacked_activation(count, channels, batch), stacked_blocks_z(channels, batch)
    if activation > INDEX_LIMIT:
        why = (
            f"an activation (batch x channels x 784) of {_count(activation)} values exceeds the kernels' 32-bit "
            f"indexing ({_count(INDEX_LIMIT)})"
        )
    else:
        why = (
            f"a launch would put up to {count * z:,} blocks in its grid's z (each model's fc1 splits or conv2 "
            f"weight-gradient groups, up to {z}, times the models), more than CUDA's {GRID_LIMIT:,}"
        )
    return flag, (
        f"{count:,} models at batch {batch:,} step as one batch of {count * batch:,} images, and {why}: at most "
        f"{most:,} models at this batch step together"
    )


def models_problem(count: int, each: int, free_bytes: int, flag: str, batch: int):
    """count models of `each` bytes of GPU memory that do not fit its free memory: the most that fit."""
    if count * each <= free_bytes:
        return None
    return flag, (
        f"{count:,} models at batch {batch:,} need about {_gb(count * each)} of GPU memory ({_gb(each)} each); the GPU "
        f"has {_gb(free_bytes)} free, which holds at most {free_bytes // each:,} of them"
    )
