"""The launch contracts of kernels/fast/2_conv2_implicit_gemm.cu: conv2's weight staging and its three
products (forward, input gradient, weight gradient) on the tensor cores, for 14x14 images.

precision: "fp32" keeps float32's accuracy (3xTF32: each operand split into two TF32 parts, three tensor-core
products); "tf32" rounds both operands to TF32 and multiplies once (--precision tf32), as cuDNN's TF32
convolutions do; "bf16" rounds them to bf16 and multiplies once, 16 k per instruction (--precision bf16),
as torch.autocast with bfloat16 does. Every precision accumulates in float32. In "bf16", conv2's input x (of the
forward and the weight gradient), its output y, y's gradient dy (of both gradients) and x's gradient dx (the input
gradient's output, conv1's backward's input) are stored as bf16 too, as autocast stores them (stored_dtype: uint16
arrays of bf16 bits).

models: K models stepped by one launch (common.cuh): n is one model's batch, and every buffer holds the K models'
parts one after another: images [K][n][...], staged weights [K][weight_quads] (shaped (K * weight_quads, 4) or
(K, weight_quads, 4)), the weight gradient's partial results [K][parts][c_out * c_in * 9]; conv2.weight of model m
at +m * param_stride floats. The forms (forward_product, input_grad_product) are chosen from n, as for one model,
so that each model's results are those of a launch for it alone, bit for bit."""

from __future__ import annotations

import functools

from ..cuda import ceil_div, shared_memory_per_block, shared_memory_per_sm, sm_count
from .bn_relu_pool import FROM_PARTS_MAX
from .common import I32, NULL, activation_dtype, check_stored, precision_kernels, source

