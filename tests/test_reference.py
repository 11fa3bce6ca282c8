"""The float64 reference against finite differences, and against PyTorch on the CPU where installed."""

import numpy as np
import pytest

from mnist_cuda import reference as ref

RTOL = 1e-6


def rel_err(a, b):
    return np.linalg.norm(np.ravel(a) - np.ravel(b)) / max(np.linalg.norm(np.ravel(b)), 1e-300)


def numeric_grad(f, x, h=1e-6):
    """Central differences of the scalar f() with respect to every entry of x (modified in place)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_conv2d_gradients(rng):
    x, w = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((4, 3, 3, 3))
    r = rng.standard_normal((2, 4, 5, 6))
    loss = lambda: np.sum(ref.conv2d_forward(x, w) * r)
    dx, dw = ref.conv2d_backward(x, w, r)
    assert rel_err(dx, numeric_grad(loss, x)) < RTOL
    assert rel_err(dw, numeric_grad(loss, w)) < RTOL


def test_conv2d_matches_direct_definition(rng):
    x, w = rng.standard_normal((1, 2, 4, 3)), rng.standard_normal((3, 2, 3, 3))
    y = ref.conv2d_forward(x, w)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for k in range(3):
        for h in range(4):
            for v in range(3):
                assert np.isclose(y[0, k, h, v], np.sum(xp[0, :, h : h + 3, v : v + 3] * w[k]))


def test_batchnorm_train_gradients(rng):
    x = rng.standard_normal((3, 4, 5, 5)) * 2 + 1
    gamma, beta = rng.standard_normal(4), rng.standard_normal(4)
    r = rng.standard_normal(x.shape)
    loss = lambda: np.sum(ref.batchnorm_forward_train(x, gamma, beta)[0] * r)
    y, cache = ref.batchnorm_forward_train(x, gamma, beta)
    dx, dgamma, dbeta = ref.batchnorm_backward(r, gamma, cache)
    assert rel_err(dx, numeric_grad(loss, x)) < RTOL
    assert rel_err(dgamma, numeric_grad(loss, gamma)) < RTOL
    assert rel_err(dbeta, numeric_grad(loss, beta)) < RTOL
    # normalised output: per channel mean beta and (biased) std |gamma|
    assert np.allclose(y.mean(axis=(0, 2, 3)), beta)
    assert np.allclose(y.std(axis=(0, 2, 3)), np.abs(gamma), rtol=1e-4)


def test_batchnorm_running_update_uses_unbiased_variance():
    rm, rv = ref.batchnorm_running_update(np.zeros(1), np.ones(1), np.array([2.0]), np.array([3.0]), 4)
    assert np.allclose(rm, 0.2) and np.allclose(rv, 0.9 + 0.1 * 3.0 * 4 / 3)


def test_relu_and_maxpool_gradients(rng):
    x = rng.standard_normal((2, 3, 6, 4))
    r = rng.standard_normal((2, 3, 3, 2))
    loss = lambda: np.sum(ref.maxpool_forward(ref.relu_forward(x))[0] * r)
    y, argmax = ref.maxpool_forward(ref.relu_forward(x))
    dx = ref.relu_backward(ref.maxpool_backward(r, argmax, x.shape), ref.relu_forward(x))
    assert rel_err(dx, numeric_grad(loss, x)) < RTOL


def test_maxpool_first_maximum_and_odd_sizes():
    x = np.zeros((1, 1, 5, 5))  # all ties, odd size: the last row/column are dropped
    y, argmax = ref.maxpool_forward(x)
    assert y.shape == (1, 1, 2, 2) and np.all(argmax == 0)
    dx = ref.maxpool_backward(np.ones((1, 1, 2, 2)), argmax, x.shape)
    assert dx.sum() == 4 and dx[0, 0, 0, 0] == 1 and dx[0, 0, 4].sum() == 0 and dx[0, 0, :, 4].sum() == 0
    x = np.array([[[[1.0, 3.0], [3.0, 2.0]]]])
    assert ref.maxpool_forward(x)[1][0, 0, 0, 0] == 1  # (0,1) comes before (1,0)


def test_linear_and_nll_gradients(rng):
    x, w, b = rng.standard_normal((4, 7)), rng.standard_normal((10, 7)), rng.standard_normal(10)
    labels = rng.integers(0, 10, 4)
    loss = lambda: ref.nll_loss(ref.linear_forward(x, w, b), labels)[0]
    _, dlogits = ref.nll_loss(ref.linear_forward(x, w, b), labels)
    dx, dw, db = ref.linear_backward(x, w, dlogits)
    assert rel_err(dx, numeric_grad(loss, x)) < RTOL
    assert rel_err(dw, numeric_grad(loss, w)) < RTOL
    assert rel_err(db, numeric_grad(loss, b)) < RTOL


def test_whole_model_gradients_against_finite_differences(rng):
    state = ref.init_state_dict(seed=3, channels=(3, 4), hidden=5)
    model = ref.ReferenceModel(state)
    for name in ("bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"):  # move BN off its trivial init
        model.state[name] = model.state[name] + rng.standard_normal(model.state[name].shape) * 0.3
    x, labels = rng.standard_normal((3, 1, 28, 28)), rng.integers(0, 10, 3)
    loss, grads, _ = model.loss_and_grads(x, labels)
    for name, g in grads.items():
        num = numeric_grad(lambda: model.loss_and_grads(x, labels)[0], model.state[name])
        assert rel_err(g, num) < RTOL, name


def test_state_dict_names_shapes_and_init_bounds():
    state = ref.init_state_dict(seed=0)
    assert list(state) == [
        "conv1.weight",
        "bn1.weight",
        "bn1.bias",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.num_batches_tracked",
        "conv2.weight",
        "bn2.weight",
        "bn2.bias",
        "bn2.running_mean",
        "bn2.running_var",
        "bn2.num_batches_tracked",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    assert state["fc1.weight"].shape == (128, 64 * 49) and state["fc1.weight"].dtype == np.float32
    for name, fan_in in (("conv1.weight", 9), ("conv2.weight", 32 * 9), ("fc1.weight", 3136), ("fc2.weight", 128)):
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(state[name]).max() <= bound and np.abs(state[name]).max() > 0.9 * bound
    assert np.array_equal(state["conv2.weight"], ref.init_state_dict(seed=0)["conv2.weight"])
    assert not np.array_equal(state["conv2.weight"], ref.init_state_dict(seed=1)["conv2.weight"])


def test_train_step_updates_running_stats_and_lowers_loss(rng):
    model = ref.ReferenceModel(ref.init_state_dict(seed=0, channels=(4, 6), hidden=16))
    x, labels = rng.standard_normal((8, 1, 28, 28)), rng.integers(0, 10, 8)
    losses = [model.train_step(x, labels, lr=0.1) for _ in range(5)]
    assert losses[-1] < losses[0]
    assert int(model.state["bn1.num_batches_tracked"]) == 5
    assert not np.allclose(model.state["bn1.running_mean"], 0)


# ---- against PyTorch (CPU, float64) ----------------------------------------------------------


def test_reference_matches_torch(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]' in the source folder)")
    from mnist_cuda.torch_model import make_torch_model

    state = ref.init_state_dict(seed=5, channels=(6, 10), hidden=20)
    net = make_torch_model((6, 10), 20).double()
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    model = ref.ReferenceModel(state)
    x, labels = rng.standard_normal((5, 1, 28, 28)), rng.integers(0, 10, 5)

    loss, grads, cache = model.loss_and_grads(x, labels)
    net.train()
    out = net(torch.from_numpy(x))
    tloss = torch.nn.functional.nll_loss(out, torch.from_numpy(labels))
    tloss.backward()
    assert abs(loss - tloss.item()) < 1e-12
    assert rel_err(np.exp(ref.log_softmax(cache["logits"])), out.exp().detach().numpy()) < 1e-12
    tgrads = {k: p.grad.numpy() for k, p in net.named_parameters()}
    for name, g in grads.items():
        assert rel_err(g, tgrads[name]) < 1e-10, name

    # one SGD step: parameters and running statistics, then eval mode
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt.step()
    model.train_step(x, labels, lr=0.1)  # recomputes the same gradients, updates running stats
    tstate = {k: v.numpy() for k, v in net.state_dict().items()}
    for name, v in model.state.items():
        if name.startswith("bn") and "running" in name or name in grads:
            assert rel_err(v, tstate[name]) < 1e-10, name
    assert int(model.state["bn1.num_batches_tracked"]) == int(tstate["bn1.num_batches_tracked"])
    net.eval()
    with torch.no_grad():
        tlogits = net(torch.from_numpy(x)).numpy()
    assert rel_err(ref.log_softmax(model.forward(x, train=False)[0]), tlogits) < 1e-10


def test_imposed_decisions(rng):
    """forward(decisions=...) with the model's own choices changes nothing; one flipped choice changes
    the pooled output visibly (which is what the GPU step test checks) and the gradients."""
    model = ref.ReferenceModel(ref.init_state_dict(seed=2, channels=(3, 4), hidden=6))
    x, labels = rng.standard_normal((2, 1, 28, 28)), rng.integers(0, 10, 2)
    loss, grads, cache = model.loss_and_grads(x, labels)
    own = model.decisions_of(cache)
    loss2, grads2, cache2 = model.loss_and_grads(x, labels, own)
    assert loss2 == loss and all(np.array_equal(grads[k], grads2[k]) for k in grads)
    assert np.array_equal(cache2["pooled2"], cache["pooled2"]) and np.array_equal(cache2["fc1"], cache["fc1"])

    argmax, open_ = own["block1"]
    where = tuple(np.argwhere(open_)[0])  # an open window: move its choice to another position
    flipped = dict(own, block1=(argmax.copy(), open_))
    flipped["block1"][0][where] = (argmax[where] + 1) % 4
    _, grads3, cache3 = model.loss_and_grads(x, labels, flipped)
    assert np.abs(cache3["pooled1"] - cache["pooled1"]).max() > 1e-6
    assert rel_err(grads3["conv1.weight"], grads["conv1.weight"]) > 1e-9

    closed = dict(own, fc1=np.zeros_like(own["fc1"]))  # every fc1 unit blocked: no gradient below fc1
    _, grads4, _ = model.loss_and_grads(x, labels, closed)
    assert not grads4["fc1.weight"].any() and not grads4["conv2.weight"].any()
