"""`python -m mnist_cuda.evaluate` and `python -m mnist_cuda.predict`: bad input is one line and exit 2
before any GPU work (CPU); on the GPU, evaluate gives the trainer's accuracy for the same checkpoint and
predict gives evaluate's class for MNIST test images saved as PNG."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import one_line_usage_error, run_train

from conftest import REPO, mnist_or_skip
from mnist_cuda import checkpoint, evaluate, reference


def run_module(module, *args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.fixture
def small_checkpoint(tmp_path):
    return checkpoint.save_checkpoint(
        tmp_path / "small.npz",
        reference.init_state_dict(0, (4, 8), 16),
        {"dataset": "mnist", "batch_size": 32, "kernels": "naive", "tf32": False},
    )


@pytest.mark.parametrize("module", ["mnist_cuda.evaluate", "mnist_cuda.predict"])
def test_bad_checkpoints(module, tmp_path):
    images = [str(tmp_path / "x.png")] if module.endswith("predict") else []
    (tmp_path / "x.png").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello")
    one_line_usage_error(run_module(module, str(tmp_path / "none.npz"), *images), "CHECKPOINT", "does not exist")
    one_line_usage_error(
        run_module(module, str(tmp_path / "notes.txt"), *images), "CHECKPOINT", "not an .npz archive", "--save PATH"
    )
    one_line_usage_error(run_module(module, str(tmp_path), *images), "is a folder")


def test_evaluate_bad_flags(small_checkpoint, tmp_path):
    ck = str(small_checkpoint)
    one_line_usage_error(
        run_module("mnist_cuda.evaluate", ck, "--png", str(tmp_path / "no" / "c.png")), "--png", "does not exist"
    )
    one_line_usage_error(run_module("mnist_cuda.evaluate", ck, "--png", str(tmp_path)), "--png", "is a folder")
    one_line_usage_error(run_module("mnist_cuda.evaluate", ck, "--tf32"), "--precision", "tf32 needs --kernels fast")
    one_line_usage_error(
        run_module("mnist_cuda.evaluate", ck, "--precision", "bf16"), "--precision", "bf16 needs --kernels fast"
    )
    one_line_usage_error(run_module("mnist_cuda.evaluate", ck, "--batch-size", "0"), "--batch-size")
    one_line_usage_error(run_module("mnist_cuda.evaluate", ck, "--dataset", "cifar"), "--dataset")
    one_line_usage_error(run_module("mnist_cuda.evaluate", ck, "--data-dir", str(tmp_path / "nope")), "--data-dir")
    (tmp_path / "empty").mkdir()
    one_line_usage_error(
        run_module("mnist_cuda.evaluate", ck, "--data-dir", str(tmp_path / "empty")), "has no t10k-images-idx3-ubyte"
    )  # only the test files are needed
    one_line_usage_error(run_module("mnist_cuda.evaluate"), "the following arguments are required: CHECKPOINT")


@pytest.mark.parametrize("module", ["mnist_cuda.evaluate", "mnist_cuda.predict"])
def test_a_model_too_large_for_the_batch_is_the_checkpoints(module, tmp_path):
    """No flag of evaluate or predict makes the model: a batch its activations cannot take blames CHECKPOINT and
    names the checkpoint's model, not the trainer's --channels and --hidden."""
    ck = checkpoint.save_checkpoint(
        tmp_path / "wide.npz",
        reference.init_state_dict(0, (4, 4096), 1),
        {"dataset": "mnist", "batch_size": 32, "kernels": "fast"},
    )
    images = [str(tmp_path / "x.png")] if module.endswith("predict") else []
    (tmp_path / "x.png").write_bytes(b"")
    line = one_line_usage_error(
        run_module(module, str(ck), *images, "--batch-size", "1000"),
        "argument CHECKPOINT:",
        "batch 1,000 with the checkpoint's model (channels 4,4096, hidden 1) needs",
        "at most batch 668 with this model",
    )
    assert "--channels" not in line and "--hidden" not in line


def test_predict_bad_images_are_named_before_the_gpu(small_checkpoint, tmp_path):
    pytest.importorskip("PIL")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "empty.png").write_bytes(b"")
    r = run_module(
        "mnist_cuda.predict",
        str(small_checkpoint),
        str(tmp_path / "notes.txt"),
        str(tmp_path / "empty.png"),
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 2, r.stderr
    assert "notes.txt" in lines[0] and "empty.png" in lines[1]
    one_line_usage_error(
        run_module("mnist_cuda.predict", str(small_checkpoint), str(tmp_path / "none.png")),
        "IMAGE",
        "none.png does not exist",
    )
    one_line_usage_error(
        run_module("mnist_cuda.predict", str(small_checkpoint)), "the following arguments are required: IMAGE"
    )


def test_predict_without_pillow_names_the_extra(small_checkpoint, tmp_path):
    (tmp_path / "x.png").write_bytes(b"\x89PNG")
    code = (
        "import sys; sys.modules['PIL'] = None; from mnist_cuda.predict import main; "
        f"sys.exit(main([{str(small_checkpoint)!r}, {str(tmp_path / 'x.png')!r}]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    one_line_usage_error(r, "needs Pillow", "pip install '.[image]'")


def test_report_counts_and_orders_mistakes():
    logits = np.array([[2, 1, 0], [0, 3, 0], [5, 0, 0], [0, 0, 1], [1, 1, 0]], np.float32)
    labels = np.array([0, 1, 1, 2, 1])
    r = evaluate.report(logits, labels, ("a", "b", "c"))
    assert r["correct"] == 3 and r["accuracy"] == 0.6
    assert r["confusion"] == [[1, 0, 0], [2, 1, 0], [0, 0, 1]]  # the tie [1, 1, 0] goes to the first class
    assert r["per_class"] == {"a": 1.0, "b": pytest.approx(1 / 3), "c": 1.0}
    assert [m["index"] for m in r["misclassified"]] == [2, 4]  # the most confident mistake first
    log_p = evaluate.log_softmax(logits.astype(np.float64))
    assert r["loss"] == pytest.approx(-np.mean(log_p[np.arange(5), labels]))


# ---- ensembles ---------------------------------------------------------------------------------------


def test_ensemble_is_the_mean_of_the_probabilities_not_a_vote():
    """Two models vote for class 0 by a hair, one is sure of class 1: the mean probability picks 1."""
    unsure = np.log(np.array([[0.51, 0.49, 0.0001]]))
    sure = np.log(np.array([[0.01, 0.98, 0.01]]))
    scores = evaluate.ensemble_log_probs([unsure, unsure, sure])
    probs = np.mean([np.exp(evaluate.log_softmax(z)) for z in (unsure, unsure, sure)], axis=0)
    np.testing.assert_allclose(np.exp(scores), probs, rtol=1e-12)
    assert scores.argmax(axis=1).tolist() == [1]
    z = np.random.default_rng(0).standard_normal((7, 10)).astype(np.float32)
    np.testing.assert_allclose(evaluate.ensemble_log_probs([z, z]), evaluate.log_softmax(z), atol=1e-12)


def test_ensemble_evaluation_on_the_float64_reference():
    """The ensemble's report from three models' float64 reference logits (evaluation mode): each model's figures
    as report() gives them alone, and the ensemble's accuracy, loss and confusion those of the mean of their
    softmaxes, computed here independently."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 40)
    x = (images / 255.0 - 0.1307) / 0.3081
    names = tuple(str(c) for c in range(10))
    results = []
    for seed in range(3):
        logits, _ = reference.ReferenceModel(reference.init_state_dict(seed, (4, 8), 16)).forward(x, train=False)
        m = evaluate.Model(
            Path(f"m{seed}.npz"),
            {},
            {"step": 9},
            (4, 8),
            16,
            dict(dataset="mnist", batch_size=8, kernels="fast", precision="fp32"),
        )
        results.append((m, logits, evaluate.describe(m, evaluate.report(logits, labels, names))))
    r = evaluate.ensemble(results, labels, names)
    assert r["ensemble_of"] == 3 and [m["checkpoint"] for m in r["models"]] == ["m0.npz", "m1.npz", "m2.npz"]
    for m, (_, logits, _) in zip(r["models"], results):
        assert m["correct"] == int((logits.argmax(axis=1) == labels).sum())
    p = (
        sum(
            np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)
            for _, z, _ in results
        )
        / 3
    )
    assert r["correct"] == int((p.argmax(axis=1) == labels).sum())
    assert r["loss"] == pytest.approx(-np.mean(np.log(p[np.arange(40), labels])), rel=1e-12)
    assert np.array(r["confusion"]).trace() == r["correct"]


