"""dev/ladder.py and the rungs of dev/ladder/: without a GPU, every rung compiles with NVRTC for the H100 (sm_90) and
an A100 (sm_80), its file is short and says what it adds, the table lists every file, rung 01 stays the product's
naive kernel, and the command refuses a bad op in one line; on a GPU, every rung against the float64 reference at
every check shape, and the command end to end."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import DEV, REPO, load_script
from mnist_cuda import cuda

ladder = load_script(DEV / "ladder.py")
NEEDS_CUPY = "CuPy is not installed (pip install '.[cuda12]')"
MAX_LINES = 150
ladder_op = sys.modules["ladder_op"]  # registered by load_script, as ladder.py imports it
ALL_RUNGS = [(op, rung) for op, spec in ladder.OPS.items() for rung in spec.rungs]
ALL_IDS = [f"{op}/{rung.name}" for op, rung in ALL_RUNGS]
RUNGS = [(op, rung) for op, rung in ALL_RUNGS if isinstance(rung, ladder_op.Rung)]  # the ladder's own files
RUNG_IDS = [f"{op}/{rung.name}" for op, rung in RUNGS]
CHECKS = [(op, rung, shape) for op, rung in ALL_RUNGS for shape in ladder.OPS[op].check_shapes if rung.accepts(shape)]
CONV2_FORWARD = ladder.OPS["conv2_forward"]


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, str(DEV / "ladder.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=600,
    )


def header(text: str) -> list[str]:
    """The comment lines a file starts with."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return lines


# ---- the rung files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("op,rung", RUNGS, ids=RUNG_IDS)
def test_every_rung_compiles(op, rung, arch):
    pytest.importorskip("cupy", reason=NEEDS_CUPY)
    assert ladder.source(op, rung).compile_check(arch) is None


def test_the_table_lists_every_rung_file_in_order():
    """Each folder of dev/ladder/ is an op of OPS, its .cu files exactly the op's own rungs, numbered upwards (gaps
    allowed: room for rungs to come); each file's one kernel is the rung's, named <op>_rung<NN>_<name> from rung 02
    on (rung 01 is the product's naive kernel, by its own name). The top rung, NN_product, is the product's kernel
    file itself, numbered above the others, and holds the kernels it names; the product in bf16, NN_product_bf16,
    may stand above it, and above that the bf16 product reading its other operands as bf16 copies,
    NN_product_bf16_operands, or the bf16 product in its persistent form, NN_product_bf16_persistent, and that
    form with its output's moments for BatchNorm's statistics, NN_product_bf16_moments, and above that the fp32
    product with its output's moments a block per tile, NN_product_tile_moments, and that product as a persistent
    block of two warpgroups, NN_product_warpgroup_pair, and those with a producer warpgroup staging each one's chunks,
    NN_product_warp_specialized; or above the product in bf16 the
    product in another form for large batches, in fp32 and in bf16, NN_product_staged and NN_product_staged_bf16;
    below the product, the product in its CUDA cores' form, NN_product_cuda_cores, where it takes the tensor cores
    too, or without its staging's L2 prefetch, NN_product_no_l2_prefetch (and above the product in bf16 the same
    reading its operands from the layout its staging reads best, NN_product_bf16_from_layout)."""
    folders = sorted(p.name for p in ladder.LADDER.iterdir() if p.is_dir())
    assert folders == sorted(ladder.OPS)
    for op, spec in ladder.OPS.items():
        own = [r for r in spec.rungs if isinstance(r, ladder_op.Rung)]
        top = spec.rungs[len(own) :]
        assert all(isinstance(r, ladder_op.ProductRung) for r in top), op
        tops = (
            [],
            ["product"],
            ["product", "product_bf16"],
            ["product", "product_bf16", "product_bf16_operands"],
            ["product", "product_bf16", "product_bf16_persistent"],
            ["product", "product_bf16", "product_bf16_persistent", "product_bf16_moments"],
            ["product", "product_bf16", "product_bf16_persistent", "product_bf16_moments", "product_tile_moments"],
            [
                "product",
                "product_bf16",
                "product_bf16_persistent",
                "product_bf16_moments",
                "product_tile_moments",
                "product_warpgroup_pair",
                "product_warp_specialized",
            ],
            ["product_cuda_cores", "product", "product_bf16"],
            ["product_no_l2_prefetch", "product", "product_bf16"],
            ["product_no_l2_prefetch", "product", "product_bf16", "product_bf16_from_layout"],
            ["product", "product_bf16", "product_staged", "product_staged_bf16"],
        )
        assert [re.sub(r"^\d\d_", "", r.name) for r in top] in tops, op
        files = sorted(p.name for p in (ladder.LADDER / op).glob("*.cu"))
        assert files == [r.file for r in own], op
        numbers = [int(re.match(r"(\d\d)_\w+\.cu$", f).group(1)) for f in files]
        assert numbers[0] == 1 and numbers == sorted(set(numbers)), files
        for below, rung in zip([numbers[-1]] + [int(r.name[:2]) for r in top], top):
            assert int(rung.name[:2]) > below, rung.name
            product = (cuda.kernel_dir() / rung.path).read_text()
            for name in re.findall(r"\b(\w+_fast)\b", rung.kernel):
                assert f" {name}(" in product, (rung.path, name)
        for number, rung in zip(numbers, own):
            assert cuda.entry_points((ladder.LADDER / op / rung.file).read_text()) == rung.kernels, rung.file
            if number > 1 and len(rung.kernels) == 1:
                assert rung.kernel == f"{op}_rung{rung.name[:2]}_{rung.name[3:]}", rung.kernel
            elif number > 1:
                assert all(k.startswith(f"{op}_rung{rung.name[:2]}_") for k in rung.kernels), rung.kernel


