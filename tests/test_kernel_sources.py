"""The kernel sources and their declarations, without a GPU: every declared source compiles with NVRTC
for the H100 (sm_90, and sm_90a) and an A100 (sm_80), so CI catches syntax errors; kernels/ and the ops
modules agree on files, kernels and compile-time constants; the launch's guard against untyped scalars;
and the ops modules hold every launch."""

import ast
import re

import numpy as np
import pytest

import mnist_cuda.ops  # noqa: F401  (its modules declare the sources)
from conftest import REPO
from mnist_cuda import cuda

NEEDS_CUPY = "CuPy is not installed (pip install '.[cuda12]')"
SOURCES = {s.path: s for s in cuda.sources()}
KERNEL_DIR = cuda.kernel_dir()


def compile_errors(arch: str) -> dict[str, str]:
    """Each source's NVRTC log where it fails, in its one-model form and, for the kernels a step of several
    models launches (fast/, both/), in their form for several (MODEL_INDEX: kernels/include/common.cuh)."""
    forms = list(SOURCES.items())
    forms += [(f"{p} (MODEL_INDEX)", s.models_variant()) for p, s in SOURCES.items() if not p.startswith("naive/")]
    return {path: log for path, s in forms if (log := s.compile_check(arch)) is not None}


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_80"])  # sm_90a: 2_conv2_implicit_gemm.cu's wgmma form
def test_every_source_compiles(arch):
    pytest.importorskip("cupy", reason=NEEDS_CUPY)
    errors = compile_errors(arch)
    assert errors == {}, "\n".join(f"{k}:\n{v}" for k, v in errors.items())


def test_compile_check_reports_errors(monkeypatch):
    pytest.importorskip("cupy", reason=NEEDS_CUPY)
    real = cuda.read_source
    monkeypatch.setattr(
        cuda, "read_source", lambda path: real(path) + ("\nint broken(" if path == "naive/8_sgd.cu" else "")
    )
    errors = compile_errors("sm_90")
    assert list(errors) == ["naive/8_sgd.cu"] and "error" in errors["naive/8_sgd.cu"]


def test_headers_are_inlined_once():
    src = cuda.read_source("naive/3_batchnorm.cu")
    assert '#include "common.cuh"' not in src and src.count("block_sum(float v)") == 1
    for path in SOURCES:  # also where several headers include the same one
        text = cuda.read_source(path)
        assert not re.search(r'^\s*#include\s+"', text, re.MULTILINE), path
        markers = re.findall(r"^// ---- (\S+) ----$", text, re.MULTILINE)
        assert len(markers) == len(set(markers)), (path, markers)


def test_every_source_file_is_declared_once():
    """Every .cu file under kernels/ is in naive/, fast/ or both/ and declared by exactly one ops Source."""
    on_disk = sorted(p.relative_to(KERNEL_DIR).as_posix() for p in KERNEL_DIR.rglob("*.cu"))
    declared = [s.path for s in cuda.sources()]
    assert sorted(declared) == on_disk
    assert all(p.split("/")[0] in ("naive", "fast", "both") and p.count("/") == 1 for p in on_disk), on_disk
    with pytest.raises(ValueError, match="declared twice"):
        cuda.Source(declared[0], {})


def test_a_source_from_a_file_is_not_declared(tmp_path):
    """cuda.Source.from_file: a file by its own path, its local headers inlined from kernels/include/, not among
    the product's sources (whose every file is under kernels/, declared once)."""
    path = tmp_path / "probe.cu"
    path.write_text('#include "common.cuh"\nextern "C" __global__ void probe(float* y) { y[0] = CEIL_DIV(3, 2); }\n')
    before = cuda.sources()
    source = cuda.Source.from_file(path, {"X": 1})
    again = cuda.Source.from_file(path)  # not declared: a second one is no clash
    assert cuda.sources() == before and source not in before and again is not source
    assert source.path == str(path.resolve()) and "-DX=1" in source.options()
    text = source.text()
    assert '#include "common.cuh"' not in text and "#define CEIL_DIV" in text
    assert cuda.entry_points(text) == ["probe"]


def _template_entry_points(text: str) -> set[str]:
    return set(
        re.findall(r"template\s*<[^>]*>\s*__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(", text)
    )


def test_every_entry_point_is_declared_and_every_declared_kernel_exists():
    """The kernels the ops modules declare are exactly each file's entry points: an extern "C" kernel by
    its name, a kernel template by its instantiations (at least one each)."""
    for path, s in SOURCES.items():
        text = cuda.read_source(path)
        entries, templates = cuda.entry_points(text), _template_entry_points(text)
        assert len(entries) == len(set(entries)) == text.count("__global__"), path  # the regex sees every kernel
        assert not any(n.startswith("__") for n in entries), entries
        declared = set(s.kernels)
        assert {k.split("<")[0] for k in declared} == set(entries), path
        for name in declared:
            base = name.split("<")[0]
            assert (base in templates) == ("<" in name), (path, name)  # templates only as instantiations
        assert set(s.name_expressions) == {k for k in declared if "<" in k}, path


def test_kernel_names_say_their_version():
    """kernels/naive/ and kernels/fast/ pair by name: every naive kernel is <op>_naive, every fast kernel
    <...>_fast. A kernel both versions launch (kernels/both/: the augmentation's shift, the optimizer's
    one-thread rate, the evaluation's accuracy count) is neither, alone in a file named after it."""
    for path in SOURCES:
        folder, names = path.split("/")[0], cuda.entry_points(cuda.read_source(path))
        if folder == "both":
            assert names == [path[len("both/") : -len(".cu")]], (path, names)
            assert not names[0].endswith(("_naive", "_fast")), (path, names)
        for name in names:
            assert folder == "both" or name.endswith(f"_{folder}"), (path, name)


