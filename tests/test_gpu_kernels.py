"""Every kernel against the float64 reference on fresh random inputs (GPU; skipped without one)."""
import pytest

from mnist_cuda import kernel_checks as kc

pytestmark = pytest.mark.gpu

# batch sizes 1, 3, 64, 65; the default channels and hidden size, and odd ones that fit no tile
DIMS = [kc.Dims(1, 32, 64, 128), kc.Dims(3, 5, 7, 33), kc.Dims(64, 32, 64, 128), kc.Dims(65, 5, 7, 33),
        kc.Dims(65, 32, 64, 128)]
FP32_TOL = 1e-4


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("case", kc.all_cases(), ids=lambda c: c.name)
def test_kernel_matches_reference(case, dims):
    import numpy as np
    prepared = case.make(np.random.default_rng(), dims)  # fresh inputs every run
    errors = kc.check(prepared)
    bad = {k: v for k, v in errors.items() if not v < FP32_TOL}
    assert not bad, f"{case.name} at {dims}: relative errors {errors}"
