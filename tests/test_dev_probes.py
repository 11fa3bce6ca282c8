"""The probes in dev/: bf16_distance.py (PyTorch's bf16 distance to its fp32 run), pdl_probe.py (programmatic
dependent launch in the step graph), wgmma_rate.py (conv2's instruction stream alone on the tensor cores) and
conv2_tile_ablation.py (conv2's forward tiles with parts left out)."""

import json

import pytest

from conftest import REPO, load_script, mnist_or_skip, run_program

BF16 = REPO / "dev" / "bf16_distance.py"


def run(*args):
    return run_program(BF16, *args)


def refuses_in_one_line(script, flag: str, value: str) -> bool:
    """The script exits 2 on a bad value of flag, with one line that names it."""
    r = run_program(script, flag, value)
    return r.returncode == 2 and flag in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bf16_distance_rejects_a_bad_flag_in_one_line():
    r = run("--seeds", "0")
    assert r.returncode == 2 and "--seeds" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_bf16_distance_measures_both_distances(tmp_path):
    """A short run: fp32 stays far closer to fp64 than bf16 to fp32 (bf16 keeps 8 bits of mantissa)."""
    pytest.importorskip("torch", reason="torch is not installed (the comparison's extra)")
    mnist = mnist_or_skip()
    out = tmp_path / "bf16.json"
    r = run("--data-dir", str(mnist), "--steps", "60", "--seeds", "1", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads(out.read_text())["seeds"]["0"]
    assert 0 < row["fp32_vs_fp64"]["all"] < 1e-4
    assert row["bf16_vs_fp32"]["all"] > 10 * row["fp32_vs_fp64"]["all"]


PDL = REPO / "dev" / "pdl_probe.py"


def test_pdl_probe_places_one_wait_per_kernel():
    """Each variant waits once in every kernel: first, or where PROLOGUES ends its prologue (each found once where
    its kernels are); the trigger variants trigger in every kernel."""
    import mnist_cuda.ops  # noqa: F401  (its modules declare the sources)
    from mnist_cuda import cuda

    probe = load_script(PDL)
    found = set()
    for variant, transform in probe.VARIANTS.items():
        if transform is None:
            continue
        for source in cuda.sources():
            text = cuda.read_source(source.path)
            names = set(cuda.entry_points(text))
            out = transform(source.path, text)
            waits = len(names)
            if "prologue" in variant:
                placed = [kernels for kernels, end, _ in probe.PROLOGUES if not names.isdisjoint(kernels)]
                waits += len(placed) - len(names & probe.PROLOGUE_KERNELS)
                found.update(*(names & set(kernels) for kernels in placed))
            assert out.count("griddepcontrol.wait;") == waits, (variant, source.path)
            assert out.count("griddepcontrol.launch_dependents;") == (len(names) if "trigger" in variant else 0)
    assert found == probe.PROLOGUE_KERNELS  # every kernel named is one of the product's


def test_pdl_probe_refuses_a_prologue_it_cannot_find():
    probe = load_script(PDL)
    source = 'extern "C" __global__ void conv2_forward_persistent_fast(const float* x) {\n    x += 1;\n}\n'
    with pytest.raises(RuntimeError, match="prologue"):
        probe.after_prologues(False)("k.cu", source)


def test_pdl_probe_rejects_a_bad_flag_in_one_line():
    assert refuses_in_one_line(PDL, "--repeats", "0")


@pytest.mark.gpu
def test_pdl_probe_launches_give_the_plain_steps_bits(tmp_path):
    mnist_dir = mnist_or_skip()
    out = tmp_path / "pdl.json"
    r = run_program(
        PDL,
        "--data-dir",
        str(mnist_dir),
        "--batch-sizes",
        "64",
        "--steps",
        "20",
        "--repeats",
        "1",
        "--check-steps",
        "5",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    variants = ("plain", "wait", "wait+trigger", "prologue", "trigger+prologue")
    assert result["weights_as_plain"] == {v: {"64": True} for v in variants}
    programmatic = {v: edges["64"]["programmatic"] for v, edges in result["graph_edges"].items()}
    assert programmatic["plain"] == 0 and all(programmatic[v] > 0 for v in variants[1:])


WGMMA_RATE = REPO / "dev" / "wgmma_rate.py"


def test_wgmma_rate_writes_one_register_per_accumulator():
    """The generated product lists N / 2 accumulators, then the two descriptors, in the instruction of its type."""
    probe = load_script(WGMMA_RATE)
    text = probe.product_function(112, "tf32")
    assert "m64n112k8.f32.tf32.tf32 {%0," in text and "%55}, %56, %57, 1, 1, 1;" in text
    assert text.count('"+f"(d[') == 56
    assert "m64n224k16.f32.bf16.bf16" in probe.product_function(224, "bf16")


def test_wgmma_rate_rejects_a_bad_flag_in_one_line():
    assert refuses_in_one_line(WGMMA_RATE, "--groups", "5")


@pytest.mark.gpu
def test_wgmma_rate_measures_every_variant_below_the_dense_rate(tmp_path):
    """Every variant runs, and none beats the tensor cores' dense rate (products left out would)."""
    out = tmp_path / "rate.json"
    r = run_program(WGMMA_RATE, "--groups", "200", "--repeat", "2", "--json", str(out))
    if r.returncode == 2 and "Hopper" in r.stderr:
        pytest.skip("wgmma needs a Hopper GPU")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(list(load_script(WGMMA_RATE).variants()))
    assert all(0.05 < row["of_dense"] <= 1.02 for row in rows), rows


ABLATION = REPO / "dev" / "conv2_tile_ablation.py"


def test_conv2_tile_ablation_finds_each_part_once_in_the_kernel():
    """Every part the probe leaves out is where it expects it in today's kernel source, once, and is guarded off."""
    from mnist_cuda.cuda import read_source

    probe = load_script(ABLATION)
    text = read_source("fast/2_conv2_implicit_gemm.cu")
    for original, guarded in probe.PARTS.values():
        assert text.count(original) == 1 and guarded not in text
    everything = probe.leave_out(tuple(probe.PARTS))("2_conv2_implicit_gemm.cu", text)
    assert all(guarded in everything for _, guarded in probe.PARTS.values())
    with pytest.raises(RuntimeError, match="store"):
        probe.leave_out(("store",))("k.cu", "void conv3x3_image_tile(int x) {}")


def test_conv2_tile_ablation_rejects_a_bad_flag_in_one_line():
    assert refuses_in_one_line(ABLATION, "--rounds", "0")


@pytest.mark.gpu
def test_conv2_tile_ablation_times_every_variant(tmp_path):
    out = tmp_path / "ablation.json"
    r = run_program(ABLATION, "--batch-size", "64", "--rounds", "1", "--launches", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    times = json.loads(out.read_text())["us"]
    assert list(times) == list(load_script(ABLATION).VARIANTS)
    assert all(len(t) == 1 and t[0] > 0 for t in times.values())