@pytest.mark.parametrize("op,rung", RUNGS, ids=RUNG_IDS)
def test_every_rung_file_is_short_and_says_what_it_adds(op, rung):
    """Under MAX_LINES lines; a header that names the rung ("// Rung NN, name: ...") and, above rung 01, says what
    it adds over the rung below; every -D option the file requires is one its launch passes."""
    text = (ladder.LADDER / op / rung.file).read_text()
    assert len(text.splitlines()) < MAX_LINES, rung.file
    lines = header(text)
    number = int(rung.file[:2])
    assert len(lines) >= 3 and lines[0].startswith(f"Rung {number:02d}, "), lines[:1]
    spec = ladder.OPS[op]
    below = max((int(r.name[:2]) for r in spec.rungs if int(r.name[:2]) < number), default=None)
    if below is not None:
        assert f"What it adds over rung {below:02d}" in " ".join(lines), rung.file
    for guard in re.findall(r"^#if\s+(!defined\(\w+\)(?:\s*\|\|\s*!defined\(\w+\))*)", text, re.MULTILINE):
        assert set(re.findall(r"!defined\((\w+)\)", guard)) <= set(rung.defines), rung.file


def _function(text: str, name: str) -> str:
    """A kernel's text, from its `extern "C"` line to the closing brace at the start of a line."""
    start = text.index(f'extern "C" __global__ void {name}(')
    return text[start : text.index("\n}\n", start) + 3]


@pytest.mark.parametrize("op", list(ladder.OPS))
def test_rung_01_is_the_products_naive_kernel(op):
    """Each op's rung 01 is the product's naive kernel (Op.naive; or its naive kernels, in order, from one file or
    several), to the byte."""
    spec = ladder.OPS[op]
    pairs = [spec.naive] if isinstance(spec.naive[0], str) else list(spec.naive)
    rung = spec.rungs[0]
    assert rung.kernels == [name for _, names in pairs for name in names.split(" + ")]
    copy = (ladder.LADDER / op / rung.file).read_text()
    for path, names in pairs:
        product = (cuda.kernel_dir() / path).read_text()
        for name in names.split(" + "):
            assert _function(copy, name) == _function(product, name), name


# ---- the launches ---------------------------------------------------------------------------------------------


def _launched(op, rung, shape) -> list[tuple[tuple, int]]:
    """(grid, block) of each launch of the rung at a shape, recorded instead of launched (a string stands for each
    array; a rung of several kernels gets a stand-in for each, in order)."""
    spec, seen = ladder.OPS[op], []

    def stand_in():
        return types.SimpleNamespace(
            launch=lambda grid, block, *args, **kw: seen.append((grid, block, args)),
            launch_1d=lambda n, *args, block=256: seen.append(((cuda.ceil_div(n, block),), block, args)),
        )

    kernel = stand_in() if len(rung.kernels) == 1 else tuple(stand_in() for _ in rung.kernels)
    names = [*spec.inputs(np.random.default_rng(0), spec.check_shapes[0]), *spec.outputs(shape)]
    names += list(spec.scratch(shape)) if spec.scratch else []
    rung.launch(kernel, shape, *names)
    assert seen, rung.name
    for _, _, args in seen:
        sizes = [a for a in args if not isinstance(a, str)]
        assert all(isinstance(a, np.generic) and a.dtype in ("int32", "float32") for a in sizes), args
    return [(tuple(grid) if isinstance(grid, tuple) else (grid,), block) for grid, block, _ in seen]


@pytest.mark.parametrize("op,rung", RUNGS, ids=RUNG_IDS)
def test_launches_stay_within_cudas_limits(op, rung):
    spec = ladder.OPS[op]
    for shape in spec.check_shapes + tuple(spec.network_shape(b) for b in (1, 64, 4096, 60000)):
        for grid, block in _launched(op, rung, shape):
            assert 32 <= block <= 1024 and block % 32 == 0, (shape, block)
            assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), (shape, grid)


