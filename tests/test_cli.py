"""`python -m mnist_cuda.train`: flag errors and the missing-GPU message (CPU), real runs (GPU)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, mnist_or_skip
from mnist_cuda import checkpoint, reference


def run_train(*args, env=None, timeout=600):
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mnist_cuda.train", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=REPO,
    )


def one_line_usage_error(r, *words):
    """exit 2, one line on stderr naming what is wrong, no traceback, nothing on stdout."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "args,words",
    [
        (["--batch-size", "0"], ["--batch-size", "at least 1"]),
        (["--batch-size", "x"], ["--batch-size", "whole number"]),
        (["--batch-size", "60001"], ["--batch-size", "at most 60000 (the largest training set)"]),
        (["--channels", "32,600000"], ["--channels", "at most 524,280"]),
        (["--channels", "20000,20000"], ["--channels", "conv2's weight", "32-bit indexing"]),
        (["--hidden", "1000000"], ["--hidden", "fc1's weight", "at most --hidden 684,784"]),
        (["--batch-size", "50000"], ["--batch-size", "32-bit indexing", "at most batch 42,799"]),
        (["--channels", "32,2000", "--batch-size", "2000"], ["--channels", "32-bit indexing"]),
        (["--epochs", "3000000"], ["--epochs", "32-bit step counter", "at most 2,291,871 epochs"]),
        (["--steps", str(2**31)], ["--steps", "step counter is 32-bit"]),
        (["--epochs", "40000", "--batch-size", "1"], ["--epochs", "32-bit step counter", "at most 35,791 epochs"]),
        (["--lr", "-1e-3"], ["--lr", "positive"]),
        (["--lr", "1e39"], ["--lr", "float32"]),
        (["--epochs", "10", "--steps", "5"], ["--epochs", "changes nothing with --steps 5"]),
        (["--gamma", "0.5"], ["--gamma needs --schedule step"]),
        (["--schedule", "cosine", "--step-size", "3"], ["--step-size needs --schedule step"]),
        (["--anneal", "linear"], ["--anneal needs --schedule onecycle"]),
        (["--pct-start", "0.2", "--schedule", "cosine"], ["--pct-start needs --schedule onecycle"]),
        (["--dampening", "0.1"], ["--dampening needs --momentum > 0"]),
        (["--lr", "-1"], ["--lr"]),
        (["--lr", "nan"], ["--lr"]),
        (["--lr", "inf"], ["--lr"]),
        (["--lr", "0"], ["--lr"]),
        (["--dataset", "cifar"], ["--dataset"]),
        (["--channels", "32"], ["--channels"]),
        (["--channels", "32,x"], ["--channels"]),
        (["--channels", "0,4"], ["--channels"]),
        (["--epochs", "0"], ["--epochs"]),
        (["--epochs"], ["--epochs", "expected one argument"]),
        (["--steps", "-2"], ["--steps"]),
        (["--steps", "0"], ["--steps", "needs --save"]),
        (["--seed", "-1"], ["--seed", "at least 0"]),
        (["--seed", str(2**32)], ["--seed", "at most 4294967295"]),
        (["--seed", "1.5"], ["--seed", "whole number"]),
        (["--tf32", "--kernels", "naive"], ["--precision", "tf32 needs --kernels fast"]),
        (["--precision", "bf16", "--kernels", "naive"], ["--precision", "bf16 needs --kernels fast"]),
        (["--precision", "fp16"], ["--precision", "invalid choice"]),
        (["--tf32", "--precision", "bf16"], ["--precision", "not allowed with argument --tf32"]),
        (["--frobnicate"], ["unrecognized arguments: --frobnicate"]),
        (["--save", "/no/such/folder/m.npz"], ["--save", "folder /no/such/folder does not exist"]),
        (["--metrics", "/no/such/folder/m.jsonl"], ["--metrics", "does not exist"]),
        (["--plot", "/no/such/folder/m.png"], ["--plot", "does not exist"]),
        (["--data-dir", "/no/such/folder"], ["--data-dir", "/no/such/folder does not exist"]),
        (["--init", "/no/such/file.npz"], ["--init", "does not exist"]),
    ],
)
def test_bad_flags_are_one_line_usage_errors(args, words):
    r = run_train(*args)
    one_line_usage_error(r, *words)
    assert "see python -m mnist_cuda.train --help" in r.stderr


