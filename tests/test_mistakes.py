"""A new user's mistakes, by class, across every command (CPU): each is one line on stderr and exit status 2,
before any work, never a traceback, an overwritten file or an allocation the machine cannot hold.

    sizes         every numeric argument far beyond its range: refused within a second, in little memory
    clashes       every output path given the same file (or a link to it) as another path argument
    unreadable    folders and files the user may not read or search (the privilege dropped in a child)
    checkpoints   what a checkpoint holds: dtypes, shapes, finite values, the statistics' signs
    messages      each names the real problem in the user's words
    no effect     a flag that cannot change anything beside the others given
    warnings      a third party's warnings never reach the terminal as theirs

The commands and their arguments are read from their parsers, so a flag added later is tried too."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

import conftest
from conftest import DEV, REPO
from mnist_cuda import checkpoint, cli, reference
from mnist_cuda.data import DATASETS

FAR = "1" + "0" * 40  # far beyond any size, count or seed
MEMORY_LIMIT = 4 << 30  # the address space a refused command may take: a real allocation of a size fails fast
PEAK_RSS_LIMIT = 200 << 20  # a refused command imports its modules and parses; it allocates nothing large
CPU_SECONDS = 1.0  # a refusal's own CPU time: a machine shared with other work stretches its wall clock, not this
WALL_SECONDS = 5.0  # and its wall clock, generously: a refusal that waits 5 s or more (on the network, a lock) fails


# ---- the commands ----------------------------------------------------------------------------------------


def _script(path: Path):
    return conftest.load_script(path)


def _results_table_parser():
    return _script(REPO / "scripts" / "results_table.py").build_parser()


def _bundle_parser():
    """dev/loss_sequences.py's `bundle` subcommand, the one of its commands that writes a file."""
    parser = _script(DEV / "loss_sequences.py").build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["bundle"]


@dataclasses.dataclass
class Command:
    name: str
    argv: list  # how it starts, after the interpreter
    parser: object  # a callable that builds its parser
    writes_in_place: tuple = ()  # arguments both read and rewritten (results_table's --readme)
    allowed: tuple = ()  # (output, input) pairs that may name one file

    def run(self, args, env=None, timeout=60):
        """(exit status, stderr, peak RSS in bytes, (CPU seconds, wall seconds)) of a run, its address space
        limited (a real allocation of a size asked for fails at once instead of swapping) and no GPU in sight."""
        import threading

        full_env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OPENBLAS_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "MNIST_CUDA_CACHE": str(Path(tempfile.gettempdir()) / "no-cache"),
            **(env or {}),
        }
        # A small runner starts the command and reports its exit status, its own peak RSS and its seconds. A
        # child forked (or vforked) from this test process would count this process's resident memory as its
        # own peak (Linux folds the old address space's high-water mark into ru_maxrss at exec), and once it
        # holds a GPU context and torch that is gigabytes: so the command is a grandchild of a small process.
        runner = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(MEMORY_LIMIT), sys.executable, *self.argv, *map(str, args)],
            cwd=REPO,
            env=full_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        killer = threading.Timer(timeout, lambda: os.killpg(runner.pid, signal.SIGKILL))
        killer.start()
        try:
            out, stderr = runner.communicate()
        finally:
            killer.cancel()
        status, peak, cpu, wall = json.loads(out.strip().splitlines()[-1])
        return status, stderr, peak, (cpu, wall)


# The runner: the command under an address-space limit (a real allocation of a size asked for fails at once
# instead of swapping), its own rusage by wait4; prints [exit status, peak RSS bytes, CPU seconds, wall seconds] last.
RUNNER = """
import json, os, resource, subprocess, sys, time
limit = int(sys.argv[1])
start = time.perf_counter()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL,
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
_, status, usage = os.wait4(p.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime,
                  time.perf_counter() - start]))
"""


def _module(name: str):
    return lambda: importlib.import_module(name).build_parser()


def _in_file(path: Path):
    return lambda: _script(path).build_parser()


