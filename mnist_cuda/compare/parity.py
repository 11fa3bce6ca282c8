"""The parity run: both sides train from identical weights on identical batches at the same learning rate,
and every loss must agree within a tolerance set from how far two float32 runs of this network part.

Why a parity learning rate of its own: at the training rate (0.05) this network's trajectory is chaotic in
fp32. A near-tie in a pooling window or a ReLU input near zero rounds differently, the gradient takes another
path, and the difference compounds: PyTorch in fp32 and in fp64 part ways within tens of steps at the
training rate, and stay together at the parity rate (docs/performance.md). Identical computation is what
parity tests, so it runs where rounding cannot snowball.
"""

from __future__ import annotations

import numpy as np

from .. import data, optim
from .candidates import EAGER
from .measure import batches
from .ours import OurSide
from .torch_side import TorchSide

PARITY_TOL = {"first_50": 1e-4, "all": 1e-3}
# With TF32 convolutions the losses move from step to step at TF32's rounding (2^-11 per operand), for
# PyTorch's own TF32 against its fp32 as much as for ours against either: noise, not a trend. PASS allows
# about four times the largest such difference seen.
PARITY_TOL_TF32 = {"first_50": 3e-3, "all": 3e-3}
# With bf16 products (8-bit mantissas) the same rule from PyTorch's own autocast(bfloat16) run against its
# fp32 run on the same batches (dev/bf16_distance.py): up to 2.2e-3 over the first 50 steps and 3.1e-3
# over 200, so PASS allows about four times those.
PARITY_TOL_BF16 = {"first_50": 1e-2, "all": 1.25e-2}
PARITY_TOLERANCES = {"fp32": PARITY_TOL, "tf32": PARITY_TOL_TF32, "bf16": PARITY_TOL_BF16}


def parity_options(args) -> optim.SGDOptions:
    """The optimizer of the parity run: plain SGD at --parity-lr, or the options given, the schedule over
    the parity run's steps. With momentum m the rate is --parity-lr * (1 - m): the steps then have the size
    lr / (1 - m) of plain SGD's at --parity-lr, the size at which the tolerances were set (how fast two
    float32 runs of this network part grows with the size of its steps)."""
    momentum = args.momentum or 0.0
    return optim.options_from(vars(args), args.parity_lr * (1 - momentum), args.parity_steps)


def run_parity(torch, ds, state, args, channels, hidden) -> dict:
    """Train both sides from identical weights on identical batches: fp32 on both, with --precision tf32 TF32
    convolutions on both, with bf16 our bf16 products against PyTorch under autocast (the precision each
    side's timed runs use)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    batch = args.batch_sizes[0]
    options = parity_options(args)
    ours = OurSide(state, batch, options, args.kernels, channels, hidden, args.precision)
    theirs = TorchSide(
        torch, state, batch, EAGER, channels, hidden, options, log_losses=True, bf16=args.precision == "bf16"
    )
    order = data.epoch_order(len(ds.train_x), args.seed, 0)
    idxs = batches(order, batch, args.parity_steps)
    ours.losses()
    for idx in idxs:
        ours.step(ds.train_x, ds.train_y, idx, "eager")
        theirs.step(ds.train_x, ds.train_y64, idx)
    ours.synchronize()
    lo, lt = ours.losses().astype(np.float64), theirs.losses().astype(np.float64)
    diff = np.abs(lo - lt)
    so, st = ours.state_dict(), theirs.state_dict()
    rel = {
        k: float(
            np.linalg.norm(so[k].astype(np.float64) - st[k]) / max(np.linalg.norm(st[k].astype(np.float64)), 1e-30)
        )
        for k in so
        if not k.endswith("num_batches_tracked")
    }
    first = float(diff[:50].max())
    tol = PARITY_TOLERANCES[args.precision]
    result = {
        "steps": args.parity_steps,
        "batch_size": batch,
        "lr": options.lr,
        "precision": args.precision,
        "optimizer": optim.describe(options),
        "max_loss_diff_first_50": first,
        "max_loss_diff": float(diff.max()),
        "max_state_rel_diff": max(rel.values()),
        "state_rel_diff": rel,
        "tolerances": tol,
        "losses_ours": lo.tolist(),
        "losses_torch": lt.tolist(),
        "num_batches_tracked": [int(so["bn1.num_batches_tracked"]), int(st["bn1.num_batches_tracked"])],
    }
    result["pass"] = bool(
        first <= tol["first_50"] and result["max_loss_diff"] <= tol["all"] and np.all(np.isfinite(diff))
    )
    return result