def test_damaged_records_and_clashes_with_init(tmp_path):
    state = reference.init_state_dict(0)
    for meta, word in (
        ({"step": "abc"}, "step 'abc'"),
        ({"batch_size": "64"}, "batch_size '64'"),
        ({"batch_size": 0}, "batch_size 0"),
        ({"kernels": "turbo"}, "kernels 'turbo'"),
        ({"tf32": "yes"}, "tf32 'yes'"),
        ({"precision": "fp8"}, "precision 'fp8'"),
    ):
        path = checkpoint.save_checkpoint(tmp_path / "bad.npz", state, meta)
        one_line_usage_error(run_train("--init", str(path)), "--init", "damaged", word)
    ck = str(checkpoint.save_checkpoint(tmp_path / "ck.npz", state, {"step": 0}))
    one_line_usage_error(run_train("--init", ck, "--metrics", ck), "--metrics", "is the file read as --init")
    one_line_usage_error(run_train("--init", ck, "--plot", ck), "--plot", "is the file read as --init")
    one_line_usage_error(run_train("--save", "/dev/null"), "--save", "not a regular file")


def test_a_checkpoint_inside_an_epoch_keeps_its_order(tmp_path):
    path = checkpoint.save_checkpoint(
        tmp_path / "mid.npz",
        reference.init_state_dict(0),
        {"step": 500, "epoch_index": 0, "epoch_sample": 32000, "seed": 3},
    )
    one_line_usage_error(run_train("--init", str(path), "--seed", "4"), "--seed", "inside epoch 1")
    one_line_usage_error(run_train("--init", str(path), "--no-shuffle"), "--shuffle", "splice")


def test_position_of_a_checkpoint_that_records_only_its_step():
    from mnist_cuda.train_setup import _position
    from mnist_cuda.training import Position

    assert _position({"step": 3749, "epoch": 5}, 64, 60000) == Position(3749, 4, 64)
    assert _position({"step": 3748, "epoch_index": 4, "epoch_sample": 0}, 64, 60000) == Position(3748, 4, 0)
    assert _position({"step": 937 * 4}, 64, 60000) == Position(3748, 4, 0)


def test_metrics_of_a_continued_run_keep_only_the_steps_before_it(tmp_path):
    from mnist_cuda.train import _keep_metrics_until

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "epoch": 1, "loss": 1.0}) + "\n" for s in range(1, 11)))
    _keep_metrics_until(path, 6)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 7))


def test_optimizer_flag_mistakes(tmp_path):
    one_line_usage_error(run_train("--nesterov"), "Nesterov momentum needs a momentum > 0")
    one_line_usage_error(run_train("--momentum", "0.9", "--dampening", "0.1", "--nesterov"), "zero dampening")
    one_line_usage_error(run_train("--schedule", "step"), "--schedule step needs --step-size")
    one_line_usage_error(run_train("--momentum", "-1"), "--momentum", "at least 0 and less than 1")
    one_line_usage_error(run_train("--schedule", "warp"), "--schedule")
    one_line_usage_error(run_train("--schedule", "onecycle", "--pct-start", "1.5"), "--pct-start", "less than 1")


def test_recipes_fill_the_flags_not_given(tmp_path):
    from mnist_cuda.training import RECIPES

    path = tmp_path / "fast.npz"
    r = run_train("--recipe", "fast", "--lr", "0.07", "--steps", "0", "--save", str(path))
    assert r.returncode == 0, r.stderr
    meta = checkpoint.load_checkpoint(path)[1]
    assert meta["batch_size"] == RECIPES["fast"]["batch_size"] and meta["lr"] == 0.07  # a given flag wins
    o = meta["optimizer"]
    assert (o["momentum"], o["nesterov"], o["weight_decay"], o["schedule"]) == (0.9, True, 5e-4, "onecycle")
    one_line_usage_error(run_train("--recipe", "slow"), "--recipe")
    one_line_usage_error(run_train("--target-accuracy", "101"), "--target-accuracy", "at most 100")