# the kernels' Precision template argument for each of the step's precisions (nets.PRECISIONS)
KERNEL_PRECISION = {"fp32": "Precision::Fp32", "tf32": "Precision::Tf32", "bf16": "Precision::Bf16"}
CONV2_SIZE = 14
# forward and input gradient: a block computes CONV_TILE_CHANNELS output channels (the forward; the input
# gradient in tf32 and bf16) or CONV_TILE_CHANNELS_STACKED (the input gradient in fp32, in both its forms, and
# "forward_stacked") of CONV_ROWS image rows, one warpgroup of CONV_THREADS threads; the input passes through
# shared memory CONV_CHUNK channels at a time (twice as many in bf16: 8 values in 16 bytes; CONV_STAGED_PIXELS
# pixels of each), with CONV_CHUNK_QUADS weight quads of 16 bytes per chunk and 64 rows of A per tap (the forward
# in fp32 has 128: both parts of 64 channels, apart)
CONV_THREADS, CONV_TILE_CHANNELS, CONV_TILE_CHANNELS_STACKED = 128, 64, 32
CONV_CHUNK, CONV_ROWS = 8, 7
# derived as 2_conv2_tile_forms.cuh derives them (its static_asserts check the -D values against the geometry):
# CONV_ROWS + 2 padded rows of CONV2_SIZE + 2 pixels and 2 more; 9 taps x 2 quads x 64 rows of A
CONV_STAGED_PIXELS = (CONV_ROWS + 2) * (CONV2_SIZE + 2) + 2
CONV_CHUNK_QUADS = 9 * 2 * 64
IMAGE_TILE_PRODUCTS = ("forward", "forward_stacked", "backward_input", "backward_input_paired")
# In fp32 the forward keeps the weights' two TF32 parts apart: 64 output channels per block, three products per
# k-step. Up to this batch it stacks them as the input gradient does: 32 channels per block, two products per
# k-step (a quarter of that tensor work is the unneeded small*small), but twice the blocks, where 64 channels
# per block leave SMs idle (docs/performance.md)
STACKED_FORWARD_MAX_BATCH = 96
# In fp32 the input gradient takes the paired form from this batch on: a sixth less tensor work and fewer operand
# bytes read from shared memory, but three blocks per SM instead of four; below it the step measured the same or
# slower (docs/performance.md)
PAIRED_INPUT_GRAD_MIN_BATCH = 2048
# The forward's persistent form (one model): in plain TF32 and bf16 each block runs many tiles' chunks as one stream,
# PERSISTENT_BLOCKS_PER_SM blocks to an SM (the kernel's launch bounds), the output through shared memory of its own,
# 32 rows of a tile at a time. It pays from PERSISTENT_FORWARD_MIN_BATCH images on, where each block has enough
# tiles to hide its first one's loads behind (docs/performance.md)
PERSISTENT_PRECISIONS = ("tf32", "bf16", "fp32")
PERSISTENT_BLOCKS_PER_SM = 3
PERSISTENT_OUTPUT_BYTES = 32 * (CONV_ROWS * (CONV2_SIZE + 2) + 8) * 4  # 32 rows of the tile's columns and 8 more
# With BN2's statistics (forward's moment_parts), each block's (mean, M2) per channel: at most this many blocks, as
# many as bn_relu_pool.stats_from_parts merges
MOMENT_PARTS_MAX = FROM_PARTS_MAX
PERSISTENT_FORWARD_MIN_BATCH = 1024
# In fp32 the forward's persistent form is a block per SM of two warpgroups, each running its own tiles, with every
# chunk's weights resident in shared memory (the warpgroup pair, conv2_forward_warpgroup_pair_fast): no weights' refill
# between chunks, and one warpgroup's output stored while the other multiplies. The step's form adds a producer
# warpgroup for each, which stages its chunks (conv2_forward_warp_specialized_fast): the same tiles, shared memory and
# bits. Both take the weights of ceil(c_in / CONV_CHUNK) chunks and two image buffers and an output region per
# warpgroup, so they fit the network's 32 input channels (215.5 KB) but not many more; from PAIR_FORWARD_MIN_BATCH
# images on the step's runs where it fits (alone the pair measured the same as a block per tile at 512 and slower at
# 64: docs/performance.md). forward(persistent=...) takes either by name (FP32_PERSISTENT_FORMS, the step's first).
PAIR_THREADS = 2 * CONV_THREADS
WARP_SPECIALIZED_THREADS = 4 * CONV_THREADS
FP32_PERSISTENT_FORMS = ("warp_specialized", "pair")
PAIR_FORWARD_MIN_BATCH = PERSISTENT_FORWARD_MIN_BATCH
# the dynamic shared memory a block may ask for on sm_90 (227 KB); a GPU with less gets a block per tile instead
PAIR_SHARED_LIMIT = 227 * 1024
# BN2's statistics come from the forward's moments in training, for one model of MOMENTS_MIN_BATCH images or more:
# the persistent form's blocks' in its precisions, a block per tile's in fp32 (docs/performance.md). Below it the
# statistics pass stays, so that a lone model's reductions are a ModelsNet's (nets/models_net.py)
MOMENTS_MIN_BATCH = PERSISTENT_FORWARD_MIN_BATCH
# shared memory the driver reserves for each resident block
SHARED_RESERVED_BYTES = 1024
# weight gradient: WGRAD_THREADS threads (three warpgroups) per block of WGRAD_OUT output and WGRAD_CHANNELS
# input channels; k runs over pixels x WGRAD_IMAGES images (twice as many in bf16); WGRAD_X_SLOTS staged
# rows of x
WGRAD_THREADS, WGRAD_OUT, WGRAD_CHANNELS, WGRAD_IMAGES, WGRAD_X_SLOTS = 384, 64, 32, 4, 6
# the weight gradient's layout of x and dy (to_weight_grad_layout): a block per 8 channels of an image group
WGRAD_LAYOUT_THREADS, WGRAD_LAYOUT_CHANNELS = 256, 8
# The step writes x and dy in that layout and the weight gradient reads them there in these precisions, from this
# batch (a model's): in bf16 its staging's loads are what bound it, and the step measured faster from 512 images
# (183.2 -> 179.0 us) and slower below (64 to 256), where the two extra passes cost more than they save; in float32's
# layouts the products bound it (docs/performance.md)
WGRAD_LAYOUT_PRECISIONS = ("bf16",)
WGRAD_LAYOUT_MIN_BATCH = 512