COMMANDS = [
    Command(
        "train", ["-m", "mnist_cuda.train"], _module("mnist_cuda.train"), allowed=(("save", "init"),)
    ),  # a run continued in place
    Command("evaluate", ["-m", "mnist_cuda.evaluate"], _module("mnist_cuda.evaluate")),
    Command("predict", ["-m", "mnist_cuda.predict"], _module("mnist_cuda.predict")),
    Command("curves", ["-m", "mnist_cuda.curves"], _module("mnist_cuda.curves")),
    Command("data", ["-m", "mnist_cuda.data"], _module("mnist_cuda.data_command")),
    Command("compare_pytorch", ["scripts/compare_pytorch.py"], _module("mnist_cuda.compare.main")),
    Command(
        "compare_many_models", ["scripts/compare_many_models.py"], _in_file(REPO / "scripts" / "compare_many_models.py")
    ),
    Command("results_table", ["scripts/results_table.py"], _results_table_parser, writes_in_place=("readme",)),
    Command("sweep_hparams", ["scripts/sweep_hparams.py"], _in_file(REPO / "scripts" / "sweep_hparams.py")),
    Command("sweep_recipes", ["scripts/sweep_recipes.py"], _in_file(REPO / "scripts" / "sweep_recipes.py")),
    Command("loss_sequences bundle", ["dev/loss_sequences.py", "bundle"], _bundle_parser),
    Command("kernel_cases", ["-m", "mnist_cuda.kernel_cases"], lambda: None),
] + [
    Command(name, [f"dev/{name}.py"], _in_file(DEV / f"{name}.py"))
    for name in (
        "bench_kernels",
        "bf16_distance",
        "conv2_tile_ablation",
        "ladder",
        "many_models_probe",
        "pdl_probe",
        "profile_step",
        "step_launch_costs",
        "step_timeline",
        "time_step",
        "wgmma_rate",
    )
]


def test_every_program_with_flags_is_tried():
    """A program of scripts/ or dev/ that parses flags (however it builds its parser) is one of COMMANDS, so
    every test here tries it."""
    tried = {c.argv[0] for c in COMMANDS}
    programs = [p for folder in (REPO / "scripts", DEV) for p in sorted(folder.glob("*.py"))]
    with_flags = [str(p.relative_to(REPO)) for p in programs if "parse_args(" in p.read_text()]
    assert [p for p in with_flags if p not in tried] == []


def _arguments(command: Command):
    parser = command.parser()
    return [] if parser is None else [a for a in parser._actions if a.dest not in ("help", "command")]


def _is_output(action) -> bool:
    return action.type is cli.output_path


def _is_path(action) -> bool:
    return (
        action.type in (cli.output_path, cli.input_file, cli.existing_dir, Path)
        or getattr(action.type, "__name__", "") == "recording"
    )


def _name(action) -> str:
    """How a message names the argument: its flag, or its positional name."""
    return action.option_strings[-1] if action.option_strings else (action.metavar or action.dest)