def test_continuing_with_the_optimizer(tmp_path):
    """A recipe starts a run; a kept schedule is not overrun; a new one inherits nothing of the old; Nesterov
    can be turned off; a damaged optimizer record is named."""
    fast = tmp_path / "fast.npz"
    assert run_train("--recipe", "fast", "--steps", "0", "--save", str(fast)).returncode == 0
    one_line_usage_error(run_train("--init", str(fast), "--recipe", "best"), "--recipe", "continued with --init")
    one_line_usage_error(
        run_train("--init", str(fast), "--epochs", "3"), "--epochs", "ends at step 936", "at most 936 steps more"
    )
    one_line_usage_error(run_train("--init", str(fast), "--schedule", "step"), "--schedule step needs --step-size")
    r = run_train(
        "--init", str(fast), "--no-nesterov", "--momentum", "0", "--steps", "0", "--save", str(tmp_path / "p.npz")
    )
    assert r.returncode == 0, r.stderr
    o = checkpoint.load_checkpoint(tmp_path / "p.npz")[1]["optimizer"]
    assert (o["momentum"], o["nesterov"], o["schedule"]) == (0.0, False, "onecycle")
    state = reference.init_state_dict(0)
    bad = checkpoint.save_checkpoint(tmp_path / "bad.npz", state, {"optimizer": {"momentum": "0.9"}})
    one_line_usage_error(run_train("--init", str(bad)), "--init", "optimizer momentum '0.9'")
    one_line_usage_error(run_train("--momentum", "1"), "--momentum", "less than 1")
    one_line_usage_error(run_train("--augment", "28"), "--augment", "out of its 28x28 field")


def test_output_paths_that_are_folders_or_clash(tmp_path):
    one_line_usage_error(run_train("--save", str(tmp_path)), "--save", "is a folder")
    one_line_usage_error(run_train("--metrics", str(tmp_path)), "--metrics", "is a folder")
    (tmp_path / "file").write_text("")
    one_line_usage_error(run_train("--save", str(tmp_path / "file" / "m.npz")), "--save", "not a folder")
    same = str(tmp_path / "run.out")
    one_line_usage_error(run_train("--save", same, "--metrics", same), "--metrics", "also written as --save")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for flag in ("--save", "--metrics", "--plot"):
        one_line_usage_error(run_train(flag, str(locked / "out")), flag, "not writable")


def test_help():
    r = run_train("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m mnist_cuda.train")
    for flag in ("--batch-size", "--epochs", "--channels", "--init", "--plot", "--metrics", "--seed"):
        assert flag in r.stdout


@pytest.mark.parametrize("module", ["train", "evaluate", "predict", "curves"])
def test_every_flag_has_help_text(module):
    import importlib

    parser = importlib.import_module(f"mnist_cuda.{module}").build_parser()
    for action in parser._actions:
        assert action.help and len(action.help) > 10, (module, action.option_strings or action.dest)