def test_too_many_images_for_the_grid_is_refused():
    rung = CONV2_FORWARD.rungs[1]
    with pytest.raises(ValueError, match="grid z"):
        _launched("conv2_forward", rung, ladder_op.Conv(65536, 32, 64, 14, 14))


def test_floor_is_the_slower_of_flops_and_bytes_at_the_rungs_peak():
    shape = ladder_op.Conv(64, 32, 64, 14, 14)
    flops, nbytes = CONV2_FORWARD.work(shape)
    assert flops == 2 * 64 * 64 * 196 * 32 * 9 and nbytes == 4 * (64 * 32 * 196 + 64 * 32 * 9 + 64 * 64 * 196)
    naive, product, bf16 = (
        next(r for r in CONV2_FORWARD.rungs if r.name == n) for n in ("01_naive", "09_product", "10_product_bf16")
    )
    assert ladder_op.floor_us(CONV2_FORWARD, naive, shape) == pytest.approx(flops / 67e12 * 1e6)  # compute-bound
    assert ladder_op.floor_us(CONV2_FORWARD, product, shape) == pytest.approx(3 * flops / 495e12 * 1e6)  # 3xTF32
    # bf16: its own bytes (x and y as bf16), which take longer than its products at the bf16 rate
    bf16_bytes = 4 * 64 * 32 * 9 + 2 * (64 * 32 * 196 + 64 * 64 * 196)
    assert ladder_op.floor_us(CONV2_FORWARD, bf16, shape) == pytest.approx(bf16_bytes / 4.8e12 * 1e6)
    assert flops / 990e12 < bf16_bytes / 4.8e12


# ---- the command ----------------------------------------------------------------------------------------------


def test_a_bad_op_is_refused_in_one_line():
    r = run("conv7_sideways")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "unknown op 'conv7_sideways'" in r.stderr and "conv2_forward" in r.stderr


