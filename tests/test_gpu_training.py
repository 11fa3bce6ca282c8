"""The whole training step against the reference, evaluation, determinism, the three step modes, and real
training (GPU)."""

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import mnist_or_skip
from mnist_cuda import data, reference
from mnist_cuda.kernel_cases import rel_err

pytestmark = pytest.mark.gpu
STEP_TOL = 1e-4
DECISION_TOL = 1e-4  # how far from a tie (or from zero) a choice the kernels took may be, in float64
# "tf32": the fast kernels with conv2's products in plain TF32 (--precision tf32): ~3e-4 per product;
# "bf16": conv2's and fc1's products on bf16 operands (--precision bf16): ~3e-3 per product. Each allows
# about ten times its rounding, as STEP_TOL does float32's accumulated rounding.
TF32_STEP_TOL, BF16_STEP_TOL = 3e-3, 3e-2
# BatchNorm 1's gradients are sums over the batch of terms of both signs, fed by conv2's input gradient,
# and at few channels the cancellation leaves that gradient's rounding unaveraged: they get BN1_GRAD_FACTOR
# times the step's tolerance. Measured on the H200 over random weights and batches (seeds from 1000) at
# batch 65, channels (5, 7), the largest error of a BatchNorm 1 gradient (99th percentile): bf16 7.4e-2
# (1.9e-2) over 1,500 seeds, tf32 4.8e-3 (2.1e-3) over 1,000, fp32 1.5e-4 (3.6e-5) over 400, each 1.5-2.5
# times its step tolerance; at the default model, batch 64, bf16 at most 7.2e-3 (12 seeds). With conv2's output
# and its gradient stored as bf16, bf16 again: 3.3e-2 (1.8e-2) over 300 seeds from 1000 at batch 65, any other
# gradient at most 1.0e-2 (BatchNorm 2's weight); at the default model at most 8.2e-3 (30 seeds).
BN1_GRAD_FACTOR = 5
VERSIONS = ("naive", "fast", "tf32", "bf16")


def step_tol(version, name=""):
    """The tolerance of `version`'s step against the reference, for parameter `name` (its gradient, or its
    value after the update: bn1.bias starts at 0, so its error after one step is its gradient's) if given."""
    tol = {"tf32": TF32_STEP_TOL, "bf16": BF16_STEP_TOL}.get(version, STEP_TOL)
    return tol * BN1_GRAD_FACTOR if name in ("bn1.weight", "bn1.bias") else tol


def make_net(channels, hidden, seed, version, batch):
    """A net of `version` ("naive", "fast", or the fast kernels at precision "tf32" or "bf16") at batch
    size `batch`, initialised from reference.init_state_dict(seed)."""
    from mnist_cuda import nets

    params = nets.Parameters(channels, hidden)
    params.load_state_dict(reference.init_state_dict(seed, channels, hidden))
    params.cp.cuda.runtime.deviceSynchronize()  # the steps run on a non-blocking stream
    if version in ("tf32", "bf16"):
        return nets.make_net(params, batch, "fast", precision=version)
    return nets.make_net(params, batch, version)


def random_batch(rng, n):
    """Random images as bytes (what the GPU gets) and labels."""
    return rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int32)