# ---- the files the commands read -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A valid file for each kind of input: a checkpoint, a metrics file, a compare result, a README, an
    image (a PNG's bytes, Pillow or not), and a data folder with the four MNIST file names."""
    d = tmp_path_factory.mktemp("inputs")
    ck = checkpoint.save_checkpoint(
        d / "model.npz",
        reference.init_state_dict(0, (4, 8), 16),
        {"dataset": "mnist", "batch_size": 32, "kernels": "naive"},
    )
    metrics = d / "run.jsonl"
    metrics.write_text(
        "".join(json.dumps({"step": s, "epoch": 1, "loss": 1.0 / s}) + "\n" for s in range(1, 60))
        + json.dumps({"step": 59, "epoch": 1, "test_accuracy": 0.9})
        + "\n"
    )
    result = d / "result.json"
    result.write_text((REPO / "benchmarks" / "results" / "compare-h200-fp32-64.json").read_text())
    readme = d / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    image = d / "digit.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    data = d / "mnist-files"
    data.mkdir()
    for spec in DATASETS["mnist"].files:
        (data / f"{spec.name}.gz").write_bytes(b"\x1f\x8b not the real file")
    return {
        "checkpoint": ck,
        "checkpoints": ck,
        "init": ck,
        "metrics": metrics,
        "show": result,
        "files": result,
        "readme": readme,
        "images": image,
        "before": metrics,
        "after": metrics,
        "data_dir": data,
        "dir": data,
    }


def _required(command: Command, files, leave_out=()) -> list:
    """The arguments a command needs to get as far as its checks: its positionals, a valid file each."""
    args = []
    for action in _arguments(command):
        if not action.option_strings and action.dest not in leave_out and action.nargs != "*":
            args.append(files.get(action.dest, files["metrics"]))
    return args


# ---- sizes -----------------------------------------------------------------------------------------------


def _far_values(action) -> list[str]:
    """Values far beyond the argument's range, in its own form (a list, a pair), large and negative."""
    lists = {
        "channels": ["32,{}"],
        "configs": ["{}:0.05", "64:{}e300"],
        "seeds": ["0,{}"],
        "batch_sizes": ["64,{}"],
        "recipe_seeds": ["0-{}"],
    }
    forms = lists.get(action.dest, ["{}"])
    try:
        action.type("0.5")
        number = "1e300"  # a real number
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        number = FAR
    values = []
    for form in forms:
        big = form.format(number if form != "64:{}e300" else "1")
        values += [big, big.replace(number, "-" + number, 1) if form == "{}" else big]
    return list(dict.fromkeys(values))


def _numeric(command: Command):
    for action in _arguments(command):
        if (
            action.option_strings
            and action.type is not None
            and not _is_path(action)
            and not action.choices
            and action.nargs is None
        ):
            yield action


NUMERIC_CASES = [(c, a.option_strings[-1], value) for c in COMMANDS for a in _numeric(c) for value in _far_values(a)]


def test_every_numeric_argument_is_tried():
    """The discovery finds the sizes the issue names, so the test below covers them."""
    tried = {(c.name, flag) for c, flag, _ in NUMERIC_CASES}
    for case in [
        ("train", "--hidden"),
        ("train", "--channels"),
        ("train", "--epochs"),
        ("train", "--steps"),
        ("train", "--batch-size"),
        ("evaluate", "--batch-size"),
        ("predict", "--batch-size"),
        ("compare_pytorch", "--steps"),
        ("compare_pytorch", "--batch-sizes"),
        ("sweep_hparams", "--configs"),
    ]:
        assert case in tried, case
    assert len(NUMERIC_CASES) > 80


@pytest.mark.parametrize(
    "command,flag,value", NUMERIC_CASES, ids=[f"{c.name} {f} {v[:12]}" for c, f, v in NUMERIC_CASES]
)
def test_a_size_far_beyond_its_range_is_refused_at_once(command, flag, value, files):
    """Exit 2 within a second of CPU time, naming the flag, the peak memory that of an interpreter that parsed its
    arguments (the address space is limited too: an allocation of the size asked for fails, not swaps)."""
    status, stderr, peak, (cpu, wall) = command.run([*_required(command, files), flag, value])
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, (status, stderr[-2000:])
    assert flag in lines[0], lines[0]
    assert peak < PEAK_RSS_LIMIT, f"peak RSS {peak >> 20} MB"
    assert cpu < CPU_SECONDS and wall < WALL_SECONDS, f"{cpu:.2f} s of CPU, {wall:.2f} s"


def test_the_plan_holds_one_epoch_at_a_time():
    """A run of a million epochs plans as fast, and in as little memory, as a run of one."""
    import tracemalloc

    from mnist_cuda.training import Position, plan

    tracemalloc.start()
    run = plan(1000, 1, 0, True, Position(), 1_000_000)  # 1000 epochs of 1000 steps
    chunks = iter(run)
    first, second = next(chunks), next(chunks)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(first.batches) == len(second.batches) == 1000 and second.end == Position(2000, 2, 0)
    assert peak < 2 << 20, f"{peak >> 20} MB"
    again = next(iter(run))  # each iteration makes the same chunks afresh (the comparison's sides share a plan)
    assert again.end == first.end and all(np.array_equal(a, b) for a, b in zip(again.batches, first.batches))


def test_sizes_are_derived_from_the_kernels_limits():
    from mnist_cuda import sizes

    assert sizes.model_problem((32, 64), 128) is None and sizes.batch_problem((32, 64), 128, 4096) is None
    assert sizes.largest_batch((32, 64), 128) == (2**31 - 1) // (64 * 784)  # the nets' own bound
    flag, message = sizes.model_problem((32, 64), 10**6)
    assert flag == "--hidden" and "at most --hidden 684,784" in message
    flag, message = sizes.batch_problem((32, 50000), 128, 64)
    assert flag == "--channels" and "32-bit" in message  # the channels are unusual, not the batch
    flag, message = sizes.device_problem((32, 64), 128, 4096, "fast", "fp32", False, False, free_bytes=10**8, sms=132)
    assert flag == "--batch-size" and "GB of GPU memory" in message
    assert sizes.host_problem((32, 64), 128, available=1 << 30) is None
    assert sizes.host_problem((32, 64), 10**5, available=1 << 30)[0] == "--hidden"


def test_the_device_estimate_covers_what_the_nets_allocate(monkeypatch):
    """sizes.device_buffers against the nets built on a stand-in for CuPy that allocates NumPy arrays: the
    estimate is at least what they allocate, and not far above it."""
    from mnist_cuda import cuda, nets, sizes

    fake = _FakeCupy(sms=132)
    monkeypatch.setattr(cuda, "require_gpu", lambda: fake)
    cuda.sm_count.cache_clear()
    try:
        for kernels, batch, channels, hidden, precision in (
            ("fast", 64, (32, 64), 128, "fp32"),
            ("fast", 4096, (8, 16), 33, "fp32"),
            ("naive", 512, (32, 64), 128, "fp32"),
            ("fast", 2048, (32, 64), 128, "fp32"),
            ("fast", 64, (32, 64), 128, "bf16"),  # conv2's and fc1's activations and their gradients as bf16
            ("fast", 4096, (32, 64), 128, "bf16"),
        ):
            fake.allocated = 0
            net = nets.make_net(nets.Parameters(channels, hidden), batch, kernels, precision=precision)
            step_inputs = 2 * batch * (784 + 4)  # the step runner's two input buffers (images and labels)
            estimate = sizes.device_bytes(
                channels, hidden, batch, kernels, 132, precision, momentum=False, augment=False
            )
            # within 2% (and a MiB): a buffer counted at the wrong element size is several % at 4096
            assert fake.allocated + step_inputs <= estimate <= 1.02 * (fake.allocated + step_inputs) + (1 << 20), (
                kernels,
                batch,
                fake.allocated,
                estimate,
            )
            del net
    finally:
        cuda.sm_count.cache_clear()


class _FakeCupy:
    """Enough of CuPy for nets.Parameters and the nets' constructors: arrays are NumPy's, and counted."""

    def __init__(self, sms: int):
        import types

        self.allocated = 0
        for name in ("float32", "float64", "int32", "uint32", "uint8", "int8"):
            setattr(self, name, getattr(np, name))
        device = types.SimpleNamespace(attributes={"MultiProcessorCount": sms}, compute_capability="90")
        self.cuda = types.SimpleNamespace(
            Device=lambda *a: device, Stream=lambda **k: object(), Event=lambda **k: object()
        )

    def _count(self, a):
        self.allocated += a.nbytes
        return a

    def zeros(self, shape, dtype=np.float32):
        return self._count(np.zeros(shape, dtype))

    def empty(self, shape, dtype=np.float32):
        return self._count(np.empty(shape, dtype))

    def zeros_like(self, a):
        return self._count(np.zeros_like(a))

    def empty_like(self, a):
        return self._count(np.empty_like(a))


# ---- clashes ---------------------------------------------------------------------------------------------


def _clash_cases():
    for command in COMMANDS:
        paths = [a for a in _arguments(command) if _is_path(a)]
        for i, out in enumerate(paths):
            if not _is_output(out) and out.dest not in command.writes_in_place:
                continue
            for other in paths[:i] + paths[i + 1 :]:
                if _is_output(other) and paths.index(other) < i or (out.dest, other.dest) in command.allowed:
                    continue  # each pair of outputs once
                for link in ("same", "symlink", "hardlink"):
                    yield command, out, other, link


CLASH_CASES = list(_clash_cases())


def test_every_output_is_tried_against_every_other_path():
    outputs = {(c.name, _name(o)) for c, o, _, _ in CLASH_CASES}
    for case in [
        ("train", "--save"),
        ("train", "--metrics"),
        ("train", "--plot"),
        ("evaluate", "--png"),
        ("curves", "--out"),
        ("compare_pytorch", "--png"),
        ("compare_pytorch", "--out"),
        ("sweep_hparams", "--json"),
        ("loss_sequences bundle", "file"),
    ]:
        assert case in outputs, case


def _argument(action, path) -> list:
    if not action.option_strings:
        return [path]
    return [action.option_strings[-1], path]


@pytest.mark.parametrize(
    "command,out,other,link", CLASH_CASES, ids=[f"{c.name} {_name(o)}={_name(x)} {k}" for c, o, x, k in CLASH_CASES]
)
def test_an_output_that_names_another_argument_is_refused(command, out, other, link, files, tmp_path):
    """Exit 2 and the file untouched; where both name files (not a folder), the line names both."""
    original = files.get(other.dest, files["metrics"])
    if other.type is cli.existing_dir or other.type is Path:
        original = files["metrics"]  # the same file given to a folder's argument
    target = tmp_path / f"target{original.suffix}"
    target.write_bytes(original.read_bytes())
    alias = target if link == "same" else tmp_path / f"{link}{original.suffix}"
    if link == "symlink":
        alias.symlink_to(target)
    elif link == "hardlink":
        os.link(target, alias)
    before = target.read_bytes(), target.stat().st_mtime_ns
    args = _required(command, files, leave_out=(out.dest, other.dest)) + _argument(other, target)
    args += _argument(out, alias)
    if command.name == "train":
        args += ["--steps", "3"]
    status, stderr, _, _ = command.run(args)
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, (status, stderr[-2000:])
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before
    if other.type is cli.input_file or _is_output(other):
        assert _name(out) in lines[0] and _name(other) in lines[0], lines[0]


DATA_CASES = [
    (c, o)
    for c in COMMANDS
    for o in _arguments(c)
    if _is_output(o) and any(a.dest == "data_dir" for a in _arguments(c))
]


@pytest.mark.parametrize("command,out", DATA_CASES, ids=[f"{c.name} {_name(o)}" for c, o in DATA_CASES])
@pytest.mark.parametrize("named", ["--data-dir", "$MNIST_DATA_DIR"])
def test_an_output_that_names_a_data_file_is_refused(command, out, named, files, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for f in files["data_dir"].iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    target = data / "t10k-images-idx3-ubyte.gz"
    before = target.read_bytes()
    args = _required(command, files, leave_out=(out.dest,)) + _argument(out, target)
    env = {}
    if named == "--data-dir":
        args += ["--data-dir", data]
    else:
        env["MNIST_DATA_DIR"] = str(data)
    if command.name == "train":
        args += ["--steps", "3"]
    status, stderr, _, _ = command.run(args, env=env)
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, (status, stderr[-2000:])
    assert target.read_bytes() == before
    assert _name(out) in lines[0] and named in lines[0], lines[0]


def test_train_may_replace_the_checkpoint_it_continues(files, tmp_path):
    """--save may name the --init file (a run continued in place): the one pair allowed."""
    ck = tmp_path / "ck.npz"
    ck.write_bytes(files["checkpoint"].read_bytes())
    status, stderr, _, _ = COMMANDS[0].run(["--init", ck, "--save", ck, "--steps", "0"])
    assert status == 0, stderr


# ---- unreadable places -----------------------------------------------------------------------------------


NOBODY = 65534


def _as_nobody(main, argv, env=None) -> tuple[int, str]:
    """(exit status, stderr) of main(argv) in a forked child that runs as the unprivileged user `nobody`:
    root reads everything, so the permission checks are tried without it. (The child cannot read the
    interpreter's own files: what it imports on the way is imported here first.)"""
    import encodings.cp437  # noqa: F401 - zipfile's, for the checkpoint
    import secrets  # noqa: F401 - NumPy's, for the initial weights

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 70
        try:
            os.close(read)
            os.dup2(write, 2)
            sys.stderr = os.fdopen(2, "w")  # (pytest's capture stands in for it in the parent)
            os.environ.update(env or {})
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - the child reports a traceback and never returns into pytest
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)
    os.close(write)
    with os.fdopen(read) as f:
        stderr = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr


@pytest.fixture
def open_tmp():
    """A folder that `nobody` may search (pytest's own are private to root)."""
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="mistakes-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)  # (as root: whatever the modes inside)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="dropping to another user needs root (as non-root, the permission checks run in test_cli.py)",
)


