#!/usr/bin/env python3
"""How far PyTorch's own bf16 mixed precision moves its losses from its fp32 run: the yardstick for a bf16
mode's parity tolerances.

For each seed, PyTorch trains the model from our initial weights (reference.init_state_dict) on the
same batches three ways: float64, float32 (TF32 off), and float32 weights under
torch.autocast("cuda", dtype=torch.bfloat16), as a bf16 mode would compute (products and activations in
bf16, accumulation, BatchNorm's statistics and the loss in fp32). It prints the largest loss difference
of fp32 from fp64 and of bf16 from fp32, over the first 50 steps and over all of them: a bf16 mode whose
losses stay within a few times PyTorch's own bf16-to-fp32 distance computes what bf16 can.

    PYTHONPATH=. python dev/bf16_distance.py --data-dir data/mnist --out bf16-distance.json

Plain SGD at the parity run's rate (lr 0.002, where fp32 and fp64 stay together: docs/performance.md,
section 5), batch 64, the shuffled batches of training.plan.
"""

from __future__ import annotations

import sys

import numpy as np

from mnist_cuda import data, reference
from mnist_cuda.cli import (
    SEED_MAX,
    Parser,
    data_inputs,
    existing_dir,
    int_in_range,
    learning_rate,
    load_data_or_exit,
    output_path,
    refuse_clashes,
    seed,
    write_json,
)
from mnist_cuda.sizes import MAX_BATCH, MAX_TIMED

PROG = "bf16_distance.py"
FIRST = 50  # the parity run's first window


def build_parser():
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-dir",
        type=existing_dir,
        default=None,
        help="the MNIST files (else $MNIST_DATA_DIR, then the cache, then a download)",
    )
    p.add_argument("--steps", type=int_in_range(1, MAX_TIMED), default=200, help="training steps per run")
    p.add_argument("--batch-size", type=int_in_range(2, MAX_BATCH), default=64, help="samples per step")
    p.add_argument("--lr", type=learning_rate, default=0.002, help="plain SGD's learning rate")
    p.add_argument("--seeds", type=int_in_range(1, 1000), default=3, help="how many seeds to run, from --first-seed on")
    p.add_argument("--first-seed", type=seed, default=0, help="the first seed")
    p.add_argument("--out", type=output_path, default=None, metavar="PATH", help="write the figures as JSON here")
    return p


def train_losses(torch, state, x, y, batches, lr, precision):
    """The losses of len(batches) plain-SGD steps of PyTorch's model at `precision` (fp64, fp32, bf16)."""
    import torch.nn.functional as F

    from mnist_cuda.torch_model import make_torch_model

    dtype = torch.float64 if precision == "fp64" else torch.float32
    net = make_torch_model().to("cuda", dtype)
    net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for idx in batches:
        images = torch.from_numpy(data.normalize(x[idx])).to("cuda", dtype)
        labels = torch.from_numpy(y[idx].astype(np.int64)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.nll_loss(net(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses).double().cpu().numpy()


def distance(a, b) -> dict:
    d = np.abs(a - b)
    return {"first_50": float(d[:FIRST].max()), "all": float(d.max())}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.first_seed + args.seeds - 1 > SEED_MAX:
        parser.fail("--seeds", f"{args.seeds} seeds from {args.first_seed} pass the last seed, {SEED_MAX}")
    refuse_clashes(parser, inputs=data_inputs("mnist", args.data_dir), outputs=[("--out", args.out)])
    try:
        import torch
    except ImportError:
        print(f"{PROG}: torch is not installed (pip install '.[torch]')", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{PROG}: torch sees no CUDA GPU (a CUDA build of torch and an NVIDIA GPU are needed)", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    from mnist_cuda import training

    train_x, train_y, _, _ = load_data_or_exit(PROG, "mnist", args.data_dir, quiet=False)
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seeds": {},
    }
    for s in range(args.first_seed, args.first_seed + args.seeds):
        chunks = training.plan(len(train_x), args.batch_size, s, True, training.Position(), args.steps)
        batches = [idx for chunk in chunks for idx in chunk.batches]
        state = reference.init_state_dict(s)
        runs = {p: train_losses(torch, state, train_x, train_y, batches, args.lr, p) for p in ("fp64", "fp32", "bf16")}
        row = {
            "fp32_vs_fp64": distance(runs["fp32"], runs["fp64"]),
            "bf16_vs_fp32": distance(runs["bf16"], runs["fp32"]),
            "final_loss": {p: float(v[-1]) for p, v in runs.items()},
        }
        out["seeds"][str(s)] = row
        print(
            f"seed {s}: max |loss diff| first {FIRST} / all {args.steps}: fp32 vs fp64 "
            f"{row['fp32_vs_fp64']['first_50']:.2e} / {row['fp32_vs_fp64']['all']:.2e}, bf16 vs fp32 "
            f"{row['bf16_vs_fp32']['first_50']:.2e} / {row['bf16_vs_fp32']['all']:.2e}",
            flush=True,
        )
    if args.out:
        write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
