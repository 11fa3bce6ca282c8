"""python -m mnist_cuda.kernel_cases [--family F]: list the kernel cases by op family; no GPU needed."""

import sys

from .common import FAMILIES
from .lists import OPS


def main(argv=None) -> int:
    from ..cli import Parser, prog_name

    p = Parser(
        prog=prog_name("mnist_cuda.kernel_cases"),
        description="List the kernel cases (every kernel against the float64 reference) by op family. "
        "tests/test_gpu_kernels.py runs them on a GPU; dev/bench_kernels.py times them.",
    )
    p.add_argument("--family", choices=FAMILIES, default=None, help="list this op family's cases only")
    args = p.parse_args(argv)
    for family, cases in OPS.items():
        if args.family in (None, family):
            print(f"{family}: " + ", ".join(c.name + (" (sm_90a)" if c.sm90a else "") for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
