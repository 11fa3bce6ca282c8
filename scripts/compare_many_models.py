#!/usr/bin/env python3
"""K models trained at once: ours against PyTorch's best many-model training, in one process.

    python scripts/compare_many_models.py --models 1,8,64 --json many.json --png many.png

At each K (batch --batch per model, plain SGD at one rate, each model its own seed's weights and data order):
ours K at once (the trainer's rounds, mnist_cuda.train_many: one step runner whose kernels step all K, and as
a second figure K step runners on K streams), ours one model after another, PyTorch one model
after another in its fastest mode at this batch (compiled, channels_last, the whole step one CUDA graph), and
PyTorch's K models at once, the faster of its two designs (HFTA's grouped convolutions and torch.func's vmap,
each a whole-step graph, compiled and not; mnist_cuda/compare/many_models.py). Each is the host's wall clock
over --rounds rounds after a warm-up; the result is model-steps per second and the seconds an epoch of all K
models takes. Before any is timed, each PyTorch design's per-model losses are checked against K separate models'.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, installed or not

from mnist_cuda import cli, data, sizes  # noqa: E402

PROG = "compare_many_models.py"
LR = 0.05
CHECK_MODELS = 3  # the models of the designs' check against separate models
CHANNELS, HIDDEN = (32, 64), 128  # the default model (training.DEFAULTS)


def build_parser() -> cli.Parser:
    p = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=cli.existing_dir, default=None, help="MNIST's IDX files (default: the cache)")
    p.add_argument(
        "--models",
        type=cli.model_counts,
        default="1,8,64",
        help="the K to measure, comma-separated; max: the most models that fit the GPU's memory and the kernels' "
        "indexing (default: 1,8,64)",
    )
    p.add_argument(
        "--batch", type=cli.int_in_range(1, 1024), default=64, help="images per model and step (default: 64)"
    )
    p.add_argument(
        "--rounds", type=cli.int_in_range(10, sizes.MAX_TIMED), default=200, help="timed rounds (default: 200)"
    )
    p.add_argument("--no-compile", action="store_true", help="PyTorch uncompiled only (quick runs, never a result)")
    p.add_argument("--json", type=cli.output_path, default=None, metavar="PATH", help="write the result here")
    p.add_argument("--png", type=cli.output_path, default=None, metavar="PATH", help="draw the result here")
    return p


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def our_rate(ds, k: int, batch: int, rounds: int, design: str = "stacked") -> float:
    """Our model-steps per second with K models stepped in rounds as the trainer steps them (K = 1 and
    "streams": one model alone): "stacked", one step runner whose kernels step all K (nets.ModelsNet);
    "streams", K step runners, each its graph on its own stream."""
    from mnist_cuda import cuda, optim, reference
    from mnist_cuda.compare.many_models import time_rounds
    from mnist_cuda.models_step import ModelsStep
    from mnist_cuda.nets import ModelsNet, Parameters, make_net
    from mnist_cuda.step import Step

    orders = [_batches(ds, batch, seed, rounds + 61) for seed in range(k)]
    if design == "stacked":
        models = Parameters.stacked(k)
        for seed, params in enumerate(models):
            params.load_state_dict(reference.init_state_dict(seed))
        options = [optim.SGDOptions(LR)] * k
        step = ModelsStep(ModelsNet(models, batch), optim.ModelsOptimizer(models, options), [0] * k, list(range(k)))
        one_round = lambda i: step.run(ds.train_x, ds.train_y, [o[i] for o in orders], [o[i + 1] for o in orders])
    else:
        runners = []
        for seed in range(k):
            params = Parameters()
            params.load_state_dict(reference.init_state_dict(seed))
            runners.append(Step(make_net(params, batch), LR, seed=seed))

        def one_round(i):
            for step, idx in zip(runners, orders):
                step.run(ds.train_x, ds.train_y, idx[i], idx[i + 1])

    seconds = time_rounds(one_round, cuda.require_gpu().cuda.runtime.deviceSynchronize, rounds, 60)
    return k / seconds


def _batches(ds, batch: int, seed: int, count: int) -> list:
    idxs = list(data.batch_indices(data.epoch_order(len(ds.train_x), seed, 0), batch, drop_last=True))
    return (idxs * (1 + count // len(idxs)))[:count]


def torch_alone_rate(torch, ds, batch: int, rounds: int, no_compile: bool) -> tuple[float, str]:
    """PyTorch's model-steps per second, one model at batch `batch` in its fastest mode there."""
    from mnist_cuda import reference
    from mnist_cuda.compare.candidates import BY_NAME
    from mnist_cuda.compare.many_models import time_rounds
    from mnist_cuda.compare.torch_side import TorchSide

    name = "graph, channels_last" if no_compile else "compiled+graph, channels_last"
    side = TorchSide(torch, reference.init_state_dict(0), batch, BY_NAME[name], CHANNELS, HIDDEN, LR)
    idx = _batches(ds, batch, 0, rounds + 61)
    side.prepare(ds.train_x, ds.train_y, idx[0])
    seconds = time_rounds(lambda i: side.step(ds.train_x, ds.train_y, idx[i]), torch.cuda.synchronize, rounds, 60)
    return 1 / seconds, name