def fast_forms() -> dict[str, set[str]]:
    """For each fast file, the naive files its header says it is the fast form of ("the fast form of
    naive/3_batchnorm.cu, 4_relu.cu and 5_maxpool.cu ..."), or none where it says "the fast form of no naive file"
    (every fast file's header says one or the other)."""
    out = {}
    for path in SOURCES:
        if not path.startswith("fast/"):
            continue
        header = []
        for line in cuda.read_source(path).splitlines():
            if not line.startswith("//"):
                break
            header.append(line[2:].strip())
        m = re.search(r"the fast form of (naive/.*?)[.:;](?:\s|$)", " ".join(header))
        assert m or "the fast form of no naive file" in " ".join(header), path
        out[path] = {f"naive/{name}.cu" for name in re.findall(r"(\w+)\.cu", m.group(1))} if m else set()
    return out


def test_fast_files_name_the_naive_files_they_replace():
    forms = fast_forms()
    naive_files = {p for p in SOURCES if p.startswith("naive/")}
    for path, replaced in forms.items():
        assert replaced <= naive_files, (path, replaced - naive_files)
    # 6_splitk_reduce.cu is the second half of the split-K products (4_linear_splitk.cu, conv2's weight gradient)
    assert {p for p, replaced in forms.items() if not replaced} == {"fast/6_splitk_reduce.cu"}
    # every naive op has a fast form (the kernels both versions launch are kernels/both/'s)
    assert set().union(*forms.values()) == naive_files


def case_kernels(case) -> list[str]:
    """The kernels a case's name lists, without conv2's precision: "a_fast<fp32>+b_fast[conv2]" -> a_fast, b_fast."""
    return [re.sub(r"<.*", "", k) for k in case.name.split("[")[0].split("+")]


def test_kernel_cases_name_declared_kernels():
    """Every kernel a case's name lists is one an ops module declares, template arguments and all (a name left at
    a kernel's old instantiation fails here, not only in the GPU test that compares it with the launches)."""
    from mnist_cuda import kernel_cases as kc

    declared = {name for s in SOURCES.values() for name in s.kernels}
    for case in kc.all_cases():
        assert kc.listed_kernels(case) <= declared, (case.name, kc.listed_kernels(case) - declared)


def test_kernel_cases_group_by_op_family():
    """mnist_cuda.kernel_cases' OPS: one family per naive file (its op) and one per kernels/both/ file (its
    kernel); every case listed; each family's cases without a fast kernel first; such a case under exactly
    the families of its kernels' files, a fast case only under those of its naive and both files and of the
    naive files its fast kernels' files say they replace."""
    from mnist_cuda import kernel_cases as kc

    def family(path: str) -> str:  # naive/3_batchnorm.cu -> batchnorm; both/count_correct.cu -> count_correct
        m = re.fullmatch(r"naive/\d_(\w+)\.cu|both/(\w+)\.cu", path)
        return m.group(1) or m.group(2)

    family_files = [p for p in SOURCES if not p.startswith("fast/")]
    assert list(kc.OPS) == list(kc.FAMILIES) and sorted(kc.FAMILIES) == sorted(family(p) for p in family_files)
    assert {c.name for cases in kc.OPS.values() for c in cases} == {c.name for c in kc.all_cases()}
    file_of = {k.split("<")[0]: path for path, s in SOURCES.items() for k in s.kernels}
    forms = fast_forms()
    no_fast = lambda case: not any(file_of[k].startswith("fast/") for k in case_kernels(case))
    for case in kc.all_cases():
        files = {file_of[k] for k in case_kernels(case)}
        allowed = {family(n) for f in files for n in (forms[f] if f.startswith("fast/") else {f})}
        assert case.ops and set(case.ops) <= allowed, (case.name, case.ops, allowed)
        assert len(set(case.ops)) == len(case.ops), case.name
        if no_fast(case):
            assert set(case.ops) == allowed, (case.name, case.ops, allowed)
    for name, cases in kc.OPS.items():
        kinds = [no_fast(c) for c in cases]
        assert kinds[0] and kinds == sorted(kinds, reverse=True), (name, [c.name for c in cases])


def test_every_required_macro_is_defined():
    """A source that needs a compile-time constant guards it (#if !defined(X) || ... #error); the ops
    module that declares the source must pass each such X as a -D option."""
    guarded = 0
    for path, s in SOURCES.items():
        text = cuda.read_source(path)  # the headers' guards too
        defined = {name.split("(")[0] for name in s.defines}  # "HEAD_SUMS(H)": a function-like macro
        for m in re.finditer(r"^#if\s+(!defined\(\w+\)(?:\s*\|\|\s*!defined\(\w+\))*)\s*\n#error", text, re.MULTILINE):
            required = set(re.findall(r"!defined\((\w+)\)", m.group(1)))
            assert required <= defined, (path, required - defined)
            guarded += 1
        assert len(re.findall(r"^#if\s+!defined", text, re.MULTILINE)) == text.count("#error"), path  # all parsed
    assert guarded >= 8, guarded  # the fast files and the headers they share guard their constants
    for path, s in SOURCES.items():
        assert f"-DMAX_PARTS={s.defines['MAX_PARTS']}" in s.options(), path  # the common defines reach every file


# ---- launches -------------------------------------------------------------------------------------


def unlaunchable_kernel():
    """A fresh Kernel of naive/8_sgd.cu whose compilation fails the test: the type check must come first."""
    kernel = cuda.Kernel(SOURCES["naive/8_sgd.cu"], "sgd_naive")

    def compiled():
        raise AssertionError("the argument check must run before the kernel is compiled or launched")

    kernel.function = compiled
    return kernel


def test_launch_rejects_python_scalars():
    kernel = unlaunchable_kernel()
    with pytest.raises(TypeError, match="np.int32"):
        kernel.launch(1, 32, 3)
    with pytest.raises(TypeError, match="argument 1 is float"):
        kernel.launch(1, 32, np.int32(1), 0.5)
    with pytest.raises(TypeError, match="argument 0 is ndarray"):  # host memory is no kernel argument
        kernel.launch(1, 32, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="argument 1 is int"):
        kernel.launch_1d(10, np.float32(1), 2)