def test_a_missing_gpu_is_one_line():
    r = run("conv2_forward", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_help_explains_every_flag():
    r = run("--help")
    assert r.returncode == 0
    for action in ladder.build_parser()._actions:
        assert action.help and len(action.help) > 10, action.dest
        assert all(flag in r.stdout for flag in action.option_strings), action.dest


def test_the_tables_and_the_json_with_the_gpu_stood_in_for(monkeypatch, tmp_path, capsys):
    """main's flow without a GPU: the checks stood in for (rung 02 failing), the timings too (halving per rung).
    A failing rung is not timed and the exit status is 1; the speed-up is over the rung timed before; the fraction
    of the floor is the floor over the time."""
    names = [rung.name for rung in CONV2_FORWARD.rungs]
    monkeypatch.setattr(ladder, "gpu_or_exit", lambda prog: None)
    monkeypatch.setattr(ladder.cuda, "preload", lambda sources: None)
    device = types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"Stand-in GPU"})
    monkeypatch.setattr(
        ladder.cuda, "require_gpu", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=device))
    )
    monkeypatch.setattr(ladder, "check", lambda op, rung, shape, rng: 1.0 if rung.name == names[1] else 1e-7)
    monkeypatch.setattr(ladder, "prepare", lambda op, rung, shape, rng: rung)
    monkeypatch.setattr(ladder, "time_case", lambda rung, warmup, repeat, sources: 400.0 / 2 ** names.index(rung.name))
    out = tmp_path / "ladder.json"
    assert ladder.main(["conv2_forward", "--batch-sizes", "64,512", "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "FAIL" in printed and f"result: {out}" in printed
    result = json.loads(out.read_text())
    assert result["device"] == "Stand-in GPU"
    assert result["peaks"] == {
        "flops": {"fp32": 67e12, "tf32": 495e12, "3xtf32": 165e12, "bf16": 990e12},
        "hbm_bytes_per_s": 4.8e12,
    }
    accepted = [sum(rung.accepts(s) for s in CONV2_FORWARD.check_shapes) for rung in CONV2_FORWARD.rungs]
    assert accepted[:3] == [5, 5, 5] and accepted[-1] == 2  # the product: the network's geometry only
    assert [r["ok"] for r in result["checks"]] == [
        ok for name, n in zip(names, accepted) for ok in [name != names[1]] * n
    ]
    rows = [(r["rung"], r["batch"], r["us"], r["speedup"]) for r in result["timings"]]
    assert rows[:4] == [
        (names[0], 64, 400, None),
        (names[0], 512, 400, None),
        (names[2], 64, 100, 4),
        (names[2], 512, 100, 4),
    ]
    assert [r["rung"] for r in result["timings"]] == [n for n in names if n != names[1] for _ in (64, 512)]
    shape = ladder_op.Conv(512, 32, 64, 14, 14)
    for row, rung in ((result["timings"][3], CONV2_FORWARD.rungs[2]), (result["timings"][-1], CONV2_FORWARD.rungs[-1])):
        floor = ladder_op.floor_us(CONV2_FORWARD, rung, shape)
        assert row["floor_us"] == pytest.approx(floor) and row["fraction_of_floor"] == pytest.approx(floor / row["us"])


# ---- on a GPU -------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("op,rung,shape", CHECKS, ids=[f"{op}/{rung.name}/{shape}" for op, rung, shape in CHECKS])
def test_rung_matches_reference(op, rung, shape):
    err = ladder.check(op, rung, shape, np.random.default_rng())
    assert err < rung.tolerance, f"{rung.file} at {shape}: relative error {err:.2e}"


@pytest.mark.gpu
def test_the_command_checks_and_times_every_rung(tmp_path):
    out = tmp_path / "ladder.json"
    r = run("conv2_forward", "--batch-sizes", "64", "--warmup", "1", "--repeat", "20", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    names = [rung.name for rung in CONV2_FORWARD.rungs]
    assert [row["rung"] for row in result["timings"]] == names
    assert all(row["ok"] for row in result["checks"])
    assert len(result["checks"]) == sum(
        rung.accepts(s) for rung in CONV2_FORWARD.rungs for s in CONV2_FORWARD.check_shapes
    )
    assert all(row["us"] > 0 and 0 < row["fraction_of_floor"] < 1 for row in result["timings"])
    assert result["timings"][0]["speedup"] is None and all(row["speedup"] for row in result["timings"][1:])


# ---- the timing tables in the docs -----------------------------------------------------------------------------


def _timing_rows(text: str, first_number: int) -> dict[str, list[str]]:
    """The rows of the ladder timing tables in text: rung -> its cells from the first timing (us at 64) on."""
    rows = {}
    for line in text.split("\n"):
        m = re.match(r"\| `(\d\d_\w+)` \|", line)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if m and len(cells) > first_number + 3 and re.fullmatch(r"[\d,]+\.\d+", cells[first_number]):
            rows[m.group(1)] = cells[first_number:]
    return rows


def _shown(cell: str, value: float) -> bool:
    """Whether a table cell shows value, rounded to the cell's decimals."""
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return float(cell.replace(",", "")) == round(value, decimals)


@pytest.mark.parametrize("op", sorted(ladder.OPS))
def test_the_docs_show_the_committed_ladder_timings(op):
    """Each ladder README's timing table and docs/kernels.md's table for the op show every rung of the committed
    result (benchmarks/results/ladder-h200-OP.json) with its times at 64, 512 and 4096 and its speed-up at 512, so a
    re-timing cannot leave a stale figure behind."""
    result = json.loads((REPO / "benchmarks" / "results" / f"ladder-h200-{op}.json").read_text())
    timings = {}
    for t in result["timings"]:
        timings.setdefault(t["rung"], {})[t["batch"]] = t
    tour = (REPO / "docs" / "kernels.md").read_text()
    section = re.search(rf"^### 3\.\d+ {op}:.*?(?=^### |\Z)", tour, re.S | re.M)
    assert section, f"docs/kernels.md has no section for {op}"
    for where, rows in (
        (f"dev/ladder/{op}/README.md", _timing_rows((REPO / "dev" / "ladder" / op / "README.md").read_text(), 1)),
        ("docs/kernels.md", _timing_rows(section.group(0), 2)),
    ):
        assert set(rows) == set(timings), (where, sorted(rows), sorted(timings))
        for rung, cells in rows.items():
            t = timings[rung]
            for cell, batch in zip(cells[:3], (64, 512, 4096)):
                assert _shown(cell, t[batch]["us"]), (where, rung, batch, cell, t[batch]["us"])
            speedup = t[512]["speedup"]
            assert cells[4] in ("-", "--") if speedup is None else _shown(cells[4].rstrip("x"), speedup), (where, rung)
    # each rung's own subsection in docs/kernels.md ("#### NN ...") opens with its figures at 512
    rung = None
    for line in section.group(0).split("\n"):
        heading = re.match(r"#### (\d\d) ", line)
        if heading:
            rung = next((r for r in timings if r.startswith(heading.group(1) + "_")), None)
        figures = re.match(r"\*?H200, batch 512: (?:\*\*)?([\d,]+\.\d+) us", line)
        if figures and rung:
            assert _shown(figures.group(1), timings[rung][512]["us"]), ("docs/kernels.md", rung, line)
            speedup = re.search(r", ([\d.]+)x (?:over|the rung below)", line)
            if speedup:
                assert _shown(speedup.group(1), timings[rung][512]["speedup"]), ("docs/kernels.md", rung, line)