@needs_root
def test_unreadable_folders_and_files_are_one_line(open_tmp, files):
    from mnist_cuda import curves, data_command, evaluate, predict, train

    locked = open_tmp / "locked"
    locked.mkdir()
    ck = open_tmp / "model.npz"
    ck.write_bytes(files["checkpoint"].read_bytes())
    ck.chmod(0o644)
    hidden = locked / "model.npz"
    hidden.write_bytes(ck.read_bytes())
    for f in files["data_dir"].iterdir():
        (locked / f.name).write_bytes(f.read_bytes())
    secret = open_tmp / "secret.npz"
    secret.write_bytes(ck.read_bytes())
    secret.chmod(0o600)
    locked.chmod(0o700)  # root's: `nobody` may neither list nor search it
    cases = [
        (train.main, ["--data-dir", str(locked), "--steps", "1"], {}, ["--data-dir", "cannot be read"]),
        (train.main, ["--steps", "1"], {"MNIST_DATA_DIR": str(locked)}, ["cannot be read"]),
        (train.main, ["--init", str(hidden)], {}, ["--init", "cannot be reached"]),
        (train.main, ["--init", str(secret)], {}, ["--init", "not readable"]),
        (train.main, ["--save", str(locked / "m.npz"), "--steps", "0"], {}, ["--save", "cannot be reached"]),
        (train.main, ["--save", str(open_tmp / "m.npz"), "--steps", "0"], {}, ["--save", "not writable"]),
        (evaluate.main, [str(ck), "--data-dir", str(locked)], {}, ["--data-dir", "cannot be read"]),
        (evaluate.main, [str(ck)], {"MNIST_DATA_DIR": str(locked)}, ["cannot be read"]),
        (predict.main, [str(ck), str(locked / "digit.png")], {}, ["IMAGE", "cannot be reached"]),
        (curves.main, [str(locked / "run.jsonl")], {}, ["METRICS", "cannot be reached"]),
        (data_command.main, ["--data-dir", str(locked)], {}, ["cannot be read"]),
    ]
    for main, argv, env, words in cases:
        status, stderr = _as_nobody(main, argv, env)
        lines = stderr.strip().splitlines()
        assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, (argv, status, stderr[-2000:])
        for word in words:
            assert word in lines[0], (argv, word, lines[0])
    # an unreadable cache is not the user's mistake: no download is tried here, and it says why in one line
    status, stderr = _as_nobody(data_command.main, [], {"MNIST_CUDA_CACHE": str(locked)})
    assert status == 1 and len(stderr.strip().splitlines()) == 1 and "permission denied" in stderr, stderr


