"""dev/step_timeline.py: the stamp it puts into every kernel (the timeline itself needs a GPU)."""

import os
import re
import subprocess
import sys

import pytest

import conftest
import mnist_cuda.ops  # noqa: F401  (its modules declare the sources)
from conftest import REPO
from mnist_cuda import cuda

SCRIPT = REPO / "dev" / "step_timeline.py"


def load_script():
    return conftest.load_script(SCRIPT)


def stamped_sources(st):
    header = st.STAMP % dict(ring=4, max_blocks=64, classes=st.SIZE_CLASSES, records=1 << 40, counts=1 << 41)
    ids = {}
    return {s.path: st.instrument(cuda.read_source(s.path), ids, header) for s in cuda.sources()}, ids


def test_every_kernel_gets_one_stamp_at_the_top_of_its_body():
    st = load_script()
    sources, ids = stamped_sources(st)
    for path, text in sources.items():
        names = cuda.entry_points(cuda.read_source(path))
        assert text.count("TimelineStamp timeline_stamp_(") == len(names), path
        for kernel in names:  # the stamp is the first statement after the parameter list
            m = re.search(rf"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?{kernel}\s*\(", text)
            head = text[m.end() :]
            assert head[head.index("{") + 1 :].startswith(f" TimelineStamp timeline_stamp_({ids[kernel]});"), kernel
    assert sorted(ids.values()) == list(range(len(ids)))


def test_stamps_go_into_what_compiles_and_come_out_again():
    """stamp_sources stamps the text every source compiles (cuda.transform_sources); turned off, each source
    compiles from read_source's text, the product's own, again."""
    st = load_script()
    try:
        st.stamp_sources("// stamped\n", {})
        for s in cuda.sources():
            text, kernels = s.text(), cuda.entry_points(cuda.read_source(s.path))
            assert text.startswith("// stamped\n") and text.count("timeline_stamp_(") == len(kernels), s.path
    finally:
        cuda.transform_sources(None)
    assert all(s.text() == cuda.read_source(s.path) for s in cuda.sources())


def test_stamped_kernels_compile():
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install '.[cuda12]')")
    sources, _ = stamped_sources(load_script())
    cuda.transform_sources(lambda path, text: sources[path])
    try:
        errors = {s.path: log for s in cuda.sources() if (log := s.compile_check("sm_90a")) is not None}
    finally:
        cuda.transform_sources(None)
    assert errors == {}, "\n".join(f"{k}:\n{v}" for k, v in errors.items())


def test_bad_batch_sizes_are_a_usage_error():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--batch-sizes", "64,x"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2 and "--batch-sizes" in r.stderr and "Traceback" not in r.stderr
