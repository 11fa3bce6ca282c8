"""A run of several models on the GPU (needs the real MNIST files): every model's losses, final weights and test
accuracy are those of its single run with the same flags, bit for bit, at K = 1, 3 and 8 models with mixed seeds
and hyperparameters, in each precision (the fast kernels step all K models in one launch each: nets.ModelsNet);
the trainer's --ensemble is the evaluator's ensemble of the run's checkpoints."""

from __future__ import annotations

import json
import re

import pytest

from conftest import MNIST_HINT, find_mnist_dir
from mnist_cuda import checkpoint
from mnist_cuda.evaluate import main as evaluate_main
from mnist_cuda.train import main as train_main

pytestmark = pytest.mark.gpu
STEPS = "12"


@pytest.fixture(scope="module")
def mnist_dir():
    folder = find_mnist_dir()
    if folder is None:
        pytest.skip(MNIST_HINT)
    return folder


def _losses(path, model=None) -> list[float]:
    records = [json.loads(line) for line in open(path)]
    return [r["loss"] for r in records if "loss" in r and r.get("model") == model]


def _same_bits(a_path, b_path) -> None:
    a, b = checkpoint.load_checkpoint(a_path)[0], checkpoint.load_checkpoint(b_path)[0]
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def _init_set(tmp_path, precision):
    """Three checkpoints of mixed seeds and optimizers (a run of K = 3 continues them)."""
    flags = [
        ["--seed", "3"],
        ["--seed", "4", "--momentum", "0.9", "--nesterov", "--lr", "0.02"],
        ["--seed", "5", "--weight-decay", "5e-4", "--schedule", "cosine", "--epochs", "1", "--augment", "2"],
    ]
    paths = []
    for i, f in enumerate(flags):
        paths.append(str(tmp_path / f"start{i}.npz"))
        assert train_main(f + ["--precision", precision, "--steps", "0", "--save", paths[-1]]) == 0
    return paths


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_each_model_is_its_single_run_bit_for_bit(k, precision, mnist_dir, tmp_path, capsys):
    common = ["--data-dir", str(mnist_dir), "--steps", STEPS, "--quiet", "--precision", precision]
    if k == 3:
        starts = _init_set(tmp_path, precision)
        many, singles = ["--init", *starts], [["--init", s] for s in starts]
        common = [c for c in common if c not in ("--precision", precision)]
    elif k == 8:
        many = ["--seed", "0,1", "--lr", "0.02,0.05", "--augment", "0,2", "--momentum", "0.9"]
        singles = [
            ["--seed", str(s), "--lr", str(lr), "--augment", str(a), "--momentum", "0.9"]
            for s in (0, 1)
            for lr in (0.02, 0.05)
            for a in (0, 2)
        ]
    else:  # one model through the many-model loop
        many, singles = ["--seed", "6", "--lr", "0.03"], [["--seed", "6", "--lr", "0.03"]]
    run = tmp_path / "many.npz"
    if k == 1:
        _train_one_model_as_many(many + common + ["--save", str(run), "--metrics", str(tmp_path / "many.jsonl")])
    else:
        assert train_main(many + common + ["--save", str(run), "--metrics", str(tmp_path / "many.jsonl")]) == 0
    out = capsys.readouterr().out
    found = re.findall(r"^  (\S+) +(\d+\.\d+)%$", out, re.M)
    assert len(found) == k, out
    for (name, accuracy), flags in zip(found, singles):
        alone = tmp_path / f"alone-{name}"
        assert train_main(flags + common + ["--save", f"{alone}.npz", "--metrics", f"{alone}.jsonl"]) == 0
        assert f"test accuracy {accuracy}% after {STEPS} steps" in capsys.readouterr().out
        assert _losses(tmp_path / "many.jsonl", name) == _losses(f"{alone}.jsonl")
        assert len(_losses(f"{alone}.jsonl")) == int(STEPS)
        _same_bits(tmp_path / f"many-{name}.npz", f"{alone}.npz")


def test_two_models_at_512_images_are_their_single_runs_in_bf16(mnist_dir, tmp_path, capsys):
    """From 512 images a model the bf16 step gives fc1 bf16 copies of its weight and dy (linear_splitk.operand_dtype),
    the models' copies one after another: two models at once are still their single runs, bit for bit."""
    from mnist_cuda.ops import linear_splitk

    assert linear_splitk.BF16_OPERANDS_MIN_BATCH <= 512
    common = ["--data-dir", str(mnist_dir), "--steps", "4", "--quiet", "--precision", "bf16", "--batch-size", "512"]
    run = tmp_path / "many.npz"
    assert train_main(["--seed", "0,1"] + common + ["--save", str(run), "--metrics", str(tmp_path / "many.jsonl")]) == 0
    found = re.findall(r"^  (\S+) +(\d+\.\d+)%$", capsys.readouterr().out, re.M)
    assert len(found) == 2
    for (name, accuracy), seed in zip(found, ("0", "1")):
        alone = tmp_path / f"alone-{name}"
        assert train_main(["--seed", seed] + common + ["--save", f"{alone}.npz", "--metrics", f"{alone}.jsonl"]) == 0
        assert f"test accuracy {accuracy}% after 4 steps" in capsys.readouterr().out
        assert _losses(tmp_path / "many.jsonl", name) == _losses(f"{alone}.jsonl")
        _same_bits(tmp_path / f"many-{name}.npz", f"{alone}.npz")


def _train_one_model_as_many(argv):
    from mnist_cuda import model_grid
    from mnist_cuda.train_arguments import build_parser
    from mnist_cuda.train_many import train_many

    parser = build_parser()
    args = parser.parse_args(argv)
    models = model_grid.expand(args, parser)
    assert len(models) == 1
    assert train_many(models, args, parser) == 0


def test_the_trainers_ensemble_is_the_evaluators(mnist_dir, tmp_path, capsys):
    argv = ["--seed", "0-2", "--steps", "150", "--quiet", "--data-dir", str(mnist_dir), "--ensemble"]
    assert train_main(argv + ["--save", str(tmp_path / "run.npz")]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ensemble of the 3 models")]
    correct = int(re.search(r"\((\d+) of 10000", line[0]).group(1))
    paths = [str(tmp_path / f"run-seed{s}.npz") for s in range(3)]
    assert evaluate_main(paths + ["--data-dir", str(mnist_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["correct"] == correct


def test_the_naive_kernels_models_side_by_side_are_their_single_runs(mnist_dir, tmp_path, capsys):
    """The naive kernels take no model index: their models step on streams side by side, each its own runner."""
    common = ["--kernels", "naive", "--data-dir", str(mnist_dir), "--steps", "5", "--quiet"]
    assert train_main(["--seed", "0,1"] + common + ["--metrics", str(tmp_path / "many.jsonl")]) == 0
    assert "on their own streams" in capsys.readouterr().out
    for seed in (0, 1):
        assert train_main(["--seed", str(seed)] + common + ["--metrics", str(tmp_path / f"{seed}.jsonl")]) == 0
        assert _losses(tmp_path / "many.jsonl", f"seed{seed}") == _losses(tmp_path / f"{seed}.jsonl")