def _python_files():
    """mnist_cuda/ outside ops/ and cuda.py, dev/ and scripts/; but dev/ladder.py and each ladder's op.py, which hold
    the launch contracts of dev/ladder/'s rungs (kernels outside kernels/, which no ops module declares) as ops/ does
    the product's."""
    for folder in ("mnist_cuda", "dev", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            ladder = rel == "dev/ladder.py" or (rel.startswith("dev/ladder/") and path.name == "op.py")
            if not (rel.startswith("mnist_cuda/ops/") or rel == "mnist_cuda/cuda.py" or ladder):
                yield rel, path


def kernel_launches(tree) -> list[tuple[int, str]]:
    """The calls in tree that make or launch kernels: Kernel(...), Source(...), .kernel(...),
    .launch_1d(...), and .launch(...) with a grid, a block and arguments (three or more, or *args; a CUDA
    graph's launch(stream) takes one, and a tool's own two-argument launch(name, fn) is none)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        if (
            name in ("Kernel", "Source", "launch_1d")
            or (name == "kernel" and isinstance(f, ast.Attribute))
            or (name == "launch" and isinstance(f, ast.Attribute) and (len(node.args) >= 3 or starred))
        ):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_kernel_launches_are_recognised():
    code = (
        "cuda.Kernel(src, 'k'); src.kernel('k'); k.launch_1d(n, a); k.launch(g, b, x); k.launch(g, *args); "
        "graph.launch(stream); self.launch(name, fn); kernel_cases.check(p)"
    )
    assert [text for _, text in kernel_launches(ast.parse(code))] == [
        "cuda.Kernel(src, 'k')",
        "src.kernel('k')",
        "k.launch_1d(n, a)",
        "k.launch(g, b, x)",
        "k.launch(g, *args)",
    ]


def test_only_the_ops_modules_launch_kernels():
    """Grids, blocks and scalar arguments live in mnist_cuda/ops alone: no other module of the package,
    and no dev/ or scripts/ program, makes a Kernel or launches one (they call the ops functions, and see
    launches through cuda.launch_hook)."""
    offenders = {rel: found for rel, path in _python_files() if (found := kernel_launches(ast.parse(path.read_text())))}
    assert offenders == {}


def test_conv2_forward_form_by_batch():
    """conv2's 3xTF32 forward stacks the weights' parts (32 output channels per block) up to
    STACKED_FORWARD_MAX_BATCH and keeps them apart (64 per block, 128 rows of A) above; tf32 and bf16 have
    one form; the stacked forward exists in fp32 only."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    limit = conv2.STACKED_FORWARD_MAX_BATCH
    assert conv2.forward_product(limit, "fp32") == "forward_stacked"
    assert conv2.forward_product(limit + 1, "fp32") == "forward"
    assert conv2.forward_product(1, "tf32") == conv2.forward_product(1, "bf16") == "forward"
    assert (conv2.tile_channels("forward", "fp32"), conv2.tile_channels("forward_stacked", "fp32")) == (64, 32)
    assert conv2.weight_quads(32, 64, "fp32", "forward") == conv2.weight_quads(32, 64, "fp32", "forward_stacked")
    assert conv2.weight_quads(32, 70, "fp32", "forward") == 2 * 4 * 2 * conv2.CONV_CHUNK_QUADS  # 2 tiles, 4 chunks
    same = {p: conv2.image_tile_shared_bytes(p, "fp32") for p in conv2.IMAGE_TILE_PRODUCTS}
    assert len(set(same.values())) == 1, same  # one weight buffer of twice the size in the apart form
    with pytest.raises(ValueError, match="3xTF32"):
        conv2.tile_channels("forward_stacked", "tf32")
    with pytest.raises(ValueError, match="unknown product"):
        conv2.tile_channels("backward_weight", "fp32")
    with pytest.raises(ValueError, match="unknown forward"):
        conv2.forward(None, None, None, 1, 32, 64, "fp32", "backward_input")


def test_conv2_persistent_forward_by_batch_precision_and_models():
    """The forward's persistent form is taken from PERSISTENT_FORWARD_MIN_BATCH images (PAIR_FORWARD_MIN_BATCH in fp32,
    where its block must hold every chunk's weights), for one model; never for the input gradient or for several models,
    where asking for it is refused in one line before any launch, as is a form by a name its precision lacks. In plain
    TF32 and bf16 its block needs the output's region of shared memory besides the tile's; in fp32 the warpgroup pair's
    holds the weights of all the input channels, and two image buffers and an output region per warpgroup."""
    import numpy as np

    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    for precision in conv2.PERSISTENT_PRECISIONS:
        limit = conv2.PAIR_FORWARD_MIN_BATCH if precision == "fp32" else conv2.PERSISTENT_FORWARD_MIN_BATCH
        assert conv2.persistent_tiles("forward", precision, limit)
        assert not conv2.persistent_tiles("forward", precision, limit - 1)
        assert not conv2.persistent_tiles("forward", precision, limit, models=2)
        assert not conv2.persistent_tiles("backward_input", precision, limit)
        if precision == "fp32":
            continue
        region = conv2.PERSISTENT_OUTPUT_BYTES  # the kernel's static_assert holds it to its 32 rows
        plain = conv2.image_tile_shared_bytes("forward", precision)
        assert conv2.image_tile_shared_bytes("forward", precision, persistent=True) == plain + region
        assert 3 * (plain + region + 1024) <= 227 * 1024 < 4 * (plain + region + 1024)  # three blocks per SM
    # the pair: four chunks of both parts of 64 channels' weights (36 KB each), and per warpgroup 18.3 KB of image
    # buffers and 15 KB of output region; 32 input channels fit sm_90's 227 KB, 40 do not
    assert conv2.pair_shared_bytes(32) == 4 * 36864 + 2 * (2 * 4 * 146 * 16 + 32 * 120 * 4) == 215552
    assert conv2.pair_shared_bytes(25) == conv2.pair_shared_bytes(32) > conv2.pair_shared_bytes(24)
    assert conv2.pair_fits(32) and not conv2.pair_fits(33) and not conv2.pair_fits(32, 200 * 1024)
    assert conv2.persistent_tiles("forward", "fp32", 4096)
    assert not conv2.persistent_tiles("forward", "fp32", 4096, c_in=40)
    # the grid: as many blocks as the SMs hold at once across the channel tiles, at most one per half image
    assert conv2.persistent_grid(4096, 1, 132, 3) == (396, 1, 1)
    assert conv2.persistent_grid(4096, 5, 132, 3) == (79, 5, 1)  # 395 blocks, not 400: no second wave
    assert conv2.persistent_grid(4096, 1, 108, 2) == (216, 1, 1)  # an SM whose shared memory holds two
    assert conv2.persistent_grid(4096, 1, 132, 7) == (396, 1, 1)  # the launch bounds' three at most
    assert conv2.persistent_grid(100, 1, 132, 3) == (200, 1, 1)
    assert conv2.persistent_grid(4096, 500, 132, 3) == (1, 500, 1)
    # the pair's: a block per SM across the channel tiles, at most one per two half images
    assert conv2.pair_grid(4096, 1, 132) == (132, 1, 1)
    assert conv2.pair_grid(4096, 3, 132) == (44, 3, 1)
    assert conv2.pair_grid(3, 1, 132) == (3, 1, 1)  # 6 tiles
    assert conv2.pair_grid(4096, 200, 132) == (1, 200, 1)
    quads = np.empty((conv2.weight_quads(32, 64, "fp32", "forward_stacked"), 4), np.float32)
    x, y = np.empty((1, 32, 14, 14), np.float32), np.empty((1, 64, 14, 14), np.float32)
    with pytest.raises(ValueError, match="only the forward has a persistent form"):
        conv2.forward(x, quads, y, 1, 32, 64, "fp32", "forward_stacked", persistent=True)
    quads = np.empty((2 * conv2.weight_quads(32, 64, "tf32", "forward"), 4), np.float32)
    with pytest.raises(ValueError, match="for one model"):
        conv2.forward(x, quads, y, 1, 32, 64, "tf32", models=2, persistent=True)
    for precision, form in (("tf32", "pair"), ("fp32", "pairs"), ("fp32", "")):  # a form by name: fp32's only
        quads = np.empty((conv2.weight_quads(32, 64, precision, "forward"), 4), np.float32)
        with pytest.raises(ValueError, match="names a form of the fp32 forward"):
            conv2.forward(x, quads, y, 1, 32, 64, precision, persistent=form)


def test_conv2_forward_moments_only_in_their_forms():
    """BN2's statistics come from the forward's moments in two forms only, for one model of MOMENTS_MIN_BATCH images
    or more: the persistent form's blocks (tf32, bf16) and, in fp32, a block per tile of its 64-channel form; asking
    for them from any other launch is refused before it. The persistent form's blocks, and so its (mean, M2) pairs
    per channel, are at most what stats_from_parts merges (a lane's BN_FROM_PARTS_PER_LANE,
    kernels/fast/3_bn_relu_pool.cu), and the merges refuse more parts, none, parts with no tile, or a scratch too
    small for the tiles."""
    import re

    import numpy as np

    from mnist_cuda.ops import bn_relu_pool
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    per_lane = re.search(r"#define BN_FROM_PARTS_PER_LANE (\d+)", SOURCES["fast/3_bn_relu_pool.cu"].text())
    assert conv2.MOMENT_PARTS_MAX == bn_relu_pool.FROM_PARTS_MAX == 32 * int(per_lane.group(1))
    assert conv2.moment_counts(4096) == (8192, 98) and conv2.moment_counts(1) == (2, 98)
    big = conv2.MOMENTS_MIN_BATCH
    assert [conv2.moment_source(big, p) for p in ("fp32", "tf32", "bf16")] == ["tiles", "blocks", "blocks"]
    assert {conv2.moment_source(big - 1, p) for p in ("fp32", "tf32", "bf16")} == {None}
    assert {conv2.moment_source(big, p, models=2) for p in ("fp32", "tf32", "bf16")} == {None}
    assert conv2.moment_parts_size(64, 4096, "blocks") == 64 * conv2.MOMENT_PARTS_MAX * 2
    assert conv2.moment_parts_size(64, 4096, "tiles") == 64 * 8192 * 2
    assert conv2.moment_parts_size(64, 4096, None) == 0
    with pytest.raises(ValueError, match="unknown moment form"):
        conv2.moment_parts_size(64, 4096, "images")
    x, y = np.empty((1, 32, 14, 14), np.float32), np.empty((1, 64, 14, 14), np.float32)
    parts = np.empty(conv2.moment_parts_size(64, 4096, "tiles"), np.float32)
    for precision, product, models in (("tf32", "forward", 1), ("fp32", "forward_stacked", 1), ("fp32", "forward", 2)):
        quads = np.empty((models * conv2.weight_quads(32, 64, precision, product), 4), np.float32)
        with pytest.raises(ValueError, match="moments come from"):
            conv2.forward(x, quads, y, 1, 32, 64, precision, product, models, persistent=False, moment_parts=parts)
    quads = np.empty((conv2.weight_quads(32, 64, "fp32", "forward"), 4), np.float32)
    few = np.empty(64 * 2 * 2 - 1, np.float32)  # one image's two tiles, but a float
    with pytest.raises(ValueError, match="2 pairs needed"):
        conv2.forward(x, quads, y, 1, 32, 64, "fp32", moment_parts=few)
    for bad_parts, tiles in ((0, 10), (bn_relu_pool.FROM_PARTS_MAX + 1, 8192), (11, 10)):
        with pytest.raises(ValueError, match="parts of"):
            bn_relu_pool.stats_from_parts(parts, bad_parts, tiles, 98, 64, 1e-5, 0.1, None, None, None, None)
    for tiles, values, partial in ((0, 98, parts), (2, 0, parts), (2, 98, few)):
        with pytest.raises(ValueError, match="tiles of|pairs needed"):
            bn_relu_pool.stats_from_tiles(partial, tiles, values, 64, 1e-5, 0.1, None, None, None, None)


def test_conv2_input_grad_form_by_batch():
    """conv2's 3xTF32 input gradient is stacked below PAIRED_INPUT_GRAD_MIN_BATCH and paired from it on (the same
    32 output channels per block and the same staged size, in another layout); tf32 and bf16 have one form; the
    paired form exists in fp32 only, and each launch names the form its weights were staged for."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    limit = conv2.PAIRED_INPUT_GRAD_MIN_BATCH
    assert conv2.input_grad_product(limit - 1, "fp32") == "backward_input"
    assert conv2.input_grad_product(limit, "fp32") == "backward_input_paired"
    assert (
        conv2.input_grad_product(10 * limit, "tf32") == conv2.input_grad_product(10 * limit, "bf16") == "backward_input"
    )
    assert conv2.tile_channels("backward_input_paired", "fp32") == conv2.tile_channels("backward_input", "fp32") == 32
    assert conv2.weight_quads(64, 32, "fp32", "backward_input") == conv2.weight_quads(
        64, 32, "fp32", "backward_input_paired"
    )
    with pytest.raises(ValueError, match="3xTF32"):
        conv2.tile_channels("backward_input_paired", "bf16")
    with pytest.raises(ValueError, match="unknown input gradient"):
        conv2.backward_input(None, None, None, 1, 32, 64, "fp32", "forward")
    with pytest.raises(ValueError, match="unknown input gradient"):
        conv2.stage_weights(None, 32, 64, None, None, "fp32", "forward", "backward_weight")


def test_conv1_backward_channels_by_batch(monkeypatch):
    """conv1's backward takes all 32 channels per block once the batch has 8 images per SM, fewer below; with the
    model's 32 channels the parts of the batch, and so each channel's sums, are the same whatever the choice."""
    from mnist_cuda.ops import conv1_bn_relu_pool as conv1

    monkeypatch.setattr(conv1, "sm_count", lambda: 132)
    choice = {n: conv1.backward_channels_per_block(n, 32) for n in (1, 64, 132, 512, 1024, 1055, 1056, 4096)}
    assert choice == {1: 8, 64: 8, 132: 8, 512: 8, 1024: 8, 1055: 8, 1056: 32, 4096: 32}
    assert conv1.backward_channels_per_block(528, 33) == 32 and conv1.backward_channels_per_block(527, 33) == 8
    for n in (1, 7, 64, 65, 131, 132, 133, 512, 1000, 4096):
        grids = {p: conv1.backward_grid(n, 32, p) for p in conv1.BACKWARD_CHANNELS}
        assert {(grid[0], per_part) for grid, per_part in grids.values()} == {grids[32][0][:1] + (grids[32][1],)}
        assert {p: grid[1] for p, (grid, _) in grids.items()} == {8: 4, 32: 1}
        parts = grids[32][0][0]
        assert parts <= conv1.backward_max_parts() and parts * grids[32][1] >= n > (parts - 1) * grids[32][1]


def test_fc1_input_grad_form_by_batch(monkeypatch):
    """fc1's input gradient takes the wgmma form in bf16 from WG_MIN_BATCH on, and only where the kernels are
    compiled for sm_90a."""
    from mnist_cuda.ops import linear_splitk as fc1

    monkeypatch.setattr(fc1.cuda, "arch_specific", lambda: True)
    assert fc1._form(None, "bf16", fc1.WG_MIN_BATCH) == "wgmma"
    assert fc1._form(None, "bf16", fc1.WG_MIN_BATCH - 1) == "tiled"
    assert fc1._form(None, "fp32", 4096) == "tiled"
    assert fc1._form("wgmma", "fp32", 64) == "wgmma"  # forced
    monkeypatch.setattr(fc1.cuda, "arch_specific", lambda: False)
    assert fc1._form(None, "bf16", 4096) == "tiled"
    with pytest.raises(ValueError, match="sm_90a"):
        fc1._form("wgmma", "bf16", 4096)


def _staged_weight_quad(w, q, flipped, tile, quads_per_chunk, paired):
    """2_conv2_implicit_gemm.cu's stage_weight_quad<FLIPPED, Precision::Fp32, F> for quad q, in Python."""
    from mnist_cuda.kernel_cases.conv2d import split_tf32

    c_out, c_in = (w.shape[1], w.shape[0]) if flipped else w.shape[:2]
    chunks, group_taps = -(-c_in // 8), 3 if paired else 1
    rows = quads_per_chunk // (2 * 9 // group_taps)
    row, quad, group = q % rows, q // rows % 2, q // (2 * rows) % (9 // group_taps)
    chunk, n = q // quads_per_chunk % chunks, q // (quads_per_chunk * chunks) * tile + row % tile
    run = row // tile
    tap = 3 * group + (0 if run < 2 else 1 if run < 4 else 2) if paired else group
    small_part = run in (0, 3, 5) if paired else row >= tile
    v = np.zeros(4, np.float32)
    for i in range(4):
        c = chunk * 8 + quad * 4 + i
        if c < c_in and n < c_out:
            v[i] = w[c, n, 2 - tap // 3, 2 - tap % 3] if flipped else w[n, c, tap // 3, tap % 3]
    big, small = split_tf32(v)
    return small if small_part else big


def test_bn2_forms_by_op_batch_size_and_type():
    """The staged forward and apply from STAGED_MIN_BATCH images of their op and type, only for sizes they take (even,
    at most STAGED_WINDOWS windows); asked for a size they cannot take, or a form that does not exist, a one-line
    error."""
    from mnist_cuda.ops import bn_relu_pool as bn
    from mnist_cuda.ops.common import BF16

    f32 = np.float32
    assert bn.STAGED_MIN_BATCH == {
        "forward": {"float": 512, "bfloat16": 256},
        "backward_apply": {"float": 2048, "bfloat16": 256},
    }
    apply = [bn.form_of("backward_apply", n, 14, f32) for n in (64, 1024, 2047, 2048, 4096)]
    assert apply == ["windows"] * 3 + ["staged"] * 2
    assert [bn.form_of("forward", n, 14, f32) for n in (64, 511, 512, 4096)] == ["windows"] * 2 + ["staged"] * 2
    for op in bn.STAGED_OPS:
        assert [bn.form_of(op, n, 14, BF16) for n in (64, 255, 256, 4096)] == ["windows"] * 2 + ["staged"] * 2
        assert bn.form_of(op, 4096, 28, f32) == bn.form_of(op, 4096, 13, BF16) == "windows"  # 196 windows; odd
        assert bn.form_of(op, 4096, 16, f32) == "staged"  # 64 windows, the most
    a, pooled = np.empty((1, 8, 13, 13), f32), np.empty((1, 8, 6, 6), f32)
    staged = "the staged form takes an even size of at most 64 windows; got 13"
    unknown = "unknown form 'rows'; choose from \\('windows', 'staged'\\)"
    with pytest.raises(ValueError, match=staged):
        bn.backward_apply(a, *[None] * 5, pooled, None, 1, 8, 13, a, form="staged")
    with pytest.raises(ValueError, match=unknown):
        bn.backward_apply(a, *[None] * 5, pooled, None, 1, 8, 14, a, form="rows")
    with pytest.raises(ValueError, match=staged):
        bn.forward(a, *[None] * 4, 1, 8, 13, pooled, None, pooled, form="staged")
    with pytest.raises(ValueError, match=unknown):
        bn.forward(a, *[None] * 4, 1, 8, 14, pooled, None, pooled, form="rows")


def test_conv2_weight_mirror_is_the_kernels_arithmetic():
    """mnist_cuda.kernel_cases.weight_quads, the mirror the GPU tests compare conv2_stage_weights_fast with, holds
    what the kernel's index arithmetic (ported above) writes, in every 3xTF32 form, over partial tiles and
    chunks: apart (the big parts of 64 output channels, then their small parts), stacked (32 and 32), paired
    (32 channels, a kernel row's three taps in six runs of 32 rows)."""
    from mnist_cuda import kernel_cases as kc
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    w = np.random.default_rng(0).standard_normal((70, 12, 3, 3)).astype(np.float32)  # K 70, C 12
    for product in ("forward", "forward_stacked", "backward_input", "backward_input_paired"):
        flipped = product.startswith("backward_input")
        c_in, c_out = (70, 12) if flipped else (12, 70)
        tile, per_chunk = conv2.tile_channels(product, "fp32"), conv2.chunk_quads(product, "fp32")
        want = np.array(
            [
                _staged_weight_quad(w, q, flipped, tile, per_chunk, product == "backward_input_paired")
                for q in range(conv2.weight_quads(c_in, c_out, "fp32", product))
            ]
        )
        got = kc.weight_quads(w, product, "fp32")
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), product


def test_conv2_input_output_and_gradients_are_stored_as_bf16_in_bf16():
    """In bf16 conv2's input (x of the forward and the weight gradient), its output (the forward's y), y's gradient
    (both gradients' dy) and x's gradient (the input gradient's dx, conv1's backward's d_pooled) are bf16 bits, as
    autocast stores them, float32 in the other precisions; a buffer of the other type is refused before any launch,
    block 2's BatchNorm kernels take a and d_a of one type, and conv1's backward a d_pooled of either."""
    from mnist_cuda.ops import bn_relu_pool
    from mnist_cuda.ops import conv1_bn_relu_pool as conv1
    from mnist_cuda.ops import conv2_implicit_gemm as conv2
    from mnist_cuda.ops.common import BF16

    assert conv2.stored_dtype("bf16") == np.dtype(BF16)
    assert conv2.stored_dtype("fp32") == conv2.stored_dtype("tf32") == np.dtype(np.float32)
    forward_quads = np.empty((conv2.weight_quads(32, 64, "bf16", "forward"), 4), np.float32)
    grad_quads = np.empty((conv2.weight_quads(64, 32, "fp32", "backward_input"), 4), np.float32)
    x16, x32 = np.empty((1, 32, 14, 14), BF16), np.empty((1, 32, 14, 14), np.float32)
    with pytest.raises(ValueError, match="y is float32; conv2 stores it as uint16 in bf16"):
        conv2.forward(x16, forward_quads, np.empty((1, 64, 14, 14), np.float32), 1, 32, 64, "bf16")
    with pytest.raises(ValueError, match="x is float32; conv2 stores it as uint16 in bf16"):
        conv2.forward(x32, forward_quads, np.empty((1, 64, 14, 14), BF16), 1, 32, 64, "bf16")
    with pytest.raises(ValueError, match="dy is uint16; conv2 stores it as float32 in fp32"):
        conv2.backward_input(np.empty((1, 64, 14, 14), BF16), grad_quads, None, 1, 32, 64, "fp32")
    bf16_grad_quads = np.empty((conv2.weight_quads(64, 32, "bf16", "backward_input"), 4), np.float32)
    with pytest.raises(ValueError, match="dx is float32; conv2 stores it as uint16 in bf16"):
        conv2.backward_input(np.empty((1, 64, 14, 14), BF16), bf16_grad_quads, x32, 1, 32, 64, "bf16")
    with pytest.raises(ValueError, match="dx is uint16; conv2 stores it as float32 in fp32"):
        conv2.backward_input(np.empty((1, 64, 14, 14), np.float32), grad_quads, x16, 1, 32, 64, "fp32")
    with pytest.raises(ValueError, match="d_pooled must be float32, or bf16 \\(uint16\\) alike; got float64"):
        conv1.backward(*[None] * 6, np.empty(4, np.float64), None, 1, 32, *[None] * 5)
    with pytest.raises(ValueError, match="dy is float32; conv2 stores it as uint16 in bf16"):
        conv2.backward_weight(x16, np.empty((1, 64, 14, 14), np.float32), None, 1, 32, 64, "bf16")
    with pytest.raises(ValueError, match="x is uint16; conv2 stores it as float32 in fp32"):
        conv2.backward_weight(x16, np.empty((1, 64, 14, 14), np.float32), None, 1, 32, 64, "fp32")
    with pytest.raises(ValueError, match="without the L2 prefetch is built in fp32 from x and dy as they are"):
        conv2.backward_weight(x32, x32, None, 1, 32, 32, "fp32", l2_prefetch=False, from_layout=True)
    with pytest.raises(ValueError, match="x holds 6272 values; the layout of 1 x 1 images needs 50176"):
        conv2.backward_weight(x16, np.empty(2 * 50176, BF16), None, 1, 32, 64, "bf16", from_layout=True)
    with pytest.raises(ValueError, match="dst holds 10 values; 1 x 50176 needed"):
        conv2.to_weight_grad_layout(x16, np.empty(10, BF16), 1, 32, "bf16")
    with pytest.raises(ValueError, match="dst is float32; conv2 stores it as uint16 in bf16"):
        conv2.to_weight_grad_layout(x16, np.empty(50176, np.float32), 1, 32, "bf16")
    a, d_a = np.empty((1, 8, 14, 14), BF16), np.empty((1, 8, 14, 14), np.float32)
    d_pooled16 = np.empty((1, 8, 7, 7), BF16)
    with pytest.raises(
        ValueError, match="a, d_pooled and d_a must be float32, or bf16 \\(uint16\\) alike; got uint16, uint16, float32"
    ):
        bn_relu_pool.backward_apply(a, *[None] * 5, d_pooled16, None, 1, 8, 14, d_a)
    at32 = np.empty((1, 8, 7, 7), np.float32)
    with pytest.raises(
        ValueError, match="d_pooled and a_at must be float32, or bf16 \\(uint16\\) alike; got float64, float32"
    ):
        bn_relu_pool.backward_reduce(at32, None, None, np.empty(4, np.float64), None, 1, 8, 14, *[None] * 4)
    with pytest.raises(
        ValueError, match="d_pooled and a_at must be float32, or bf16 \\(uint16\\) alike; got uint16, float32"
    ):  # a_at as the fp32 step stores it, beside bf16's pooled gradient
        bn_relu_pool.backward_reduce(at32, None, None, d_pooled16, None, 1, 8, 14, *[None] * 4)
    with pytest.raises(ValueError, match="a must be float32, or bf16"):
        bn_relu_pool.stats(np.empty(4, np.float64), 1, 8, 196, *[None] * 4, 0.1, 0.1, *[None] * 4)
    pooled32 = np.empty((1, 8, 7, 7), np.float32)
    with pytest.raises(
        ValueError, match="a, pooled and a_at must be float32, or bf16 \\(uint16\\) alike; got uint16, float32, uint16"
    ):
        bn_relu_pool.forward(a, *[None] * 4, 1, 8, 14, pooled32, None, d_pooled16)
    with pytest.raises(
        ValueError, match="a, pooled and a_at must be float32, or bf16 \\(uint16\\) alike; got uint16, uint16, float32"
    ):
        bn_relu_pool.forward(a, *[None] * 4, 1, 8, 14, d_pooled16, None, at32)


def test_fc1_input_and_its_gradient_are_stored_as_bf16_in_bf16():
    """fc1's input (block 2's pooled output) and its gradient are bf16 bits in bf16, as autocast keeps them, float32
    in the other precisions (fc1 runs in 3xTF32 under tf32 too); the forward and the weight gradient refuse an x of
    the other type, the input gradient a dx, before any launch."""
    from mnist_cuda.ops import linear_splitk as fc1
    from mnist_cuda.ops.common import BF16

    assert fc1.input_dtype("bf16") == np.dtype(BF16)
    assert fc1.input_dtype("fp32") == fc1.input_dtype("tf32") == np.dtype(np.float32)
    x16, x32 = np.empty((2, 3136), BF16), np.empty((2, 3136), np.float32)
    with pytest.raises(ValueError, match="x is float32; fc1 stores it as uint16 in bf16"):
        fc1.forward(x32, None, None, None, None, 2, 3136, 128, "bf16")
    with pytest.raises(ValueError, match="x is uint16; fc1 stores it as float32 in tf32"):
        fc1.backward_weight(x16, None, None, None, 2, 3136, 128, "tf32")
    with pytest.raises(ValueError, match="dx is float32; fc1 stores it as uint16 in bf16"):
        fc1.backward_input(None, None, x32, 2, 3136, 128, precision="bf16")
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        fc1.input_dtype("fp16")


def test_bf16_rounding_on_the_host():
    """kernel_cases' bf16 helpers, the host mirror of the kernels' cvt.rn: to the nearest, ties to even; exact back."""
    from mnist_cuda.kernel_cases import bf16_values, round_bf16, round_bf16_bits

    below, tie_even, tie_odd = np.array([0x3F80_7FFF, 0x3F80_8000, 0x3F81_8000], np.uint32).view(np.float32)
    assert list(round_bf16_bits(np.array([below, tie_even, tie_odd]))) == [0x3F80, 0x3F80, 0x3F82]
    v = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    r = round_bf16(v)
    assert np.array_equal(round_bf16(r), r) and np.all(np.abs(r - v) <= np.abs(v) * 2.0**-8)
    bits = np.arange(0, 0x7F80, 7, dtype=np.uint16)  # finite positive bf16 values, every seventh
    assert np.array_equal(round_bf16_bits(bf16_values(bits)), bits)


def test_conv2_staged_weights_must_fit_their_form():
    """A staged weight buffer of the wrong size is refused before any launch (the kernels would write or read
    past it)."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    stacked = np.empty((conv2.weight_quads(32, 70, "fp32", "forward_stacked"), 4), np.float32)
    grads = np.empty((conv2.weight_quads(70, 32, "fp32", "backward_input"), 4), np.float32)
    assert stacked.shape[0] < conv2.weight_quads(32, 70, "fp32", "forward")
    with pytest.raises(ValueError, match=r"forward's staged weights are \(13824, 4\)"):
        conv2.stage_weights(None, 32, 70, stacked, grads, "fp32", "forward")
    with pytest.raises(ValueError, match="backward_input's staged weights"):
        conv2.stage_weights(None, 32, 70, stacked, grads[:-1], "fp32", "forward_stacked")
    with pytest.raises(ValueError, match="forward's staged weights"):
        conv2.forward(None, stacked, None, 1, 32, 70, "fp32", "forward")
    with pytest.raises(ValueError, match="unknown precision"):
        conv2.tile_channels("forward_stacked", "fp64")


# ---- what a run compiles ---------------------------------------------------------------------------------


def test_a_net_compiles_only_the_sources_it_launches_from():
    """A step of a net compiles its own folder's sources and kernels/both/ (the augmentation's shift, the
    optimizer's schedule, the accuracy count), not the other net's; the fast net, the step runner and the
    optimizer call no naive function, and every function of ops.both they call launches from kernels/both/."""
    import inspect

    from mnist_cuda import nets, optim, step
    from mnist_cuda.ops import both

    in_folder = lambda folder: {p for p in SOURCES if p.startswith(f"{folder}/")}
    both_files = {"both/shift_images.cu", "both/sgd_schedule.cu", "both/count_correct.cu"}
    assert {s.path for s in both.SOURCES} == in_folder("both") == both_files
    assert {s.path for s in nets.kernel_sources("fast")} == in_folder("fast") | in_folder("both")
    assert {s.path for s in nets.kernel_sources("naive")} == in_folder("naive") | in_folder("both")
    assert {s.path for s in nets.kernel_sources(None)} == set(SOURCES)
    callers = "".join(inspect.getsource(c) for c in (nets.base._Net, nets.FastNet, step.Step, optim.Optimizer))
    assert re.findall(r"\bnaive\.(\w+)\(", callers) == []
    called = set(re.findall(r"\bboth\.(\w+)\(", callers))
    assert called == {"count_correct", "sgd_schedule", "shift_images"}
    for function in called:
        kernels = re.findall(r'_k\["(\w+)"\]', inspect.getsource(getattr(both, function)))
        assert kernels == [function] and both._k[function].source.path == f"both/{function}.cu", (function, kernels)


class _SlowKernel:
    def __init__(self, seconds):
        self.seconds, self._fn = seconds, None

    def function(self):
        import time

        time.sleep(self.seconds)  # as NVRTC's compile, it lets the other threads run
        self._fn = object()


class _Source:
    def __init__(self, seconds, kernels=2):
        self.kernels = {f"k{i}": _SlowKernel(seconds) for i in range(kernels)}

    def loaded(self):
        return all(k._fn is not None for k in self.kernels.values())


def _fake_cupy():
    import contextlib
    import types

    device = types.SimpleNamespace(id=0, compute_capability="90")
    runtime = types.SimpleNamespace(free=lambda pointer: None)
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda *a: contextlib.nullcontext() if a else device, runtime=runtime)
    )


def test_preload_compiles_side_by_side_and_says_so_when_it_takes_a_while(monkeypatch, capsys):
    import time

    monkeypatch.setattr(cuda, "require_gpu", _fake_cupy)
    monkeypatch.setattr(cuda, "COMPILE_NOTICE_SECONDS", 0.2)
    slow = [_Source(0.3, kernels=1) for _ in range(4)]
    start = time.perf_counter()
    cuda.preload(slow)
    seconds = time.perf_counter() - start
    assert all(s.loaded() for s in slow) and seconds < 4 * 0.3 - 0.1, seconds  # not one after another
    err = capsys.readouterr().err
    assert err == "compiling 4 CUDA kernels (4 sources) for sm_90a (first run only; cached after)\n", err
    cuda.preload([_Source(0.0) for _ in range(3)] + slow)  # from the cache: quick, and nothing said
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("cpus,sources,workers", [(1, 4, 1), (None, 4, 1), (16, 3, 3), (16, 1, 1), (2, 5, 2)])
def test_preload_takes_a_thread_per_source_up_to_the_cpus(monkeypatch, cpus, sources, workers):
    import concurrent.futures

    monkeypatch.setattr(cuda, "require_gpu", _fake_cupy)
    monkeypatch.setattr(cuda.os, "cpu_count", lambda: cpus)
    made = []

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers):
            made.append(max_workers)
            super().__init__(max_workers)

    monkeypatch.setattr(cuda.concurrent.futures, "ThreadPoolExecutor", Pool)
    todo = [_Source(0.0, kernels=1) for _ in range(sources)]
    cuda.preload(todo)
    assert made == [workers] and all(s.loaded() for s in todo)


def test_a_local_include_is_inlined_with_a_comment_after_it():
    """A trailing comment on an #include "..." line does not hide it from read_source's inlining (NVRTC, which
    gets the lines left over, cannot find the project's headers)."""
    for line in ('#include "common.cuh"', '  #include "common.cuh"  // why', '#include "common.cuh" /* why */'):
        assert cuda._INCLUDE.fullmatch(line).group(1) == "common.cuh", line
    assert cuda._INCLUDE.search("#include <cuda_bf16.h>") is None
    assert "kept" not in cuda._INCLUDE.search('#include "common.cuh"\n\n// kept\n').group(0)  # the next line


def test_weight_grad_from_its_layout_by_precision_and_images():
    """The step hands the weight gradient x and dy in its layout in bf16 from WGRAD_LAYOUT_MIN_BATCH images (a
    model's batch), never in float32's layouts; the layout holds whole groups of images."""
    from mnist_cuda.ops import conv2_implicit_gemm as conv2

    least = conv2.WGRAD_LAYOUT_MIN_BATCH
    assert conv2.weight_grad_from_layout(least, "bf16") and not conv2.weight_grad_from_layout(least - 1, "bf16")
    assert not any(conv2.weight_grad_from_layout(1 << 20, p) for p in ("fp32", "tf32"))
    assert conv2.weight_grad_layout_size(100, 32, "bf16") == 13 * 196 * 32 * 8
    assert conv2.weight_grad_layout_size(100, 64, "fp32") == 25 * 196 * 64 * 4