def step_against_reference(batch, channels, hidden, version, seed):
    """The forward and backward of `version` on a random batch drawn from `seed`, and the float64
    reference's with the kernels' ReLU and max-pool choices imposed: a namespace of net, step, ref (the
    reference model), seen (the images as the network sees them), y, decisions, loss and grads (the
    reference's). The seed fixes the weights and the batch, so a failure's seed reproduces it."""
    from mnist_cuda.step import Step

    rng = np.random.default_rng([seed, 1])  # a stream of its own: init_state_dict draws the weights from seed
    net = make_net(channels, hidden, seed, version, batch)
    ref = reference.ReferenceModel(reference.init_state_dict(seed, channels, hidden))
    x, y = random_batch(rng, batch)
    step = Step(net, 0.1, mode="eager")
    step.stage_x[0][:batch] = x
    step.stage_y[0][:batch] = y
    with step.stream:
        net.params.grads.fill(np.nan)  # every gradient element must be written by backward
        step.load(0, batch)
        net.forward(step.x[0], step.y[0], batch, train=True, slot=0)
        net.backward(batch)
    step.synchronize()
    # The oracle takes the kernels' ReLU and max-pool choices: among 10^5..10^6 of them, one that sits
    # within float32 rounding of a tie or of zero may go the other way than in float64, and flip a
    # gradient path (conv1's weight gradient, a sum with heavy cancellation through BatchNorm, then
    # misses 1e-4 in a few runs of 60). Those choices must be near-ties: the gap checks it.
    decisions = net.decisions(batch)
    seen = data.normalize(x)  # the images as the network sees them
    loss, grads, imposed = ref.loss_and_grads(seen, y, decisions)
    _, own = ref.forward(seen)
    tol = step_tol(version)
    for key in ("pooled1", "pooled2", "fc1"):
        gap = np.abs(imposed[key] - own[key]).max()
        assert gap < max(DECISION_TOL, tol) * max(1.0, np.abs(own[key]).max()), (key, gap, seed)
    return SimpleNamespace(net=net, step=step, ref=ref, seen=seen, y=y, decisions=decisions, loss=loss, grads=grads)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "batch,channels,hidden", [(1, (32, 64), 128), (3, (5, 7), 33), (64, (32, 64), 128), (65, (5, 7), 33)]
)
def test_training_step_matches_reference(batch, channels, hidden, version):
    step_and_update_match_reference(batch, channels, hidden, version)


def step_and_update_match_reference(batch, channels, hidden, version):
    """A step of `version` on a random batch: its loss, gradients and (after a plain SGD update) parameters and
    running statistics against the float64 reference's. Returns the run (step_against_reference's)."""
    seed = int(np.random.default_rng().integers(1 << 30))
    run = step_against_reference(batch, channels, hidden, version, seed)
    net, step, params, tol = run.net, run.step, run.net.params, step_tol(version)
    got_loss = float(net.loss.get()[0])
    assert abs(got_loss - run.loss) < tol * max(1.0, abs(run.loss)), (got_loss, run.loss, seed)
    for name, g in run.grads.items():
        err = rel_err(params.g[name].get(), g)
        assert err < step_tol(version, name), (name, err, seed)
    with step.stream:
        net.update(step.optimizer)  # plain SGD at the rate 0.1 the Step was made with
        net.zero_grad()
    step.synchronize()
    run.ref.train_step(run.seen, run.y, lr=0.1, decisions=run.decisions)
    params.num_batches_tracked += 1
    state = params.state_dict()
    for name, want in run.ref.state_dict().items():
        if name.endswith("tracked"):
            assert int(state[name]) == int(want) == 1
        else:
            err = rel_err(state[name], want)
            assert err < step_tol(version, name), (name, err, seed)
    assert not params.grads.any()  # zero-grad cleared the flat buffer
    return run