def test_help_states_each_default_once():
    """A default is appended where the help does not state one already, and only where there is one to state."""
    from mnist_cuda.cli import Parser

    p = Parser(prog="x")
    p.add_argument("--said", type=int, default=5, help="already says it (default: 5)")
    p.add_argument("--unsaid", type=int, default=0, help="says nothing of it")
    p.add_argument("--unset", default=None, help="has none")
    p.add_argument("--switch", action="store_true", help="a switch")
    p.add_argument("--mode", default="fast", help="works as PyTorch does by default")
    p.add_argument("--slow", dest="mode", action="store_const", const="slow", help="the same as --mode slow")
    p.set_defaults(mode="fast")
    text = " ".join(p.format_help().split())
    assert text.count("(default: 5)") == 1 and "says nothing of it (default: 0)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "by default (default: fast)" in text and "--mode slow (default" not in text


def test_console_script_names_itself():
    code = (
        "import sys; sys.argv[0] = '/venv/bin/mnist-cuda-train'; from mnist_cuda.train import main; "
        "sys.exit(main(['--help']))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: mnist-cuda-train ")


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_bad_init_checkpoints(tmp_path):
    """Each says what is wrong with the file and what a checkpoint is; none passes NumPy's advice on."""
    (tmp_path / "notes.txt").write_text("hello")
    write_npz(tmp_path / "pickled.npz", w=np.array([{"a": 1}], dtype=object))
    write_npz(tmp_path / "plain.npz", w=np.zeros(3))
    checkpoint.save_checkpoint(
        tmp_path / "old.npz", reference.init_state_dict(0), {"format": "mnist_cuda.checkpoint/0"}
    )
    cut = checkpoint.save_checkpoint(tmp_path / "cut.npz", reference.init_state_dict(0))
    cut.write_bytes(cut.read_bytes()[:1000])
    cases = {
        "notes.txt": "not an .npz archive",
        "pickled.npz": "pickled Python objects",
        "plain.npz": "no mnist_cuda metadata",
        "old.npz": "checkpoint format 'mnist_cuda.checkpoint/0'",
        "cut.npz": "not a readable .npz checkpoint",
    }
    for name, words in cases.items():
        line = one_line_usage_error(run_train("--init", str(tmp_path / name)), "--init", words)
        assert "allow_pickle" not in line
        if name != "old.npz":
            assert "--save PATH" in line  # what a checkpoint is
    one_line_usage_error(run_train("--init", str(tmp_path)), "--init", "is a folder")


def test_init_with_mismatched_shapes_is_a_usage_error(tmp_path):
    path = tmp_path / "small.npz"
    checkpoint.save_checkpoint(path, reference.init_state_dict(0, (4, 8), 16))
    one_line_usage_error(
        run_train("--init", str(path), "--channels", "32,64"),
        "--channels",
        "holds a model with --channels 4,8 --hidden 16",
    )
    one_line_usage_error(run_train("--init", str(path), "--hidden", "128"), "--hidden", "--hidden 16")


def test_named_data_folder_without_the_files(tmp_path):
    """A named folder is the only source: no fallback to the cache or a download, nothing created."""
    (tmp_path / "empty").mkdir()
    r = run_train(
        "--data-dir", str(tmp_path / "empty"), "--steps", "1", env={"MNIST_CUDA_CACHE": str(tmp_path / "cache")}
    )
    one_line_usage_error(r, "has no train-images-idx3-ubyte")
    r = run_train(
        "--steps", "1", env={"MNIST_DATA_DIR": str(tmp_path / "nope"), "MNIST_CUDA_CACHE": str(tmp_path / "cache")}
    )
    one_line_usage_error(r, "the data folder", "nope does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_plot_without_matplotlib_is_one_line_before_work(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None; from mnist_cuda.train import main; "
        f"sys.exit(main(['--plot', {str(tmp_path / 'c.png')!r}, '--steps', '1']))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""},
    )
    one_line_usage_error(r, "--plot", "needs matplotlib", "pip install")


def test_plan_continues_as_one_run():
    """The batches of 4 epochs and then 6 more (or of 700 steps and then 1200) are those of one run."""
    from mnist_cuda.training import Position, plan

    n, b = 1000, 64  # 15 steps per epoch, 40 samples dropped
    whole = [c.batches for c in plan(n, b, 3, True, Position(), 150)]
    first = list(plan(n, b, 3, True, Position(), 60))
    rest = list(plan(n, b, 3, True, first[-1].end, 90))
    assert first[-1].end == Position(60, 4, 0)
    assert [c.first_step for c in first + rest] == list(range(0, 150, 15))  # the steps trained before each
    flat = lambda chunks: np.concatenate([np.concatenate(c) for c in chunks])
    assert np.array_equal(flat(whole), flat([c.batches for c in first + rest]))
    mid = list(plan(n, b, 3, True, Position(), 7))
    assert mid[-1].end == Position(7, 0, 7 * b) and len(mid) == 1
    assert np.array_equal(flat(whole[:1])[: 7 * b], flat([mid[0].batches]))
    assert np.array_equal(flat(whole), flat([c.batches for c in mid + list(plan(n, b, 3, True, mid[-1].end, 143))]))


def test_steps_zero_writes_the_initial_checkpoint(tmp_path):
    path = tmp_path / "init.npz"
    r = run_train("--steps", "0", "--save", str(path), "--seed", "3", "--channels", "4,8", "--hidden", "16")
    assert r.returncode == 0, r.stderr
    state, meta = checkpoint.load_checkpoint(path, reference.state_dict_spec((4, 8), 16))
    assert np.array_equal(state["conv2.weight"], reference.init_state_dict(3, (4, 8), 16)["conv2.weight"])
    assert meta["channels"] == [4, 8] and meta["step"] == 0


def test_no_gpu_is_one_clear_line():
    r = run_train("--steps", "1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "GPU" in r.stderr or "CuPy" in r.stderr


def test_no_cupy_is_one_clear_line():
    code = "import sys; sys.modules['cupy'] = None; from mnist_cuda.train import main; sys.exit(main(['--steps', '1']))"
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "CuPy is not installed" in r.stderr and "pip install" in r.stderr


# ---- real runs on the GPU ------------------------------------------------------------------------


@pytest.mark.gpu
def test_short_run_writes_checkpoint_and_metrics(tmp_path):
    folder = mnist_or_skip()
    ck, metrics = tmp_path / "m.npz", tmp_path / "m.jsonl"
    r = run_train("--data-dir", str(folder), "--steps", "120", "--save", str(ck), "--metrics", str(metrics), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout and "per-phase mean" in r.stdout
    state, meta = checkpoint.load_checkpoint(ck, reference.state_dict_spec())
    assert meta["step"] == 120 and int(state["bn1.num_batches_tracked"]) == 120
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [d for d in lines if "loss" in d]
    assert [d["step"] for d in steps] == list(range(1, 121)) and lines[-1]["test_accuracy"] > 0.9
    # continue from the checkpoint
    r = run_train("--data-dir", str(folder), "--steps", "10", "--init", str(ck), "--save", str(ck), "--quiet")
    assert r.returncode == 0, r.stderr
    assert checkpoint.load_checkpoint(ck)[1]["step"] == 130


@pytest.mark.gpu
def test_divergence_stops_and_keeps_the_last_checkpoint(tmp_path):
    folder = mnist_or_skip()
    ck = tmp_path / "m.npz"
    checkpoint.save_checkpoint(ck, reference.init_state_dict(0), {"step": 0})
    before = ck.read_bytes()
    r = run_train("--data-dir", str(folder), "--lr", "1e30", "--save", str(ck), "--quiet")
    assert r.returncode == 1 and "at step" in r.stderr and "Traceback" not in r.stderr
    assert ck.read_bytes() == before


@pytest.mark.gpu
def test_four_epochs_then_six_more_is_ten_at_once(tmp_path):
    """--init continues the step count, the epoch and its shuffled order: the metrics (every step's loss,
    every epoch's test accuracy) and the final weights are those of one run, byte for byte."""
    folder = mnist_or_skip()
    common = ["--data-dir", str(folder), "--quiet"]
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_train(*common, "--epochs", "10", "--metrics", f"{one}.jsonl", "--save", f"{one}.npz")
    assert r.returncode == 0, r.stderr
    r = run_train(*common, "--epochs", "4", "--metrics", f"{two}.jsonl", "--save", f"{two}.npz")
    assert r.returncode == 0, r.stderr
    r = run_train(*common, "--epochs", "6", "--init", f"{two}.npz", "--metrics", f"{two}.jsonl", "--save", f"{two}.npz")
    assert r.returncode == 0, r.stderr
    assert "epoch 5:" in r.stdout and "(step 9370 in all)" in r.stdout
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    (a, meta_a), (b, meta_b) = (checkpoint.load_checkpoint(f"{p}.npz") for p in (one, two))
    assert meta_a == meta_b and meta_b["step"] == 9370 and meta_b["epoch_index"] == 10
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def loss_lines(metrics) -> list[str]:
    """The step-loss records of a metrics file, as written."""
    return [line for line in metrics.read_text().splitlines() if '"loss"' in line]


@pytest.mark.gpu
def test_resume_in_the_middle_of_an_epoch(tmp_path):
    """400 steps, then 600 more from the checkpoint: the losses of 1000 steps at once (batch 128)."""
    folder = mnist_or_skip()
    common = ["--data-dir", str(folder), "--quiet", "--batch-size", "128", "--seed", "7"]
    r = run_train(*common, "--steps", "1000", "--metrics", str(tmp_path / "one.jsonl"))
    assert r.returncode == 0, r.stderr
    r = run_train(
        *common, "--steps", "400", "--metrics", str(tmp_path / "two.jsonl"), "--save", str(tmp_path / "c.npz")
    )
    assert r.returncode == 0, r.stderr
    meta = checkpoint.load_checkpoint(tmp_path / "c.npz")[1]
    assert (meta["step"], meta["epoch_index"], meta["epoch_sample"]) == (400, 0, 400 * 128)
    r = run_train(
        "--data-dir",
        str(folder),
        "--quiet",
        "--steps",
        "600",
        "--init",
        str(tmp_path / "c.npz"),
        "--metrics",
        str(tmp_path / "two.jsonl"),
    )  # batch size and seed come from the checkpoint
    assert r.returncode == 0, r.stderr
    losses = [loss_lines(tmp_path / f"{n}.jsonl") for n in ("one", "two")]
    assert len(losses[0]) == 1000 and losses[0] == losses[1]


@pytest.mark.gpu
def test_ctrl_c_keeps_the_last_checkpoint_and_says_where(tmp_path):
    import signal
    import time

    folder = mnist_or_skip()
    ck = tmp_path / "m.npz"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mnist_cuda.train",
            "--data-dir",
            str(folder),
            "--epochs",
            "200",
            "--save",
            str(ck),
            "--quiet",
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 300
    while not ck.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)  # into the next epoch
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted in epoch" in err and f"--init {ck}" in err and "intact" in err
    state, meta = checkpoint.load_checkpoint(ck, reference.state_dict_spec())
    assert meta["step"] >= 937 and meta["step"] % 937 == 0 and meta["epoch_index"] == meta["step"] // 937
    assert f"holds step {meta['step']}" in err
    assert [q.name for q in tmp_path.iterdir()] == ["m.npz"]  # no temporary file left


@pytest.mark.gpu
def test_resume_with_momentum_restores_the_buffers(tmp_path):
    """Momentum, weight decay and the augmentation's shifts: 300 steps, then 300 more from the checkpoint (its
    buffers restored, the options taken from it, the shifts drawn by step number), give the losses of 600
    steps at once."""
    folder = mnist_or_skip()
    common = ["--data-dir", str(folder), "--quiet"]
    opts = ["--momentum", "0.9", "--weight-decay", "5e-4", "--lr", "0.01", "--augment", "2"]
    r = run_train(*common, *opts, "--steps", "600", "--metrics", str(tmp_path / "one.jsonl"))
    assert r.returncode == 0, r.stderr
    r = run_train(
        *common, *opts, "--steps", "300", "--metrics", str(tmp_path / "two.jsonl"), "--save", str(tmp_path / "c.npz")
    )
    assert r.returncode == 0, r.stderr
    state, meta = checkpoint.load_checkpoint(tmp_path / "c.npz")
    assert meta["optimizer"]["momentum"] == 0.9 and "momentum_buffer.fc1.weight" in state
    r = run_train(
        *common, "--steps", "300", "--init", str(tmp_path / "c.npz"), "--metrics", str(tmp_path / "two.jsonl")
    )
    assert r.returncode == 0, r.stderr
    losses = [loss_lines(tmp_path / f"{n}.jsonl") for n in ("one", "two")]
    assert len(losses[0]) == 600 and losses[0] == losses[1]


@pytest.mark.gpu
def test_target_accuracy_stops_at_the_first_epoch_that_reaches_it(tmp_path):
    folder = mnist_or_skip()
    metrics = tmp_path / "m.jsonl"
    r = run_train(
        "--data-dir", str(folder), "--quiet", "--epochs", "5", "--target-accuracy", "97", "--metrics", str(metrics)
    )
    assert r.returncode == 0, r.stderr
    accuracies = [
        json.loads(line)["test_accuracy"] for line in metrics.read_text().splitlines() if "test_accuracy" in line
    ]
    assert accuracies[-1] >= 0.97 and all(a < 0.97 for a in accuracies[:-1]) and len(accuracies) < 5
    assert f"target 97%: reached in epoch {len(accuracies)} after" in r.stdout and "not counted" in r.stdout


def test_a_batch_too_large_for_the_init_checkpoints_model_blames_the_checkpoint(tmp_path):
    """The model of a continued run comes from --init, not from --channels / --hidden: a batch its activations
    cannot take names the checkpoint's model, not flags the user did not give."""
    ck = tmp_path / "wide.npz"
    assert run_train("--channels", "32,4096", "--steps", "0", "--save", str(ck)).returncode == 0
    r = run_train("--init", str(ck), "--batch-size", "1000", "--steps", "1")
    one_line_usage_error(
        r, "--init", "the --init checkpoint's model (channels 32,4096, hidden 128)", "at most batch 668"
    )
    assert "--channels" not in r.stderr


def test_interrupt_deferred_holds_ctrl_c_until_the_block_ends():
    """A SIGINT inside cli.interrupt_deferred() is raised as KeyboardInterrupt only after the block has run to its
    end (the checkpoint written and recorded together); without one, nothing is raised; the handler is restored; a
    handler of the caller's own gets the signal after the block, and an ignored SIGINT stays ignored."""
    import signal

    from mnist_cuda import cli

    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with cli.interrupt_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the rest of the block")
    assert done == ["the rest of the block"] and signal.getsignal(signal.SIGINT) is before
    with cli.interrupt_deferred():
        done.append("quiet")
    assert done[-1] == "quiet" and signal.getsignal(signal.SIGINT) is before
    seen = []  # a handler of the caller's own gets the signal, after the block
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(list(done)))
    try:
        with cli.interrupt_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("after the signal")
        assert seen == [done] and done[-1] == "after the signal"
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored stays ignored
        with cli.interrupt_deferred():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
