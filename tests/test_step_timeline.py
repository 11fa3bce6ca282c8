"""scripts/step_timeline.py: the stamp it puts into every kernel (the timeline itself needs a GPU)."""
import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO
from mnist_cuda import kernels

SCRIPT = REPO / "scripts" / "step_timeline.py"


def load_script():
    spec = importlib.util.spec_from_file_location("step_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stamped_sources(st):
    header = st.STAMP % dict(ring=4, max_blocks=64, classes=st.SIZE_CLASSES, records=1 << 40, counts=1 << 41)
    ids = {}
    return {name: st.instrument(kernels.read_source(name), ids, header) for name in kernels.SOURCE_FILES}, ids


def test_every_kernel_gets_one_stamp_at_the_top_of_its_body():
    st = load_script()
    sources, ids = stamped_sources(st)
    for name, text in sources.items():
        names = kernels.kernel_names(kernels.read_source(name))
        assert text.count("TimelineStamp timeline_stamp_(") == len(names), name
        for kernel in names:  # the stamp is the first statement after the parameter list
            head = text[text.index(f"{kernel}("):]
            assert head[head.index("{") + 1:].startswith(f" TimelineStamp timeline_stamp_({ids[kernel]});"), kernel
    assert sorted(ids.values()) == list(range(len(ids)))


def test_stamped_kernels_compile(monkeypatch):
    pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'mnist-cuda[cuda12]')")
    sources, _ = stamped_sources(load_script())
    monkeypatch.setattr(kernels, "read_source", lambda name: sources[name])
    assert kernels.compile_check("sm_90a") == {}


def test_bad_batch_sizes_are_a_usage_error():
    r = subprocess.run([sys.executable, str(SCRIPT), "--batch-sizes", "64,x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--batch-sizes" in r.stderr and "Traceback" not in r.stderr