@pytest.mark.parametrize("version", ("fast", "tf32", "bf16"))
@pytest.mark.parametrize("batch,channels,hidden", [(64, (32, 64), 128), (65, (5, 7), 33), (65, (8, 130), 20)])
def test_bn2_statistics_from_the_forwards_moments_in_the_step(monkeypatch, batch, channels, hidden, version):
    """From MOMENTS_MIN_BATCH images (lowered here to 64, with the persistent forms' thresholds and fp32's stacked
    forward's) BN2's statistics come from conv2's forward's moments, not a pass over its output (batchnorm_stats_fast):
    its persistent form's blocks' in tf32 and bf16 (batchnorm_stats_from_parts_fast), a tile's in fp32, from the
    warp-specialised pair (batchnorm_stats_from_tiles_fast). The step and the running statistics still match the
    reference."""
    from mnist_cuda import cuda
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    for threshold in ("PERSISTENT_FORWARD_MIN_BATCH", "PAIR_FORWARD_MIN_BATCH", "MOMENTS_MIN_BATCH"):
        monkeypatch.setattr(conv2, threshold, 64)
    monkeypatch.setattr(conv2, "STACKED_FORWARD_MAX_BATCH", 0)
    launched = set()

    def record(kernel, grid, block, args, shared_mem, launch):
        launched.add(kernel.name)
        launch()

    with cuda.launch_hook(record):
        run = step_and_update_match_reference(batch, channels, hidden, version)
    assert run.net.moment_parts2 is not None
    merge = "batchnorm_stats_from_tiles_fast" if version == "fast" else "batchnorm_stats_from_parts_fast"
    assert merge in launched
    if version == "fast":  # the warp-specialised pair, whose block holds conv2's weights at these input channels
        assert "conv2_forward_warp_specialized_fast<true>" in launched
    assert not any(name.startswith("batchnorm_stats_fast") for name in launched)


