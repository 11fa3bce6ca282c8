"""scripts/compare_many_models.py: its --models refused in one line before any work (CPU), and a K that the
GPU's memory or the kernels' indexing cannot hold refused with the most that fit (GPU)."""

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


@pytest.mark.gpu
def test_a_count_past_the_kernels_indexing_names_the_most_that_fit():
    from mnist_cuda import cuda, sizes

    most = sizes.most_stacked_models((32, 64), 128, 64, cuda.sm_count(), 1024)
    done = run_script("--models", f"8,{most + 1}", "--no-compile")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"at most {most} models at this batch step together" in done.stderr.strip().splitlines()[-1]


@pytest.mark.gpu
def test_max_is_the_most_that_fit():
    module = load_script(SCRIPT)
    from mnist_cuda import cuda, sizes

    parser = module.build_parser()
    most = module.model_counts_or_exit(parser, ["max"], 64)[0]
    assert most == min(1024, sizes.most_stacked_models((32, 64), 128, 64, cuda.sm_count(), 1024))
    assert module.model_counts_or_exit(parser, [1, "max"], 512) == [
        1,
        sizes.most_stacked_models((32, 64), 128, 512, cuda.sm_count(), 1024),
    ]