_src = source(
    "fast/2_conv2_implicit_gemm.cu",
    CONV2_SIZE=CONV2_SIZE,
    CONV_THREADS=CONV_THREADS,
    CONV_TILE_CHANNELS=CONV_TILE_CHANNELS,
    CONV_TILE_CHANNELS_STACKED=CONV_TILE_CHANNELS_STACKED,
    CONV_CHUNK=CONV_CHUNK,
    CONV_CHUNK_QUADS=CONV_CHUNK_QUADS,
    CONV_ROWS=CONV_ROWS,
    CONV_STAGED_PIXELS=CONV_STAGED_PIXELS,
    CONV_PERSISTENT_BLOCKS_PER_SM=PERSISTENT_BLOCKS_PER_SM,
    CONV_PERSISTENT_OUTPUT_BYTES=PERSISTENT_OUTPUT_BYTES,
    WGRAD_THREADS=WGRAD_THREADS,
    WGRAD_OUT=WGRAD_OUT,
    WGRAD_CHANNELS=WGRAD_CHANNELS,
    WGRAD_IMAGES=WGRAD_IMAGES,
    WGRAD_X_SLOTS=WGRAD_X_SLOTS,
    WGRAD_LAYOUT_THREADS=WGRAD_LAYOUT_THREADS,
    WGRAD_LAYOUT_CHANNELS=WGRAD_LAYOUT_CHANNELS,
)
_kernel = precision_kernels(
    _src, "conv2", ("stage_weights", "forward", "backward_input", "backward_weight"), KERNEL_PRECISION
)
# the persistent forward of each precision, without and with its output's moments (forward's moment_parts)
_persistent_forward = {
    (p, moments): _src.kernel(f"conv2_forward_persistent_fast<{KERNEL_PRECISION[p]}, {str(moments).lower()}>")
    for p in PERSISTENT_PRECISIONS
    if p != "fp32"
    for moments in (False, True)
}
# the 3xTF32 forward with its output's moments, a block per tile (forward's moment_parts in fp32)
_tile_moments_forward = _src.kernel("conv2_forward_tile_moments_fast")
# the 3xTF32 forward's persistent forms (FP32_PERSISTENT_FORMS): their threads, and their kernels without and with
# their output's moments
_fp32_persistent = {
    form: (threads, {m: _src.kernel(f"conv2_forward_{kernel}_fast<{str(m).lower()}>") for m in (False, True)})
    for form, kernel, threads in (
        ("warp_specialized", "warp_specialized", WARP_SPECIALIZED_THREADS),
        ("pair", "warpgroup_pair", PAIR_THREADS),
    )
}
# the 3xTF32 weight gradient with its staging's loads plain, without the L2's 256-byte fetch: the ladder's rung below
# the product (dev/ladder/conv2_weight_grad)
_weight_grad_without_l2_prefetch = _src.kernel("conv2_backward_weight_fast<Precision::Fp32, false>")
# the weight gradient reading x and dy in its layout, and the kernel that writes that layout, per precision (the
# weight gradient from the layout in fp32 and tf32: the ladder's and the tests')
_weight_grad_from_layout = {
    p: _src.kernel(f"conv2_backward_weight_fast<{k}, true, true>") for p, k in KERNEL_PRECISION.items()
}
_weight_grad_layout = {p: _src.kernel(f"conv2_weight_grad_layout_fast<{k}>") for p, k in KERNEL_PRECISION.items()}
# the 3xTF32 forms that have a kernel of their own, and the product they are a form of
_FP32_FORMS = {
    "forward_stacked": ("forward", _src.kernel("conv2_forward_stacked_fast")),
    "backward_input_paired": ("backward_input", _src.kernel("conv2_backward_input_paired_fast")),
}


def stored_dtype(precision: str):
    """The dtype conv2's input, its output and their gradients are stored in at `precision`: bf16 bits
    (common.BF16) in "bf16", float32 otherwise (the kernels' conv2_stored)."""
    _kernel("forward", precision)  # checks the precision
    return activation_dtype(precision)


def _check_stored(array, name: str, precision: str):
    check_stored(array, name, stored_dtype(precision), "conv2", precision)


def _image_tile_kernel(product: str, precision: str):
    """The kernel of an image-tile product: "forward", "forward_stacked" (fp32 only), "backward_input" or
    "backward_input_paired" (fp32 only)."""
    if product not in IMAGE_TILE_PRODUCTS:
        raise ValueError(f"unknown product {product!r}; choose from {IMAGE_TILE_PRODUCTS}")
    base, form_kernel = _FP32_FORMS.get(product, (product, None))
    kernel = _kernel(base, precision)  # checks the precision
    if form_kernel is None:
        return kernel
    if precision != "fp32":
        raise ValueError(f"{product} is a 3xTF32 form (precision 'fp32'); got precision {precision!r}")
    return form_kernel


def forward_product(batch: int, precision: str) -> str:
    """The forward's form for batches of up to `batch` images: "forward_stacked" in fp32 up to
    STACKED_FORWARD_MAX_BATCH, else "forward"."""
    _kernel("forward", precision)
    return "forward_stacked" if precision == "fp32" and batch <= STACKED_FORWARD_MAX_BATCH else "forward"


def input_grad_product(batch: int, precision: str) -> str:
    """The input gradient's form for batches of up to `batch` images: "backward_input_paired" in fp32 from
    PAIRED_INPUT_GRAD_MIN_BATCH, else "backward_input"."""
    _kernel("backward_input", precision)
    return "backward_input_paired" if precision == "fp32" and batch >= PAIRED_INPUT_GRAD_MIN_BATCH else "backward_input"