# ---- checkpoints -----------------------------------------------------------------------------------------


def _damaged(tmp_path, name, change, momentum=False):
    state = reference.init_state_dict(0, (4, 8), 16)
    if momentum:
        state.update(
            {
                checkpoint.MOMENTUM_PREFIX + k: np.zeros(s, np.float32)
                for k, s in reference.param_shapes((4, 8), 16).items()
            }
        )
    change(state)
    return checkpoint.save_checkpoint(tmp_path / f"{name}.npz", state, {"batch_size": 32, "kernels": "naive"})


def _set(key, index, value):
    def change(state):
        state[key] = state[key].copy()
        state[key][index] = value

    return change


def _retype(key, dtype):
    def change(state):
        state[key] = state[key].astype(dtype)

    return change


DAMAGE = {
    "nan weight": (_set("fc1.weight", (3, 5), np.nan), False, ["fc1.weight", "nan", "[3, 5]"]),
    "inf bias": (_set("conv1.weight", (0, 0, 1, 1), -np.inf), False, ["conv1.weight", "-inf"]),
    "negative variance": (_set("bn2.running_var", 2, -0.5), False, ["bn2.running_var", "negative variance"]),
    "nan statistic": (_set("bn1.running_mean", 0, np.nan), False, ["bn1.running_mean", "nan"]),
    "negative count": (
        lambda s: s.update({"bn1.num_batches_tracked": np.array(-3, np.int64)}),
        False,
        ["bn1.num_batches_tracked", "-3"],
    ),
    "complex momentum": (
        _retype(checkpoint.MOMENTUM_PREFIX + "fc2.bias", np.complex64),
        True,
        ["momentum_buffer.fc2.bias", "complex64", "float32"],
    ),
    "float64 momentum": (
        _retype(checkpoint.MOMENTUM_PREFIX + "conv1.weight", np.float64),
        True,
        ["momentum_buffer.conv1.weight", "float64"],
    ),
    "nan momentum": (_set(checkpoint.MOMENTUM_PREFIX + "bn1.bias", 1, np.nan), True, ["momentum_buffer.bn1.bias"]),
    "float16 weight": (_retype("fc1.bias", np.float16), False, ["fc1.bias", "float16"]),
    "float count": (_retype("bn2.num_batches_tracked", np.float64), False, ["bn2.num_batches_tracked", "float64"]),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_refused_naming_the_array(case, tmp_path):
    change, momentum, words = DAMAGE[case]
    path = _damaged(tmp_path, case.replace(" ", "_"), change, momentum)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_model(path)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    out = tmp_path / "next.npz"
    status, stderr, _, _ = COMMANDS[0].run(["--init", path, "--steps", "0", "--save", out])
    assert status == 2 and "--init" in stderr and words[0] in stderr and not out.exists(), stderr
    status, stderr, _, _ = COMMANDS[1].run([path])
    assert status == 2 and "CHECKPOINT" in stderr and words[0] in stderr, stderr


def test_an_archive_that_claims_a_huge_array_allocates_nothing(tmp_path):
    """A few hundred bytes whose header claims fc1's weight has a million rows: refused from the header."""
    import io

    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, value in reference.init_state_dict(0).items():
            if name != "fc1.weight":
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, value)
                z.writestr(name + ".npy", buffer.getvalue())
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 3136)})
        z.writestr("fc1.weight.npy", header.getvalue())
        meta = io.BytesIO()
        np.lib.format.write_array(meta, np.array(json.dumps({"format": checkpoint.FORMAT})))
        z.writestr(checkpoint.META_KEY + ".npy", meta.getvalue())
    status, stderr, peak, _ = COMMANDS[0].run(["--init", path])
    assert status == 2 and "--init" in stderr and "fc1's weight" in stderr, stderr
    assert peak < PEAK_RSS_LIMIT
    # the checkpoint's model, which no flag makes: named as the checkpoint's, not as --channels and --hidden
    words = f"{path}: the checkpoint's model (channels 32,64, hidden 1000000) makes fc1's weight 1,000,000 x 3,136"
    assert f"argument --init: {words}" in stderr and "--hidden" not in stderr.split("(see")[0], stderr
    status, stderr, _, _ = COMMANDS[1].run([path])
    assert status == 2 and f"argument CHECKPOINT: {words}" in stderr and "--hidden" not in stderr.split("(see")[0], (
        stderr
    )