def torch_many_rates(torch, ds, k: int, batch: int, rounds: int, no_compile: bool) -> dict:
    """{design name: model-steps per second, or the error} of PyTorch's many-model designs at K."""
    from mnist_cuda import reference
    from mnist_cuda.compare.many_models import TorchMany, time_rounds

    states = [reference.init_state_dict(seed) for seed in range(k)]
    orders = [_batches(ds, batch, seed, rounds + 61) for seed in range(k)]
    out = {}
    for design in ("grouped", "vmap"):
        for compiled in (False,) if no_compile else (False, True):
            name = f"{design}{'+compiled' if compiled else ''}+graph"
            try:
                side = TorchMany(torch, design, states, batch, LR, CHANNELS, HIDDEN, compiled)
                side.stage(ds.train_x, ds.train_y, [o[0] for o in orders])
                side.capture()
                step = lambda i: side.step(ds.train_x, ds.train_y, [o[i] for o in orders])
                out[name] = k / time_rounds(step, torch.cuda.synchronize, rounds, 60)
            except Exception as e:  # a design PyTorch cannot run is reported as such
                out[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            log(f"  K={k} torch {name}: {out[name]}")
    return out


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    cli.refuse_clashes(
        p, inputs=cli.data_inputs("mnist", args.data_dir), outputs=[("--json", args.json), ("--png", args.png)]
    )
    if args.png:
        cli.require_matplotlib(p, "--png")
    from mnist_cuda.compare.report import environment, require_torch_and_gpu
    from mnist_cuda.compare.timing import speed_defaults

    try:
        torch = require_torch_and_gpu()
    except Exception as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    from mnist_cuda import cuda, reference
    from mnist_cuda.compare.many_models import check_designs

    counts = model_counts_or_exit(p, args.models, args.batch)
    speed_defaults(torch)
    ds = data.load("mnist", args.data_dir, empty=cuda.pinned_empty, progress=False)
    checks = check_designs(
        torch, ds, [reference.init_state_dict(s) for s in range(CHECK_MODELS)], args.batch, LR, CHANNELS, HIDDEN
    )
    log(f"PyTorch designs against {CHECK_MODELS} separate models, largest loss difference: {checks}")
    ours_alone = our_rate(ds, 1, args.batch, args.rounds, "streams")
    torch_alone, torch_mode = torch_alone_rate(torch, ds, args.batch, args.rounds, args.no_compile)
    rows = []
    for k in counts:
        ours = {design: our_rate(ds, k, args.batch, args.rounds, design) for design in ("stacked", "streams")}
        many = torch_many_rates(torch, ds, k, args.batch, args.rounds, args.no_compile) if k > 1 else {}
        rows.append(_row(k, args.batch, ours, ours_alone, torch_alone, many))
        log(_line(rows[-1]))
    result = {
        "device": cuda.require_gpu().cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "env": environment(torch),
        "command": "python scripts/compare_many_models.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "batch": args.batch,
        "rounds": args.rounds,
        "lr": LR,
        "torch_alone_mode": torch_mode,
        "design_check_max_loss_difference": checks,
        "rows": rows,
    }
    print(format_table(result))
    if args.json:
        cli.write_json(args.json, result)
    if args.png:
        plot(result, args.png)
    return 0


def model_counts_or_exit(parser, counts: list, batch: int) -> list[int]:
    """--models with max resolved, each K checked before any work: K models on K streams need K models' memory
    (the most either of our designs holds at once), stacked they must pass the kernels' indexing."""
    from mnist_cuda import cuda
    from mnist_cuda.model_grid import MAX_MODELS

    cp = cuda.require_gpu()
    free, _ = cp.cuda.Device().mem_info
    each = sizes.device_bytes(CHANNELS, HIDDEN, batch, "fast", cuda.sm_count(), "fp32")
    most = min(MAX_MODELS, free // each, sizes.most_stacked_models(CHANNELS, batch, MAX_MODELS))
    if most < 1:
        parser.fail("--batch", f"not one model of batch {batch:,} fits the GPU's {free / 1e9:.1f} GB free")
    counts = list(dict.fromkeys(most if k == "max" else k for k in counts))  # (max may repeat a count)
    for k in counts:
        cli.fail_on(parser, sizes.models_problem(k, each, free, "--models", batch))
        cli.fail_on(parser, sizes.stacked_problem(k, CHANNELS, batch, "--models"))
    return counts


def _row(k, batch, ours, ours_alone, torch_alone, many) -> dict:
    rates = {n: v for n, v in many.items() if isinstance(v, float)}
    best = max(rates, key=rates.get) if rates else None
    per_epoch = k * (data.TRAIN_SAMPLES["mnist"] // batch)
    row = {
        "models": k,
        "model_steps_per_s": {
            "ours_at_once": ours["stacked"],
            "ours_streams": ours["streams"],
            "ours_one_after_another": ours_alone,
            "torch_one_after_another": torch_alone,
            "torch_at_once": rates[best] if best else None,
        },
        "torch_at_once_design": best,
        "torch_designs": many,
    }
    row["epoch_s"] = {n: (per_epoch / v if v else None) for n, v in row["model_steps_per_s"].items()}
    return row


def _line(row) -> str:
    r = row["model_steps_per_s"]
    cells = "  ".join(f"{n} {v:,.0f}/s" for n, v in r.items() if v)
    return f"K={row['models']}: {cells}"


def format_table(result: dict) -> str:
    lines = [
        f"K models at batch {result['batch']} each on the {result['device']}: model-steps per second (an epoch of "
        f"all K models, s)",
        f"{'K':>4}  {'ours at once':>18}  {'ours on K streams':>18}  {'ours one by one':>18}  {'torch one by one':>18}"
        f"  {'torch at once':>18}  {'ours/torch at once':>18}  {'at once/one by one':>18}",
    ]
    for row in result["rows"]:
        r, e = row["model_steps_per_s"], row["epoch_s"]
        cell = lambda n: f"{r[n]:9,.0f} ({e[n]:5.1f})" if r[n] else f"{'-':>18}"
        ratio = f"{r['ours_at_once'] / r['torch_at_once']:17.2f}x" if r["torch_at_once"] else f"{'-':>18}"
        gain = r["ours_at_once"] / r["ours_one_after_another"]
        lines.append(
            f"{row['models']:4d}  {cell('ours_at_once')}  {cell('ours_streams')}  {cell('ours_one_after_another')}  "
            f"{cell('torch_one_after_another')}  {cell('torch_at_once')}  {ratio}  {gain:17.2f}x"
        )
    lines.append(f"PyTorch one by one: {result['torch_alone_mode']}; at once: the faster of its designs per K")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = {
        "ours_at_once": "ours, K at once",
        "ours_one_after_another": "ours, one after another",
        "torch_at_once": "PyTorch, K at once (best design)",
        "torch_one_after_another": "PyTorch, one after another (fastest mode)",
    }
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for j, (key, label) in enumerate(names.items()):
        values = [row["model_steps_per_s"][key] or 0 for row in rows]
        ax.bar(np.arange(len(rows)) + (j - 1.5) * width, values, width, label=label)
    ax.set_xticks(np.arange(len(rows)), [f"K = {row['models']}" for row in rows])
    ax.set_ylabel("model-steps per second")
    ax.set_title(f"K models of batch {result['batch']} on the {result['device']}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    cli.save_figure(fig, path)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