def _stacked(product: str, precision: str) -> bool:
    _image_tile_kernel(product, precision)
    return product in _FP32_FORMS or (product, precision) == ("backward_input", "fp32")


def tile_channels(product: str, precision: str) -> int:
    """Output channels per block of an image-tile product (one of IMAGE_TILE_PRODUCTS)."""
    return CONV_TILE_CHANNELS_STACKED if _stacked(product, precision) else CONV_TILE_CHANNELS


def chunk_quads(product: str, precision: str) -> int:
    """Weight quads (16 bytes) per staged chunk of an image-tile product: 128 rows of A per tap in the forward's
    fp32 form (the big TF32 parts of 64 channels, then their small parts), else 64 (the paired form lays out a
    kernel row's three taps together, 192 rows)."""
    _image_tile_kernel(product, precision)
    return 2 * CONV_CHUNK_QUADS if (product, precision) == ("forward", "fp32") else CONV_CHUNK_QUADS


def chunk_channels(precision: str) -> int:
    """Input channels per staged chunk of the forward and the input gradient."""
    _kernel("forward", precision)
    return 2 * CONV_CHUNK if precision == "bf16" else CONV_CHUNK


def weight_grad_images(precision: str) -> int:
    """Images per 16 staged bytes of the weight gradient's k."""
    _kernel("backward_weight", precision)
    return 2 * WGRAD_IMAGES if precision == "bf16" else WGRAD_IMAGES


@functools.cache  # checked at every launch (_check_quads)
def weight_quads(c_in: int, c_out: int, precision: str, product: str) -> int:
    """Weight quads (16 bytes: float4s) of one image-tile product as stage_weights writes them (c_in input, c_out
    output channels)."""
    return (
        ceil_div(c_out, tile_channels(product, precision))
        * ceil_div(c_in, chunk_channels(precision))
        * chunk_quads(product, precision)
    )


def image_tile_shared_bytes(product: str, precision: str, persistent: bool = False) -> int:
    """Dynamic shared memory of a forward / input-gradient block: two buffers of the staged image (2 TF32
    parts x 2 channel quads x CONV_STAGED_PIXELS x 16 bytes) and of a chunk's weights (one buffer in the
    forward's fp32 form, whose chunks are twice as large); the persistent form's output region after them (32
    rows of the tile's columns and 8 more, float32)."""
    quads = chunk_quads(product, precision)
    weight_buffers = 1 if quads > CONV_CHUNK_QUADS else 2
    output = PERSISTENT_OUTPUT_BYTES if persistent else 0
    return 2 * 4 * CONV_STAGED_PIXELS * 16 + weight_buffers * quads * 16 + output


def persistent_tiles(product: str, precision: str, batch: int, models: int = 1, c_in: int = 32) -> bool:
    """Whether the image-tile product `product` runs in its persistent form by default: the forward in
    PERSISTENT_PRECISIONS, for one model of at least PERSISTENT_FORWARD_MIN_BATCH images (PAIR_FORWARD_MIN_BATCH in
    fp32, whose form needs the weights of c_in input channels in a block's shared memory: pair_fits)."""
    _image_tile_kernel(product, precision)
    minimum = PAIR_FORWARD_MIN_BATCH if precision == "fp32" else PERSISTENT_FORWARD_MIN_BATCH
    return (
        product == "forward"
        and precision in PERSISTENT_PRECISIONS
        and models == 1
        and batch >= minimum
        and (precision != "fp32" or pair_fits(c_in))
    )


def pair_shared_bytes(c_in: int) -> int:
    """Dynamic shared memory of the fp32 forward's warpgroup pair for c_in input channels: every chunk's weights
    (apart: both parts of 64 channels), then per warpgroup two buffers of the staged image and the output region."""
    weights = ceil_div(c_in, CONV_CHUNK) * 2 * CONV_CHUNK_QUADS * 16
    return weights + 2 * (2 * 4 * CONV_STAGED_PIXELS * 16 + PERSISTENT_OUTPUT_BYTES)


def pair_fits(c_in: int, block_limit: int = PAIR_SHARED_LIMIT) -> bool:
    """Whether the warpgroup pair's shared memory for c_in input channels fits a block's block_limit bytes."""
    return pair_shared_bytes(c_in) <= block_limit


# the most input channels whose weights the warpgroup pair's block holds on sm_90 (32: the network's)
PAIR_MAX_IN_CHANNELS = max(c for c in range(CONV_CHUNK, 257, CONV_CHUNK) if pair_fits(c))