def _saved(tmp_path, name, channels=(4, 8), hidden=16, dataset="mnist"):
    return checkpoint.save_checkpoint(
        tmp_path / f"{name}.npz",
        reference.init_state_dict(0, channels, hidden),
        {"dataset": dataset, "batch_size": 32, "kernels": "fast", "tf32": False},
    )


def test_an_ensemble_of_mismatched_checkpoints_is_refused_before_any_work(tmp_path):
    a, b = _saved(tmp_path, "a"), _saved(tmp_path, "b")
    other = _saved(tmp_path, "other", channels=(4, 6))
    fashion = _saved(tmp_path, "fashion", dataset="fashion-mnist")
    ev = lambda *args: run_module("mnist_cuda.evaluate", *map(str, args))
    one_line_usage_error(ev(a, b, other), "CHECKPOINT", str(other), "4,6 / 16", "one architecture")
    one_line_usage_error(ev(a, a), "CHECKPOINT", "given twice")
    link = tmp_path / "again.npz"
    link.symlink_to(a)
    one_line_usage_error(ev(a, link), "CHECKPOINT", "given twice")
    one_line_usage_error(ev(a, fashion), "CHECKPOINT", "fashion-mnist", "one test set")
    one_line_usage_error(ev(a, b, tmp_path / "none.npz"), "CHECKPOINT", "does not exist")
    one_line_usage_error(ev(a, b, "--png", b), "--png", "CHECKPOINT")


