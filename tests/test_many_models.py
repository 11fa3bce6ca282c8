"""A trainer run of several models (CPU): the flags' lists and their cross product, the models' names and
groups, the checks before any work (one line, exit 2), the memory check that names the most models that fit,
the initial checkpoints (each the single run's bits), the summary's statistics and the curves of many models."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from mnist_cuda import checkpoint, cli, curves, model_grid, sizes
from mnist_cuda.train import main as train_main
from mnist_cuda.train_arguments import build_parser
from mnist_cuda.train_many import group_line


def usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        train_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "text, expected",
    [("3", (3,)), ("0-3", (0, 1, 2, 3)), ("0-2,7,9-10", (0, 1, 2, 7, 9, 10)), (" 4 , 5", (4, 5))],
)
def test_seed_lists_and_ranges(text, expected):
    assert cli.value_list(cli.seed, ranges=True)(text) == expected


@pytest.mark.parametrize("text", ["5-3", "1-x", "-1", "0-99999", "1,,2"])
def test_bad_seed_lists_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli.value_list(cli.seed, ranges=True)(text)


def test_the_cross_product_in_order():
    args = build_parser().parse_args(["--seed", "0-1", "--lr", "0.02,0.05", "--momentum", "0,0.9"])
    models = model_grid.expand(args, build_parser())
    got = [(m.args.seed, m.args.lr, m.args.momentum) for m in models]
    assert got == [(s, lr, mo) for s in (0, 1) for lr in (0.02, 0.05) for mo in (0, 0.9)]
    assert all(m.args.init is None for m in models)


def test_one_model_is_the_single_run_flags():
    args = build_parser().parse_args(["--seed", "3", "--lr", "0.1", "--nesterov", "--momentum", "0.9"])
    (model,) = model_grid.expand(args, build_parser())
    assert (model.args.seed, model.args.lr, model.args.nesterov, model.args.momentum) == (3, 0.1, True, 0.9)


def _named(argv):
    from mnist_cuda.train_setup import check

    parser = build_parser()
    models = model_grid.expand(parser.parse_args(argv), parser)
    model_grid.name_models(models, [check(m.args, parser) for m in models])
    return models


def test_names_say_the_flags_that_differ_and_groups_drop_the_seed():
    models = _named(["--seed", "0,1", "--lr", "0.02,0.05", "--momentum", "0.9", "--nesterov", "on,off"])
    assert models[0].name == "seed0-lr0.02-nesterov"
    assert models[1].name == "seed0-lr0.02-no-nesterov"
    assert models[-1].name == "seed1-lr0.05-no-nesterov"
    assert models[0].group == "lr0.02-nesterov"
    assert len({m.name for m in models}) == 8 and len(model_grid.groups(models)) == 4
    assert model_grid.model_path(checkpoint.Path("out/run.npz"), models[0]).name == "run-seed0-lr0.02-nesterov.npz"


def test_a_seed_sweep_is_one_group():
    models = _named(["--seed", "0-4", "--recipe", "best"])
    assert [m.name for m in models] == [f"seed{s}" for s in range(5)]
    assert {m.group for m in models} == {"all"}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--batch-size", "64,128"], "--batch-size: takes one value"),
        (["--epochs", "1,2"], "--epochs: takes one value"),
        (["--hidden", "64,128"], "--hidden: takes one value"),
        (["--steps", "1,2"], "--steps: takes one value"),
        (["--target-accuracy", "98,99"], "--target-accuracy: takes one value"),
        (["--seed", "1,1"], "--seed: lists 1 twice"),
        (["--lr", "0.05,0.050"], "--lr: lists 0.05 twice"),
        (["--nesterov", "on,true", "--momentum", "0.9"], "--nesterov: lists on twice"),
        (["--seed", "0-4", "--target-accuracy", "99"], "--target-accuracy: times one run"),
        (["--ensemble"], "--ensemble: needs several models"),
        (["--seed", "0-40", "--lr", "0.01,0.02,0.03,0.04,0.05", "--momentum", "0,0.5,0.9,0.95,0.99"], "at most 1,024"),
        (["--seed", "0,1", "--schedule", "constant,step", "--step-size", "10"], "--step-size needs --schedule step"),
        (["--seed", "0-999"], "--seed: 1,000 models at batch 64 step as one batch of 64,000 images"),
        (["--seed", "0-99", "--batch-size", "1024"], "at most 41 models at this batch step together"),
        (
            ["--seed", "0-1023", "--channels", "8,1024", "--hidden", "16", "--batch-size", "2"],
            "more than CUDA's 65,535",
        ),
    ],
)
def test_mistakes_of_a_many_model_run(argv, words, capsys):
    assert words in usage_error(argv, capsys)


def test_initial_checkpoints_are_each_the_single_runs(tmp_path, capsys):
    grid = ["--seed", "2,5", "--lr", "0.02,0.05", "--momentum", "0.9", "--steps", "0"]
    assert train_main(grid + ["--save", str(tmp_path / "run.npz")]) == 0
    for seed in (2, 5):
        for lr in (0.02, 0.05):
            alone = tmp_path / f"alone-{seed}-{lr}.npz"
            assert (
                train_main(
                    ["--seed", str(seed), "--lr", str(lr), "--momentum", "0.9", "--steps", "0", "--save", str(alone)]
                )
                == 0
            )
            a, meta_a = checkpoint.load_checkpoint(tmp_path / f"run-seed{seed}-lr{lr:g}.npz")[:2]
            b, meta_b = checkpoint.load_checkpoint(alone)[:2]
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
            assert meta_a == meta_b


def _checkpoints(tmp_path, specs):
    paths = []
    for name, flags in specs:
        path = tmp_path / f"{name}.npz"
        assert train_main(flags + ["--steps", "0", "--save", str(path)]) == 0
        paths.append(str(path))
    return paths


def test_a_checkpoint_set_that_cannot_train_together_is_refused(tmp_path, capsys):
    a, b32, wide, b = _checkpoints(
        tmp_path,
        [
            ("a", ["--seed", "0"]),
            ("b32", ["--batch-size", "32"]),
            ("wide", ["--channels", "16,32"]),
            ("b", ["--seed", "1"]),
        ],
    )
    assert "share their batch size" in usage_error(["--init", a, b32], capsys)
    assert "share their channels" in usage_error(["--init", a, wide], capsys)
    assert "are one checkpoint" in usage_error(["--init", a, a], capsys)
    assert "a list starts new models" in usage_error(["--init", a, b, "--seed", "3,4"], capsys)
    copy = tmp_path / "copy.npz"
    copy.write_bytes((tmp_path / "a.npz").read_bytes())
    assert "the same settings (seed0)" in usage_error(["--init", a, str(copy)], capsys)


def test_checkpoints_continue_as_a_run_of_several_models(tmp_path, capsys):
    a, b = _checkpoints(tmp_path, [("a", ["--seed", "0"]), ("b", ["--seed", "1"])])
    assert train_main(["--init", a, b, "--steps", "0", "--save", str(tmp_path / "next.npz")]) == 0
    assert (tmp_path / "next-seed0.npz").is_file() and (tmp_path / "next-seed1.npz").is_file()
    # an output of one model must not be another's input
    err = usage_error(["--init", a, b, "--metrics", b], capsys)
    assert "--metrics" in err


def test_the_memory_check_names_the_most_models_that_fit():
    each = sizes.device_bytes((32, 64), 128, 64, "fast", 132)
    assert sizes.models_problem(8, each, 8 * each, "--seed", 64) is None
    flag, message = sizes.models_problem(100, each, 10 * each + 5, "--seed", 64)
    assert flag == "--seed" and "at most 10 of them" in message and "100 models" in message


def test_the_models_batches_are_one_batch_to_the_kernels_indexing():
    most = sizes.most_stacked_models((32, 64), 64, 1024)
    assert most * 64 * 64 * 784 <= sizes.INDEX_LIMIT < (most + 1) * 64 * 64 * 784
    assert sizes.stacked_problem(1, (32, 64), 60_000, "--seed") is None  # one model: the single run's checks
    assert sizes.stacked_problem(most, (32, 64), 64, "--seed") is None
    flag, message = sizes.stacked_problem(most + 1, (32, 64), 64, "--lr")
    assert flag == "--lr" and f"at most {most} models" in message and "32-bit indexing" in message


def test_the_models_times_their_blocks_fit_a_grids_z():
    z = sizes.stacked_blocks_z((8, 1024), 2)
    assert 1024 * z > sizes.GRID_LIMIT  # fc1's splits of 50,176 inputs, for each of 1,024 models
    flag, message = sizes.stacked_problem(1024, (8, 1024), 2, "--seed")
    assert flag == "--seed" and f"more than CUDA's {sizes.GRID_LIMIT:,}" in message
    assert f"at most {sizes.GRID_LIMIT // z:,} models" in message
    assert sizes.stacked_problem(sizes.GRID_LIMIT // z, (8, 1024), 2, "--seed") is None


def test_group_statistics_over_seeds():
    line = group_line("lr0.02", [0.99, 0.992, 0.994])
    a = np.array([99.0, 99.2, 99.4])
    assert f"mean {a.mean():.2f}%" in line and f"std {a.std(ddof=1):.2f}" in line
    assert "min 99.00%" in line and "max 99.40%" in line and "3 seeds" in line


def test_curves_of_many_models(tmp_path):
    path = tmp_path / "m.jsonl"
    records = []
    for name, group in (("seed0-lr0.02", "lr0.02"), ("seed1-lr0.02", "lr0.02"), ("seed0-lr0.05", "lr0.05")):
        records += [{"model": name, "group": group, "step": s, "epoch": 1, "loss": 1.0 / s} for s in range(1, 80)]
        records.append({"model": name, "group": group, "step": 79, "epoch": 1, "test_accuracy": 0.98})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    runs = curves.read_metrics(path)
    assert list(runs) == ["seed0-lr0.02", "seed1-lr0.02", "seed0-lr0.05"]
    group, c = runs["seed1-lr0.02"]
    assert group == "lr0.02" and len(c.steps) == 79 and c.evals == [(79, 1, 0.98)]
    pytest.importorskip("matplotlib")
    assert curves.main([str(path), "--out", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0


def test_a_metrics_file_that_mixes_a_single_run_and_models_is_refused(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        json.dumps({"step": 1, "epoch": 1, "loss": 1.0})
        + "\n"
        + json.dumps({"model": "seed0", "group": "all", "step": 1, "epoch": 1, "loss": 1.0})
        + "\n"
    )
    with pytest.raises(ValueError, match="line 2"):
        curves.read_metrics(path)
