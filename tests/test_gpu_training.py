"""The whole training step against the reference, graph replay, determinism, and real training (GPU)."""
import numpy as np
import pytest

from conftest import find_mnist_dir
from mnist_cuda import data, reference
from mnist_cuda.kernel_checks import rel_err

pytestmark = pytest.mark.gpu
STEP_TOL = 1e-4
DECISION_TOL = 1e-4  # how far from a tie (or from zero) a choice the kernels took may be, in float64
# "tf32": the fast kernels with conv2's products in plain TF32 (Model(tf32=True), --tf32): ~3e-4 per product
TF32_STEP_TOL = 3e-3
VERSIONS = ("naive", "fast", "tf32")


def step_tol(version):
    return TF32_STEP_TOL if version == "tf32" else STEP_TOL


def make_model(channels, hidden, seed, version="naive"):
    from mnist_cuda.model import Model
    model = Model(channels, hidden, "fast" if version == "tf32" else version, tf32=version == "tf32")
    model.load_state_dict(reference.init_state_dict(seed, channels, hidden))
    return model


def random_batch(rng, n):
    """Random images as bytes (what the GPU gets) and labels."""
    return rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int32)


def stage(ws, slot, x, y):
    ws.stage_x[slot][:len(x)] = x
    ws.stage_y[slot][:len(y)] = y


def kernel_decisions(ws, n):
    """The ReLU and max-pool choices the kernels took in the last training forward (see
    reference.ReferenceModel.forward): each block's argmax and open windows, fc1's ReLU mask."""
    out = {f"block{i}": (b.argmax[:n].get(), b.out[:n].get() > 0) for i, b in ((1, ws.block1), (2, ws.block2))}
    out["fc1"] = ws.fc1.out[:n].get() > 0
    return out


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("batch,channels,hidden", [(1, (32, 64), 128), (3, (5, 7), 33), (64, (32, 64), 128),
                                                   (65, (5, 7), 33)])
def test_training_step_matches_reference(batch, channels, hidden, version):
    import cupy
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    model = make_model(channels, hidden, seed, version)
    ref = reference.ReferenceModel(reference.init_state_dict(seed, channels, hidden))
    x, y = random_batch(rng, batch)
    ws = model.workspace(batch)
    stage(ws, 0, x, y)
    model.grads.fill(np.nan)  # every gradient element must be written by backward
    model.load(ws, 0, batch)
    model.forward(ws, batch)
    model.backward(ws, batch)
    # The oracle takes the kernels' ReLU and max-pool choices: among 10^5..10^6 of them, one that sits
    # within float32 rounding of a tie or of zero may go the other way than in float64, and flip a
    # gradient path (conv1's weight gradient, a sum with heavy cancellation through BatchNorm, then
    # misses 1e-4 in a few runs of 60). Those choices must be near-ties: the gap checks it.
    decisions = kernel_decisions(ws, batch)
    seen = data.normalize(x)  # the images as the network sees them
    loss, grads, imposed = ref.loss_and_grads(seen, y, decisions)
    _, own = ref.forward(seen)
    tol = step_tol(version)
    for key in ("pooled1", "pooled2", "fc1"):
        gap = np.abs(imposed[key] - own[key]).max()
        assert gap < max(DECISION_TOL, tol) * max(1.0, np.abs(own[key]).max()), (key, gap, seed)
    assert abs(float(ws.head.loss.get()[0]) - loss) < tol * max(1.0, abs(loss)), (float(ws.head.loss.get()[0]), loss)
    for name, g in grads.items():
        err = rel_err(model.g[name].get(), g)
        assert err < tol, (name, err, seed)
    model.update(lr=0.1)
    model.zero_grad()
    cupy.cuda.get_current_stream().synchronize()
    ref.train_step(seen, y, lr=0.1, decisions=decisions)
    model.num_batches_tracked += 1
    state = model.state_dict()
    for name, want in ref.state_dict().items():
        if name.endswith("tracked"):
            assert int(state[name]) == int(want) == 1
        else:
            err = rel_err(state[name], want)
            assert err < tol, (name, err, seed)
    assert not model.grads.any()  # zero-grad cleared the flat buffer