# ---- on the GPU ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint after 300 steps at batch 100 (not a divisor of the test set: a partial last batch)."""
    folder = mnist_or_skip()
    d = tmp_path_factory.mktemp("trained")
    ck, metrics = d / "m.npz", d / "m.jsonl"
    r = run_train(
        "--data-dir",
        str(folder),
        "--steps",
        "300",
        "--batch-size",
        "96",
        "--save",
        str(ck),
        "--metrics",
        str(metrics),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    return folder, ck, metrics


@pytest.mark.gpu
def test_evaluate_gives_the_trainers_accuracy(trained, tmp_path):
    folder, ck, metrics = trained
    r = run_module(
        "mnist_cuda.evaluate", str(ck), "--data-dir", str(folder), "--json", "--png", str(tmp_path / "e.png")
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    last = [json.loads(line) for line in metrics.read_text().splitlines()][-1]
    _, meta = checkpoint.load_checkpoint(ck)
    assert report["accuracy"] == last["test_accuracy"] == meta["test_accuracy"]
    assert report["batch_size"] == 96 and report["samples"] == 10000
    confusion = np.array(report["confusion"])
    assert confusion.sum() == 10000 and confusion.trace() == report["correct"]
    assert confusion.sum(axis=1).tolist() == np.bincount(load_test_labels(folder), minlength=10).tolist()
    assert 0 < report["loss"] < 0.5 and len(report["misclassified"]) == 10000 - report["correct"]
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_module("mnist_cuda.evaluate", str(ck), "--data-dir", str(folder))
    assert text.returncode == 0 and f"test accuracy {100 * report['accuracy']:.2f}%" in text.stdout
    assert "confusion matrix" in text.stdout


def load_test_labels(folder):
    from mnist_cuda import data

    return data.load_arrays("mnist", folder, progress=False)[3]


@pytest.mark.gpu
def test_predict_on_test_images_saved_as_png(trained, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    from mnist_cuda import data

    folder, ck, _ = trained
    test_x = data.load_arrays("mnist", folder, progress=False)[2]
    report = json.loads(run_module("mnist_cuda.evaluate", str(ck), "--data-dir", str(folder), "--json").stdout)
    labels = load_test_labels(folder)
    evaluated = labels.copy()  # evaluate's class of each test image: its label unless it is a mistake
    for m in report["misclassified"]:
        evaluated[m["index"]] = int(m["predicted"])
    picks = list(range(40)) + [m["index"] for m in report["misclassified"][:5]]
    paths = []
    for i in picks:
        path = tmp_path / f"test{i}.png"
        Image.fromarray(test_x[i]).save(path)
        paths.append(str(path))
    r = run_module("mnist_cuda.predict", str(ck), *paths, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["predictions"]
    assert [p["index"] for p in got] == [int(evaluated[i]) for i in picks]
    for p in got:
        assert sum(p["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    text = run_module("mnist_cuda.predict", str(ck), paths[0])
    assert text.returncode == 0 and text.stdout.split()[1] == str(evaluated[picks[0]])


@pytest.mark.gpu
def test_evaluate_an_ensemble(trained, tmp_path):
    """Each model's accuracy is the one it has alone; an ensemble of a model with itself is that model."""
    import shutil

    folder, ck, _ = trained
    twin = tmp_path / "twin.npz"
    shutil.copyfile(ck, twin)
    alone = json.loads(run_module("mnist_cuda.evaluate", str(ck), "--data-dir", str(folder), "--json").stdout)
    r = run_module("mnist_cuda.evaluate", str(ck), str(twin), "--data-dir", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    both = json.loads(r.stdout)
    assert both["ensemble_of"] == 2 and [m["accuracy"] for m in both["models"]] == [alone["accuracy"]] * 2
    assert both["correct"] == alone["correct"] and both["confusion"] == alone["confusion"]
    assert both["loss"] == pytest.approx(alone["loss"], rel=1e-12)
    text = run_module(
        "mnist_cuda.evaluate", str(ck), str(twin), "--data-dir", str(folder), "--png", str(tmp_path / "e.png")
    )
    assert text.returncode == 0, text.stderr
    assert "the ensemble of 2 models" in text.stdout and f"{100 * alone['accuracy']:.2f}%" in text.stdout
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
