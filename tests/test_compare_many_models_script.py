"""scripts/compare_many_models.py: its --models refused in one line before any work (CPU), and a K that the
GPU's memory or the kernels' indexing cannot hold refused with the most that fit (GPU)."""

import types

import pytest

from conftest import REPO, load_script, run_program

SCRIPT = REPO / "scripts" / "compare_many_models.py"


def run_script(*args):
    return run_program(SCRIPT, *args, timeout=300)


@pytest.mark.parametrize(
    "value, words",
    [
        ("0", "expected positive whole numbers or max"),
        ("1,,8", "expected positive whole numbers or max"),
        ("eight", "expected positive whole numbers or max"),
        ("8,2000", "at most 1,024 models train at once"),
    ],
)
def test_bad_model_counts_are_one_line(value, words):
    done = run_script("--models", value)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr and "Traceback" not in done.stderr


def test_max_stands_beside_numbers():
    args = load_script(SCRIPT).build_parser().parse_args(["--models", "1, 8,max"])
    assert args.models == [1, 8, "max"]


class _FakeGPU:
    """cuda.require_gpu's CuPy as far as model_counts_or_exit reads it: a GPU of `free` bytes free."""

    def __init__(self, free):
        device = types.SimpleNamespace(mem_info=(free, free))
        self.cuda = types.SimpleNamespace(Device=lambda: device)


@pytest.fixture
def counts_with_free(monkeypatch):
    from mnist_cuda import cuda

    module = load_script(SCRIPT)
    monkeypatch.setattr(cuda, "sm_count", lambda: 132)

    def counts(models, batch, free):
        monkeypatch.setattr(cuda, "require_gpu", lambda: _FakeGPU(free))
        return module.model_counts_or_exit(module.build_parser(), models, batch)

    return counts


def test_max_is_the_most_that_fit_memory_and_indexing(counts_with_free):
    from mnist_cuda import sizes

    each = sizes.device_bytes((32, 64), 128, 64, "fast", 132, "fp32")
    assert counts_with_free([1, "max"], 64, 10**15) == [1, 668]  # the indexing: 668 x 64 images
    assert counts_with_free(["max", 8], 64, 100 * each + 1) == [100, 8]  # the memory
    assert counts_with_free([8, "max", 8], 64, 8 * each) == [8]  # each count measured once


@pytest.mark.parametrize(
    "models, batch, free, words",
    [
        (["max"], 64, 10, "--batch: not one model of batch 64 fits"),
        ([669], 64, 10**15, "at most 668 models at this batch step together"),
        ([100], 64, 10**9, "which holds at most"),
    ],
)
def test_counts_that_do_not_fit_are_one_line(counts_with_free, models, batch, free, words, capsys):
    with pytest.raises(SystemExit) as e:
        counts_with_free(models, batch, free)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and words in err


@pytest.mark.gpu
def test_a_count_past_the_kernels_indexing_is_refused_before_any_work():
    done = run_script("--models", "8,669", "--no-compile")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "at most 668 models at this batch step together" in done.stderr.strip().splitlines()[-1]
