#!/usr/bin/env python3
"""Our CUDA kernels against PyTorch: the command. The parts live in mnist_cuda/compare/ (main: the
arguments and the run; candidates, torch_side, ours, measure, timing, parity, recipes, report, plot).

    python scripts/compare_pytorch.py --help
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, installed or not
from mnist_cuda.compare.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