def weight_grad_shared_bytes() -> int:
    """Dynamic shared memory of a weight-gradient block: WGRAD_X_SLOTS staged x rows (16 pixels x 2 TF32 parts
    x WGRAD_CHANNELS x 16 bytes each) and two dy rows (14 pixels x 2 parts x WGRAD_OUT x 16 bytes each)."""
    return WGRAD_X_SLOTS * 16 * 2 * WGRAD_CHANNELS * 16 + 2 * CONV2_SIZE * 2 * WGRAD_OUT * 16


def _check_form(product: str, of: str):
    """`product` must be a form of the image-tile product `of` ("forward" or "backward_input"): itself or one of
    its 3xTF32 forms (_FP32_FORMS)."""
    forms = (of,) + tuple(form for form, (base, _) in _FP32_FORMS.items() if base == of)
    if product not in forms:
        name = {"forward": "forward", "backward_input": "input gradient"}[of]
        raise ValueError(f"unknown {name} {product!r}; choose from {forms}")


def _check_quads(quads, c_in: int, c_out: int, precision: str, product: str, models: int = 1):
    """A staged weight buffer must be sized for its product's form, for `models` models. (At the default channels
    both forward forms take the same size, and the input gradient's two forms always do, so this cannot tell
    them apart: the caller keeps one form per buffer.)"""
    want = weight_quads(c_in, c_out, precision, product)
    shapes = ((want, 4),) if models == 1 else ((models * want, 4), (models, want, 4))
    if tuple(quads.shape) not in shapes:
        raise ValueError(
            f"{product}'s staged weights are {tuple(quads.shape)}; {c_in} -> {c_out} channels in "
            f"{precision} for {models} model(s) take {' or '.join(map(str, shapes))}"
        )


def stage_weights(
    w,
    c_in: int,
    c_out: int,
    forward_quads,
    input_grad_quads,
    precision: str,
    forward_product: str = "forward",
    input_grad_product: str = "backward_input",
    models: int = 1,
    param_stride: int = 0,
):
    """w [c_out, c_in, 3, 3] as both products read it: forward_quads [weight_quads(c_in, c_out, precision,
    forward_product), 4] for the forward `forward_product` ("forward" or "forward_stacked") and the flipped
    input_grad_quads [weight_quads(c_out, c_in, precision, input_grad_product), 4] for the input gradient
    `input_grad_product` ("backward_input" or "backward_input_paired"). For `models` models, model m's w at
    +m * param_stride floats, and the staged buffers [models][those quads]."""
    _check_form(forward_product, "forward")
    _check_form(input_grad_product, "backward_input")
    _check_quads(forward_quads, c_in, c_out, precision, forward_product, models)
    _check_quads(input_grad_quads, c_out, c_in, precision, input_grad_product, models)
    _kernel("stage_weights", precision).launch_1d(
        weight_quads(c_in, c_out, precision, forward_product)
        + weight_quads(c_out, c_in, precision, input_grad_product),
        w,
        I32(c_in),
        I32(c_out),
        forward_quads,
        input_grad_quads,
        I32(forward_product == "forward_stacked"),
        I32(input_grad_product == "backward_input_paired"),
        I32(param_stride),
        models=models,
    )