# ---- messages ----------------------------------------------------------------------------------------


def test_each_message_names_the_real_problem(tmp_path, files):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "plain.json").write_text('{"schema": "x"}')
    loop, long_name = tmp_path / "loop", tmp_path / ("a" * 300 + ".npz")
    loop.symlink_to(loop)
    looping, too_long = os.strerror(errno.ELOOP), os.strerror(errno.ENAMETOOLONG)
    cases = [
        (COMMANDS[0], ["--save", long_name, "--steps", "0"], ["--save", f"{long_name}: {too_long}"]),
        (COMMANDS[0], ["--save", loop, "--steps", "0"], ["--save", f"{loop}: {looping}"]),
        (COMMANDS[1], [loop], ["CHECKPOINT", f"{loop}: {looping}"]),
        (COMMANDS[1], [files["checkpoint"], "--data-dir", loop], ["--data-dir", f"{loop}: {looping}"]),
        (COMMANDS[2], [files["checkpoint"], long_name], ["IMAGE", f"{long_name}: {too_long}"]),
        (COMMANDS[4], ["--data-dir", loop], [f"the data folder {loop}: {looping}"]),
        (COMMANDS[0], ["--init", "/dev/null"], ["--init", "not a regular file"]),
        (COMMANDS[0], ["--init", fifo], ["--init", "not a regular file"]),
        (COMMANDS[2], [files["checkpoint"], fifo], ["IMAGE", "not a regular file"]),
        (COMMANDS[3], [fifo], ["METRICS", "not a regular file"]),
        (COMMANDS[0], ["--lr", "-1e-3"], ["--lr", "positive"]),
        (COMMANDS[0], ["--momentum", "-inf"], ["--momentum", "at least 0"]),
        (COMMANDS[0], ["--target-accuracy", "1e300"], ["--target-accuracy", "at most 100"]),
        (COMMANDS[0], ["--channels", "32,60000"], ["--channels", "32-bit"]),
        (COMMANDS[0], ["--batch-size", FAR], ["--batch-size", "characters"]),
        (COMMANDS[3], [files["checkpoint"]], ["not a text file"]),
        (COMMANDS[1], [files["checkpoint"], "--batch-size", "60001"], ["--batch-size", "at most 60000"]),
    ]
    for command, args, words in cases:
        status, stderr, _, _ = command.run(args)
        lines = stderr.strip().splitlines()
        assert status == 2 and len(lines) == 1, (args, stderr[-2000:])
        for word in words:
            assert word in lines[0], (args, word, lines[0])
        assert "expected one argument" not in lines[0] and "is a folder" not in lines[0] and "<class" not in lines[0]
        assert "permission" not in lines[0], (args, lines[0])


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_help_explains_in_place(command):
    """Every command prints its help, and no help text points elsewhere ("see above") for its explanation."""
    parser = command.parser()
    for action in [] if parser is None else parser._actions:
        assert "see above" not in (action.help or "") and "see below" not in (action.help or ""), action.dest
    out = subprocess.run(
        [sys.executable, *command.argv, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0 and out.stdout.startswith("usage:"), (out.stdout[:200], out.stderr[-2000:])


# ---- flags without effect --------------------------------------------------------------------------------


NO_EFFECT = [
    (["--gamma", "0.5"], "--gamma needs --schedule step"),
    (["--step-size", "10", "--schedule", "cosine"], "--step-size needs --schedule step"),
    (["--anneal", "linear", "--schedule", "step", "--step-size", "5"], "--anneal needs --schedule onecycle"),
    (["--pct-start", "0.2"], "--pct-start needs --schedule onecycle"),
    (["--dampening", "0.1"], "--dampening needs --momentum > 0"),
    (["--dampening", "0", "--momentum", "0"], "--dampening needs --momentum > 0"),
    (["--epochs", "3", "--steps", "10"], "argument --epochs: changes nothing with --steps 10"),
    (
        ["--steps", "0", "--save", "{tmp}/m.npz", "--metrics", "{tmp}/m.jsonl"],
        "argument --metrics: changes nothing with --steps 0",
    ),
    (["--steps", "0", "--save", "{tmp}/m.npz", "--eager"], "argument --eager: changes nothing with --steps 0"),
    (["--steps", "0", "--save", "{tmp}/m.npz", "--target-accuracy", "99"], "argument --target-accuracy"),
    (["--steps", "0", "--save", "{tmp}/m.npz", "--epochs", "3"], "argument --epochs: changes nothing with --steps 0"),
]


@pytest.mark.parametrize("args,words", NO_EFFECT, ids=[" ".join(a) for a, _ in NO_EFFECT])
def test_a_flag_that_changes_nothing_is_refused(args, words, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    status, stderr, _, _ = COMMANDS[0].run(args)
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and words in lines[0], stderr
    assert list(tmp_path.iterdir()) == []


def test_the_rule_is_the_optimizers_for_the_comparison_too():
    """compare_pytorch.py takes SGD's flags from mnist_cuda.optim: the same rule holds there."""
    status, stderr, _, _ = COMMANDS[5].run(["--parity-only", "--gamma", "0.5"])
    assert status == 2 and "--gamma needs --schedule step" in stderr, stderr


def test_flags_that_act_are_accepted(tmp_path):
    """The rule refuses no flag that acts: --epochs sets a new schedule's length with --steps 0, a recipe's
    flags fill what is not given, --no-nesterov turns off a checkpoint's Nesterov momentum."""
    fast = tmp_path / "fast.npz"
    for args in (
        ["--steps", "0", "--epochs", "3", "--schedule", "cosine"],
        ["--recipe", "fast", "--steps", "0"],
        ["--momentum", "0.9", "--dampening", "0.1", "--steps", "0"],
        ["--schedule", "step", "--step-size", "3", "--gamma", "0.5", "--steps", "0"],
    ):
        status, stderr, _, _ = COMMANDS[0].run([*args, "--save", fast])
        assert status == 0, (args, stderr)
    status, stderr, _, _ = COMMANDS[0].run(["--init", fast, "--momentum", "0", "--steps", "0", "--save", fast])
    assert status == 0, stderr  # the checkpoint's dampening is dropped, not blamed on a flag not given


# ---- warnings --------------------------------------------------------------------------------------------


def test_pillows_warnings_become_one_line(tmp_path, files):
    Image = pytest.importorskip("PIL.Image")
    big = tmp_path / "big.png"
    Image.new("L", (200, 150), 255).save(big)  # 30,000 pixels: a "bomb" under the limit set below
    palette = tmp_path / "palette.png"
    image = Image.new("P", (40, 40), 0)
    image.putpalette([255, 255, 255, 0, 0, 0] + [0] * 762)
    image.paste(1, (10, 5, 30, 35))
    image.info["transparency"] = bytes([255, 0] + [255] * 254)  # transparency as bytes: Pillow warns on convert
    image.save(palette, transparency=bytes([255, 0] + [255] * 254))
    code = (
        "import sys; from PIL import Image; Image.MAX_IMAGE_PIXELS = 20000; from mnist_cuda.predict import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    too_large = Command("predict", ["-c", code], lambda: None)
    status, stderr, _, _ = too_large.run([files["checkpoint"], big])
    assert status == 2 and stderr.strip().count("\n") == 0 and "too large" in stderr and "Warning" not in stderr, stderr
    status, stderr, _, _ = COMMANDS[2].run([files["checkpoint"], palette])  # read, then: no GPU here
    assert status == 2 and stderr.strip().count("\n") == 0 and "Warning" not in stderr, stderr


def test_matplotlibs_warnings_stay_silent(tmp_path, files):
    pytest.importorskip("matplotlib")
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"step": 1, "epoch": 1, "loss": 0.0}) + "\n")  # one point, at 0 on a log scale
    status, stderr, _, _ = COMMANDS[3].run([one, "--out", tmp_path / "one.png"], timeout=120)
    assert status == 0 and stderr == "", stderr