@pytest.mark.parametrize("version", VERSIONS)
def test_eval_forward_uses_running_stats(version):
    rng = np.random.default_rng()
    model = make_model((32, 64), 128, seed=1, version=version)
    state = model.state_dict()
    for k in ("bn1.running_mean", "bn2.running_mean"):
        state[k] = rng.standard_normal(state[k].shape).astype(np.float32)
    for k in ("bn1.running_var", "bn2.running_var"):
        state[k] = (rng.random(state[k].shape) + 0.5).astype(np.float32)
    model.load_state_dict(state)
    ref = reference.ReferenceModel(state)
    x, y = random_batch(rng, 37)
    ws = model.workspace(64)  # a partial batch, as the last evaluation batch is
    stage(ws, 1, x, y)
    ws.correct.fill(0)
    model.eval_batch(ws, 1, 37)
    logits = ws.logits[:37].get()
    assert rel_err(logits, ref.forward(data.normalize(x), train=False)[0]) < step_tol(version)
    assert int(ws.correct.get()[0]) == int((logits.argmax(1) == y).sum())


def run_steps(model, batches, lr, graph):
    """Train on the batches launch by launch, or by graph_step (each step's graph loads the next batch;
    the step after `prefetch_gap` gets no next batch and loads its own)."""
    import cupy
    ws = model.workspace(len(batches[0][0]))
    ws.losses(reset=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = [model.capture_train_step(ws, s, lr) for s in range(2)] if graph else None
    x, y = np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
    idxs = np.arange(len(x)).reshape(len(batches), -1)
    prefetch_gap = len(batches) // 2
    for i, idx in enumerate(idxs):
        if graph:
            next_idx = idxs[i + 1] if i + 1 < len(idxs) and i != prefetch_gap else None
            model.graph_step(graphs, ws, i, stream, x, y, idx, next_idx)
        else:
            slot = i % 2
            ws.stage_batch(slot, x, y, idx)
            with stream:
                model.train_step(ws, slot, lr)
                ws.stage_free[slot].record()
    stream.synchronize()
    return ws.losses(), model.params.get()


@pytest.mark.parametrize("version", VERSIONS)
def test_deterministic_and_graph_equals_eager(version):
    rng = np.random.default_rng()
    batches = [random_batch(rng, 64) for _ in range(30)]
    seed = int(rng.integers(1000))
    runs = [run_steps(make_model((32, 64), 128, seed, version), batches, 0.05, graph) for graph in (False, False, True)]
    for losses, params in runs[1:]:
        assert np.array_equal(losses, runs[0][0])  # bit for bit
        assert np.array_equal(params, runs[0][1])
    assert len(runs[0][0]) == 30 and np.all(np.isfinite(runs[0][0]))


@pytest.mark.parametrize("version", VERSIONS)
def test_one_epoch_on_mnist_reaches_98_percent(version):
    folder = find_mnist_dir()
    if folder is None:
        pytest.skip("no MNIST copy found ($MNIST_DATA_DIR, data/mnist or ../shared/mnist)")
    from mnist_cuda import kernels, train
    ds = data.load("mnist", data_dir=folder, empty=kernels.pinned_empty, progress=False)
    model = make_model((32, 64), 128, seed=0, version=version)
    ws = model.workspace(64)
    trainer = train.Trainer(model, ws, lr=train.DEFAULTS["lr"])
    for idx in data.batch_indices(data.epoch_order(60000, 0, 0), 64, drop_last=True):
        trainer.run_step(ds.train_x, ds.train_y, idx)
    losses = ws.losses()
    assert len(losses) == 937 and np.all(np.isfinite(losses))
    accuracy = train.evaluate(model, ws, ds.test_x, ds.test_y)
    assert accuracy >= 0.98, accuracy