def _image_tiles(name, precision, n, models, out_channels, persistent, *args, moment_parts=None, in_channels=0):
    """A block per image of the models' batches (the grid's x: the kernel finds an image's model as image / n, its
    last argument), output channel tile and half image; or, persistent (None: persistent_tiles), a block per SM
    slot and output channel tile, each taking every gridDim.x-th half image (in fp32 _pair_tiles). With moment_parts,
    each block's moments of its output into it: the persistent form's, or the fp32 forward's a tile's (one model)."""
    if isinstance(persistent, str) and (precision != "fp32" or persistent not in FP32_PERSISTENT_FORMS):
        raise ValueError(
            f"persistent names a form of the fp32 forward, one of {FP32_PERSISTENT_FORMS}; got {persistent!r} in "
            f"{precision}"
        )
    if persistent is not None and not isinstance(persistent, str):
        persistent = bool(persistent)
    if persistent is None:
        persistent = persistent_tiles(name, precision, n, models, in_channels)
        persistent = persistent and (precision != "fp32" or pair_fits(in_channels, shared_memory_per_block()))
    channel_tiles = ceil_div(out_channels, tile_channels(name, precision))
    if not persistent:
        grid = (models * n, channel_tiles, CONV2_SIZE // CONV_ROWS)
        shared = image_tile_shared_bytes(name, precision)
        if moment_parts is None:
            _image_tile_kernel(name, precision).launch(
                grid, CONV_THREADS, *args, I32(n), shared_mem=shared, models=models
            )
            return
        if (name, precision, models) != ("forward", "fp32", 1):
            raise ValueError(
                f"the output's moments come from the forward for one model, persistent in {PERSISTENT_PRECISIONS} or "
                f"a block per tile in 'fp32'; got {name} in {precision} for {models} model(s), not persistent"
            )
        _check_moment_parts(moment_parts, out_channels, n * (CONV2_SIZE // CONV_ROWS))
        _tile_moments_forward.launch(grid, CONV_THREADS, *args, moment_parts, shared_mem=shared)
        return
    if name != "forward" or precision not in PERSISTENT_PRECISIONS or models != 1:
        raise ValueError(
            f"only the forward has a persistent form, in {PERSISTENT_PRECISIONS}, for one model; "
            f"got {name} in {precision} for {models} model(s)"
        )
    if precision == "fp32":
        form = None if persistent is True else persistent
        _pair_tiles(n, in_channels, out_channels, *args, moment_parts=moment_parts, form=form)
        return
    shared = image_tile_shared_bytes(name, precision, persistent=True)
    grid = _persistent_grid_here(n, channel_tiles, shared)
    if moment_parts is not None:
        _check_moment_parts(moment_parts, out_channels, grid[0])
    _persistent_forward[precision, moment_parts is not None].launch(
        grid, CONV_THREADS, *args, NULL if moment_parts is None else moment_parts, shared_mem=shared
    )


def _pair_tiles(n: int, c_in: int, c_out: int, *args, moment_parts=None, form: str | None = None):
    """The fp32 forward's persistent form `form` (FP32_PERSISTENT_FORMS; None: the step's, the first): a block per SM
    and output channel tile (pair_grid), with moment_parts each tile's moments, as a block per tile leaves them."""
    shared = pair_shared_bytes(c_in)
    if not pair_fits(c_in, shared_memory_per_block()):
        raise ValueError(
            f"the fp32 forward's persistent form needs {shared} bytes of shared memory for {c_in} input channels; "
            f"this GPU's blocks take {shared_memory_per_block()}"
        )
    grid = pair_grid(n, ceil_div(c_out, CONV_TILE_CHANNELS), sm_count())
    if moment_parts is not None:
        _check_moment_parts(moment_parts, c_out, moment_counts(n)[0])
    threads, kernels = _fp32_persistent[form or FP32_PERSISTENT_FORMS[0]]
    kernels[moment_parts is not None].launch(
        grid, threads, *args, NULL if moment_parts is None else moment_parts, shared_mem=shared
    )


def pair_grid(n: int, channel_tiles: int, sms: int) -> tuple[int, int, int]:
    """The warpgroup pair's grid for n images: channel_tiles in y, and in x a block per SM across the channel tiles,
    at most one per two half images (each block's first warpgroup then has a tile)."""
    return (min(ceil_div(n * (CONV2_SIZE // CONV_ROWS), 2), max(1, sms // channel_tiles)), channel_tiles, 1)


def _check_moment_parts(moment_parts, out_channels: int, parts: int):
    if moment_parts.size < out_channels * parts * 2:
        raise ValueError(f"moment_parts holds {moment_parts.size} floats; {out_channels} x {parts} pairs needed")


def _persistent_grid_here(n: int, channel_tiles: int, shared: int) -> tuple[int, int, int]:
    """persistent_grid on this GPU, for blocks of `shared` bytes of dynamic shared memory."""
    return persistent_grid(n, channel_tiles, sm_count(), shared_memory_per_sm() // (shared + SHARED_RESERVED_BYTES))


def moment_part_count(n: int, c_out: int, precision: str) -> int:
    """The blocks of the persistent forward for n images and c_out output channels on this GPU, and so the
    (mean, M2) pairs per channel it leaves in forward's moment_parts."""
    shared = image_tile_shared_bytes("forward", precision, persistent=True)
    return _persistent_grid_here(n, ceil_div(c_out, CONV_TILE_CHANNELS), shared)[0]


def moment_form(n: int, c_out: int, precision: str, models: int = 1) -> str | None:
    """How forward leaves its output's moments for BN2's statistics at this batch in training (moment_parts), or None
    where a pass over its output takes them: "blocks", the persistent form's blocks (bn_relu_pool.stats_from_parts
    merges at most MOMENT_PARTS_MAX of them), or "tiles", a block per tile in fp32 (bn_relu_pool.stats_from_tiles);
    one model of MOMENTS_MIN_BATCH images or more."""
    form = moment_source(n, precision, models)
    if form == "blocks" and moment_part_count(n, c_out, precision) > MOMENT_PARTS_MAX:
        return None
    return form


def moment_source(n: int, precision: str, models: int = 1) -> str | None:
    """moment_form but for its check of the persistent form's count of blocks, which needs the GPU: what the scratch
    is sized for (moment_parts_size). In fp32 every form of the 64-channel forward leaves a tile's moments."""
    if models != 1 or n < MOMENTS_MIN_BATCH:
        return None
    if precision == "fp32":
        return "tiles" if forward_product(n, precision) == "forward" else None
    return "blocks" if persistent_tiles("forward", precision, n, models) else None


def moment_counts(n: int) -> tuple[int, int]:
    """The forward's tiles for n images and each tile's values per channel (bn_relu_pool's tiles and tile_values):
    the persistent form's blocks deal the tiles out in turn; a block per tile takes one."""
    return n * (CONV2_SIZE // CONV_ROWS), CONV_ROWS * CONV2_SIZE


def moment_parts_size(c_out: int, n: int, form: str | None) -> int:
    """Scratch of forward's moment_parts (float32) for batches of up to n images in moment form `form`: a (mean, M2)
    pair per channel and part, MOMENT_PARTS_MAX blocks at most ("blocks"), or n's tiles ("tiles"); 0 for None."""
    parts = {"blocks": MOMENT_PARTS_MAX, "tiles": moment_counts(n)[0], None: 0}
    if form not in parts:
        raise ValueError(f"unknown moment form {form!r}; choose from {tuple(parts)}")
    return c_out * 2 * parts[form]


def persistent_grid(n: int, channel_tiles: int, sms: int, fit_per_sm: int) -> tuple[int, int, int]:
    """The persistent forward's grid for n images: channel_tiles in y, and in x as many blocks as the SMs hold at once
    across the channel tiles (PERSISTENT_BLOCKS_PER_SM each, the kernel's launch bounds, or fit_per_sm, the blocks an
    SM's shared memory holds, if fewer), at most one per half image: a block more than they hold would wait for a
    whole block's run of tiles."""
    per_sm = max(1, min(PERSISTENT_BLOCKS_PER_SM, fit_per_sm))
    return (min(n * (CONV2_SIZE // CONV_ROWS), max(1, per_sm * sms // channel_tiles)), channel_tiles, 1)


def forward(
    x,
    forward_quads,
    y,
    n: int,
    c_in: int,
    c_out: int,
    precision: str,
    product: str = "forward",
    models: int = 1,
    persistent: bool | str | None = None,
    moment_parts=None,
):
    """y [n, c_out, 14, 14] = conv3x3(x [n, c_in, 14, 14]) by `product` ("forward" or "forward_stacked"), with the
    weights staged for it by stage_weights. For `models` models: x, y, forward_quads [models][...], n per model.
    persistent: its persistent form or not (None: persistent_tiles), the same bits either way; in fp32 also a form
    by name (FP32_PERSISTENT_FORMS: True is the first, the step's).
    moment_parts (float32, moment_parts_size; where moment_form is not None): the (mean, M2) of each channel of y, as y
    holds it, by part: the persistent form's blocks, [c_out, moment_part_count(n, c_out, precision), 2]
    (bn_relu_pool.stats_from_parts merges them), or in fp32 a block per tile, [c_out, moment_counts(n)[0], 2]
    (bn_relu_pool.stats_from_tiles)."""
    _check_form(product, "forward")
    _check_quads(forward_quads, c_in, c_out, precision, product, models)
    _check_stored(x, "x", precision)
    _check_stored(y, "y", precision)
    _image_tiles(
        product,
        precision,
        n,
        models,
        c_out,
        persistent,
        x,
        forward_quads,
        y,
        I32(n),
        I32(c_in),
        I32(c_out),
        moment_parts=moment_parts,
        in_channels=c_in,
    )


def backward_input(
    dy,
    input_grad_quads,
    dx,
    n: int,
    c_in: int,
    c_out: int,
    precision: str,
    product: str = "backward_input",
    models: int = 1,
):
    """dx [n, c_in, 14, 14] from dy [n, c_out, 14, 14] by `product` ("backward_input" or "backward_input_paired"),
    with the flipped weights staged for it by stage_weights. For `models` models: dy, dx, input_grad_quads
    [models][...], n per model."""
    _check_form(product, "backward_input")
    _check_quads(input_grad_quads, c_out, c_in, precision, product, models)
    _check_stored(dy, "dy", precision)
    _check_stored(dx, "dx", precision)
    _image_tiles(product, precision, n, models, c_in, False, dy, input_grad_quads, dx, I32(n), I32(c_in), I32(c_out))


def weight_grad_partial_size(c_in: int, c_out: int) -> int:
    """Scratch of backward_weight (float32) for one model: room for a partial result per SM (K models take K
    times this)."""
    return sm_count() * c_out * c_in * 9


def weight_grad_grid(n: int, c_in: int, c_out: int, precision: str) -> tuple[tuple[int, int, int], int]:
    """Grid of backward_weight and its items per part. An item is an output row of weight_grad_images images; each
    block sums a run of consecutive items into its own partial result. A block fills an SM, and the kernel
    runs beside conv2's input gradient and conv1's backward (on a side branch of the step), so it gets about
    half of the SMs (docs/performance.md)."""
    rows, cols = ceil_div(c_out, WGRAD_OUT), ceil_div(c_in, WGRAD_CHANNELS)
    items = ceil_div(n, weight_grad_images(precision)) * CONV2_SIZE
    per_part = ceil_div(items * rows * cols, max(1, sm_count() // 2))
    return (ceil_div(items, per_part), rows, cols), per_part


def weight_grad_from_layout(batch: int, precision: str) -> bool:
    """Whether the step hands the weight gradient x and dy in its layout, at a model's `batch`: the same bits either
    way."""
    return precision in WGRAD_LAYOUT_PRECISIONS and batch >= WGRAD_LAYOUT_MIN_BATCH


def weight_grad_layout_size(n: int, channels: int, precision: str) -> int:
    """Values of one model's x or dy (channels channels) in the weight gradient's layout: [groups][196][channels]
    [weight_grad_images], the last group's images past n zeros."""
    images = weight_grad_images(precision)
    return ceil_div(n, images) * CONV2_SIZE * CONV2_SIZE * channels * images


def to_weight_grad_layout(src, dst, n: int, channels: int, precision: str, models: int = 1):
    """src [models][n][channels][14][14] (x or dy) into dst in the weight gradient's layout, [models][groups][196]
    [channels][weight_grad_images] (weight_grad_layout_size values a model; conv2's stored dtype): a group's
    images of a channel's pixel are 16 bytes, the unit the weight gradient stages, and images past n zeros."""
    _check_stored(src, "src", precision)
    _check_stored(dst, "dst", precision)
    size = weight_grad_layout_size(n, channels, precision)
    if dst.size < models * size:
        raise ValueError(f"dst holds {dst.size} values; {models} x {size} needed")
    tasks = ceil_div(n, weight_grad_images(precision)) * ceil_div(channels, WGRAD_LAYOUT_CHANNELS)
    _weight_grad_layout[precision].launch(
        (tasks, 1, models),
        WGRAD_LAYOUT_THREADS,
        src,
        dst,
        I32(n),
        I32(channels),
        models=models,
    )


def backward_weight(
    x,
    dy,
    partial,
    n: int,
    c_in: int,
    c_out: int,
    precision: str,
    models: int = 1,
    l2_prefetch: bool = True,
    from_layout: bool = False,
) -> int:
    """The weight gradient's partial results [parts, c_out, c_in, 3, 3] into partial; returns parts (for
    splitk_reduce). For `models` models (x, dy [models][n][...]): the parts of one model's launch each, packed as
    [models][parts][c_out * c_in * 9] at partial's start (models * weight_grad_partial_size is room enough).
    l2_prefetch False (fp32 only, the same bits): the staging's loads without the L2's 256-byte fetch. from_layout:
    x and dy in the weight gradient's layout (to_weight_grad_layout), the same bits."""
    _check_stored(x, "x", precision)
    _check_stored(dy, "dy", precision)
    kernel = _kernel("backward_weight", precision)
    if not l2_prefetch:
        if precision != "fp32" or from_layout:
            raise ValueError("the weight gradient without the L2 prefetch is built in fp32 from x and dy as they are")
        kernel = _weight_grad_without_l2_prefetch
    if from_layout:
        kernel = _weight_grad_from_layout[precision]
        for a, name, channels in ((x, "x", c_in), (dy, "dy", c_out)):
            need = models * weight_grad_layout_size(n, channels, precision)
            if a.size < need:
                raise ValueError(f"{name} holds {a.size} values; the layout of {models} x {n} images needs {need}")
    grid, per_part = weight_grad_grid(n, c_in, c_out, precision)
    parts, rows, groups = grid
    if partial.size < models * parts * c_out * c_in * 9:
        raise ValueError(f"partial holds {partial.size} floats; {models} x {parts} parts of {c_out * c_in * 9} needed")
    kernel.launch(
        (parts, rows, groups * models),
        WGRAD_THREADS,
        x,
        dy,
        partial,
        I32(n),
        I32(c_in),
        I32(c_out),
        I32(per_part),
        shared_mem=weight_grad_shared_bytes(),
        models=models,
    )
    return grid[0]