def test_paired_input_gradient_in_the_step(monkeypatch):
    """FastNet with conv2's input gradient in its paired form (taken from PAIRED_INPUT_GRAD_MIN_BATCH, lowered
    here to batch 64) stages its weights for that form and computes the step's gradients as the reference does."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    monkeypatch.setattr(conv2, "PAIRED_INPUT_GRAD_MIN_BATCH", 64)
    seed = int(np.random.default_rng().integers(1 << 30))
    run = step_against_reference(64, (32, 64), 128, "fast", seed)
    assert run.net.conv2_input_grad == "backward_input_paired"
    for name, g in run.grads.items():
        err = rel_err(run.net.params.g[name].get(), g)
        assert err < step_tol("fast", name), (name, err, seed)


@pytest.mark.parametrize("version", VERSIONS)
def test_eval_forward_uses_running_stats(version):
    from mnist_cuda.step import Step

    rng = np.random.default_rng()
    net = make_net((32, 64), 128, seed=1, version=version, batch=64)
    state = net.params.state_dict()
    for k in ("bn1.running_mean", "bn2.running_mean"):
        state[k] = rng.standard_normal(state[k].shape).astype(np.float32)
    for k in ("bn1.running_var", "bn2.running_var"):
        state[k] = (rng.random(state[k].shape) + 0.5).astype(np.float32)
    net.params.load_state_dict(state)
    ref = reference.ReferenceModel(state)
    x, y = random_batch(rng, 37)
    step = Step(net, 0.1, mode="eager")
    accuracy = step.evaluate(x, y)  # a partial batch, as the last evaluation batch is
    logits = net.logits[:37].get()
    assert rel_err(logits, ref.forward(data.normalize(x), train=False)[0]) < step_tol(version)
    assert int(step.correct.get()[0]) == int((logits.argmax(1) == y).sum())
    assert accuracy == int((logits.argmax(1) == y).sum()) / 37


def run_steps(version, seed, batches, lr, mode):
    """Train a fresh net on the batches through a Step in `mode`. Each step tells the runner the next
    batch (a graph step loads it while it computes), except the step at `prefetch_gap`, so that the step
    after it stages and loads its own batch. Returns (losses, the flat parameter buffer)."""
    from mnist_cuda.step import Step

    net = make_net((32, 64), 128, seed, version, len(batches[0][0]))
    step = Step(net, lr, mode=mode)
    step.losses(reset=True)
    x, y = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    idxs = np.arange(len(x)).reshape(len(batches), -1)
    prefetch_gap = len(batches) // 2
    for i, idx in enumerate(idxs):
        next_idx = idxs[i + 1] if i + 1 < len(idxs) and i != prefetch_gap else None
        step.run(x, y, idx, next_idx)
    step.synchronize()
    return step.losses(), net.params.params.get()


@pytest.mark.parametrize("version", VERSIONS)
def test_deterministic_and_graph_equals_eager(version):
    rng = np.random.default_rng()
    batches = [random_batch(rng, 64) for _ in range(30)]
    seed = int(rng.integers(1000))
    runs = [run_steps(version, seed, batches, 0.05, mode) for mode in ("eager", "eager", "graph")]
    for losses, params in runs[1:]:
        assert np.array_equal(losses, runs[0][0])  # bit for bit
        assert np.array_equal(params, runs[0][1])
    assert len(runs[0][0]) == 30 and np.all(np.isfinite(runs[0][0]))


def test_phase_graphs_equal_eager():
    """One graph per phase (the per-phase timing mode) computes what the eager launches compute, bit for
    bit."""
    rng = np.random.default_rng()
    batches = [random_batch(rng, 64) for _ in range(6)]
    seed = int(rng.integers(1000))
    (eager_losses, eager_params), (phase_losses, phase_params) = (
        run_steps("fast", seed, batches, 0.05, mode) for mode in ("eager", "phases")
    )
    assert len(eager_losses) == 6 and np.all(np.isfinite(eager_losses))
    assert np.array_equal(phase_losses, eager_losses)
    assert np.array_equal(phase_params, eager_params)


@pytest.mark.parametrize("version", VERSIONS)
def test_one_epoch_on_mnist_reaches_98_percent(version):
    """One epoch as train.py runs it: graph steps that load the next batch, every PHASE_SAMPLE_EVERY-th
    step eager with events between its phases."""
    folder = mnist_or_skip()
    from mnist_cuda import cuda, training
    from mnist_cuda.step import PHASES, Step, phase_times_ms

    ds = data.load("mnist", data_dir=folder, empty=cuda.pinned_empty, progress=False)
    net = make_net((32, 64), 128, seed=0, version=version, batch=64)
    step = Step(net, training.DEFAULTS["lr"])
    batches = list(data.batch_indices(data.epoch_order(60000, 0, 0), 64, drop_last=True))
    event_lists = []
    for idx, next_idx in data.with_next(batches):
        events = None
        if step.count % training.PHASE_SAMPLE_EVERY == 0:
            events = [net.cp.cuda.Event() for _ in range(len(PHASES) + 1)]
            event_lists.append(events)
        step.run(ds.train_x, ds.train_y, idx, next_idx, mode="eager" if events else None, events=events)
    losses = step.losses()
    assert len(losses) == 937 and np.all(np.isfinite(losses))
    times = phase_times_ms(event_lists)
    assert times.shape == (19, len(PHASES)) and np.all(times >= 0)
    accuracy = step.evaluate(ds.test_x, ds.test_y)
    assert accuracy >= 0.98, accuracy


def test_one_epoch_on_fashion_mnist():
    """The trainer's step on Fashion-MNIST's real files, where they are given: one epoch of the fast kernels
    at the default batch and rate learns its ten classes (a CNN of this size reaches ~85% in one epoch)."""
    from conftest import fashion_or_skip

    folder = fashion_or_skip()
    from mnist_cuda import cuda, training
    from mnist_cuda.step import Step

    ds = data.load("fashion-mnist", data_dir=folder, empty=cuda.pinned_empty, progress=False)
    step = Step(make_net((32, 64), 128, seed=0, version="fast", batch=64), training.DEFAULTS["lr"])
    batches = list(data.batch_indices(data.epoch_order(60000, 0, 0), 64, drop_last=True))
    for idx, next_idx in data.with_next(batches):
        step.run(ds.train_x, ds.train_y, idx, next_idx)
    assert np.all(np.isfinite(step.losses()))
    accuracy = step.evaluate(ds.test_x, ds.test_y)
    assert accuracy >= 0.82, accuracy
