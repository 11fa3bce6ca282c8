"""Train the MNIST CNN on the GPU with our kernels:  python -m mnist_cuda.train [--help]

Every step (load, forward, loss, backward, SGD update, zero-grad) runs our CUDA kernels; by default the
whole step is one CUDA graph replayed per batch. Every PHASE_SAMPLE_EVERY-th step runs the same kernels
launched one by one with CUDA events between the phases, which gives the per-phase times of the summary.
The plan of the batches and the loop over them are mnist_cuda.training's; this module is the command around
them: the run, resumed from a checkpoint, and what it writes and prints. Its flags are
mnist_cuda.train_arguments', their checks (and reading the --init checkpoint) mnist_cuda.train_setup's.

Every flag, output path, --init checkpoint and named data folder is checked before any work starts; a
mistake is one line and exit status 2. A checkpoint records where training stands (the step count, the
epoch and how far into its shuffled order), so `--init` from it continues exactly as one longer run would.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from . import checkpoint, cli, cuda, curves, data, model_grid, optim
from .train_arguments import build_parser
from .train_setup import Setup, check
from .training import Position, TrainingDiverged, plan, run_chunk

# how the summary line names a precision other than the default
PRECISION_WORDS = {"fp32": "", "tf32": ", conv2 in TF32", "bf16": ", conv2 and fc1 in bf16"}


def checkpoint_meta(s: Setup, at: Position, **extra) -> dict:
    return {
        "dataset": s.dataset,
        "channels": list(s.channels),
        "hidden": s.hidden,
        "seed": s.seed,
        "lr": s.lr,
        "batch_size": s.batch_size,
        "kernels": s.kernels,
        "precision": s.precision,
        "shuffle": s.shuffle,
        "augment": s.augment,
        "step": at.step,
        "epoch_index": at.epoch,
        "epoch_sample": at.sample,
        "optimizer": optim.describe(s.optimizer),
        **extra,
    }


def train(args, parser) -> int:
    models = model_grid.expand(args, parser)
    if len(models) > 1:
        from .train_many import train_many

        return train_many(models, args, parser)
    args = models[0].args
    if args.ensemble:
        parser.fail("--ensemble", "needs several models (a list such as --seed 0-4, or several --init checkpoints)")
    s = check(args, parser)
    prog = parser.prog
    if args.steps == 0:
        checkpoint.save_checkpoint(
            args.save,
            {**s.state, **{checkpoint.MOMENTUM_PREFIX + k: v for k, v in s.buffers.items()}},
            checkpoint_meta(s, s.start),
        )
        print(f"wrote the initial checkpoint to {args.save}")
        return 0
    cli.check_data_dir_or_exit(prog, s.dataset, args.data_dir)
    cli.gpu_or_exit(prog)  # before a download
    cli.fits_gpu_or_exit(
        parser,
        s.channels,
        s.hidden,
        s.batch_size,
        s.kernels,
        s.precision,
        momentum=s.optimizer.momentum > 0,
        augment=s.augment > 0,
    )
    arrays = cli.load_data_or_exit(prog, s.dataset, args.data_dir, args.quiet)
    from .nets import Parameters, make_net
    from .step import PHASES, Step, phase_times_ms

    ds = data.host_data(s.dataset, arrays, empty=cuda.pinned_empty)
    params = Parameters(s.channels, s.hidden)
    params.load_state_dict(s.state)
    optimizer = optim.Optimizer(params, s.optimizer, s.start.step, s.buffers)
    step = Step(
        make_net(params, s.batch_size, s.kernels, s.precision),
        optimizer,
        mode="eager" if args.eager else "graph",
        augment=s.augment,
        seed=s.seed,
        first_step=s.start.step,
    )
    chunks = plan(len(ds.train_x), s.batch_size, s.seed, s.shuffle, s.start, s.steps)
    if args.metrics and args.init:
        _keep_metrics_until(args.metrics, s.start.step)
    metrics = open(args.metrics, "a" if args.init else "w") if args.metrics else None
    from tqdm import tqdm

    phase_events = []  # one list of len(PHASES) + 1 events per sampled step of the chunk in progress
    phase_sum, phase_count = np.zeros(len(PHASES)), 0  # the sampled steps' phase times so far, ms
    plotted = []  # (steps, losses) of each chunk, for --plot
    evals = []  # (step, epoch, test accuracy) of each epoch, for --plot
    at, saved = s.start, None  # where training stands; the last checkpoint written
    epoch = s.start.epoch  # the epoch in progress
    reached = None  # (epoch, training seconds, evaluation seconds) when --target-accuracy was reached
    train_seconds = eval_seconds = 0.0
    accuracy = float("nan")
    try:
        for chunk in chunks:
            first, epoch = chunk.first_step, chunk.epoch
            bar = tqdm(
                total=len(chunk.batches),
                desc=f"epoch {chunk.epoch + 1}",
                unit="step",
                disable=args.quiet,
                leave=True,
                dynamic_ncols=True,
            )
            t0 = time.perf_counter()

            def progress(done, losses):
                bar.set_postfix(
                    loss=f"{losses[-1]:.4f}", img_s=f"{done * s.batch_size / (time.perf_counter() - t0):,.0f}"
                )
                bar.update(done - bar.n)

            losses = run_chunk(step, ds, chunk, progress, phase_events)
            epoch_seconds = time.perf_counter() - t0
            times = phase_times_ms(phase_events)  # (the chunk's steps are done: this waits for nothing)
            phase_sum, phase_count = phase_sum + times.sum(axis=0), phase_count + len(times)
            phase_events.clear()
            train_seconds += epoch_seconds
            bar.close()
            at = chunk.end
            t1 = time.perf_counter()
            accuracy = step.evaluate(ds.test_x, ds.test_y)
            eval_seconds += time.perf_counter() - t1
            lines = [{"step": first + j + 1, "epoch": chunk.epoch + 1, "loss": float(v)} for j, v in enumerate(losses)]
            lines.append({"step": at.step, "epoch": chunk.epoch + 1, "test_accuracy": accuracy})
            if args.plot:
                plotted.append((np.arange(first + 1, first + len(losses) + 1), losses))
                evals.append((at.step, chunk.epoch + 1, accuracy))
            if metrics:
                metrics.write("".join(json.dumps(d) + "\n" for d in lines))
                metrics.flush()
            print(
                f"epoch {chunk.epoch + 1}: test accuracy {accuracy * 100:.2f}%  loss {losses[-1]:.4f}  "
                f"{len(chunk.batches) * s.batch_size / epoch_seconds:,.0f} img/s"
            )
            if args.save:
                with cli.interrupt_deferred():  # a Ctrl-C here would leave `saved` behind the file it names
                    checkpoint.save_checkpoint(
                        args.save,
                        {**params.state_dict(), **optimizer.buffer_state()},
                        checkpoint_meta(s, at, test_accuracy=accuracy),
                    )
                    saved = at
            if args.target_accuracy is not None and 100 * accuracy >= args.target_accuracy:
                reached = (epoch + 1, train_seconds, eval_seconds)
                break
    except TrainingDiverged as e:
        print(f"{prog}: {e}; stopping." + _where_saved(args, saved), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted in epoch {epoch + 1}." + _where_saved(args, saved), file=sys.stderr)
        return 130
    finally:
        if metrics:
            metrics.close()

    done = at.step - s.start.step
    phases = dict(zip(PHASES, (phase_sum / phase_count).tolist())) if phase_count else {}
    print(
        f"\ntest accuracy {accuracy * 100:.2f}% after {done} steps"
        f"{f' (step {at.step} in all)' if s.start.step else ''} "
        f"({s.dataset}, batch {s.batch_size}, lr {s.lr}{_optimizer_words(s.optimizer)}, seed {s.seed}"
        f"{f', images shifted by up to {s.augment} px' if s.augment else ''}"
        f"{PRECISION_WORDS[s.precision]})"
    )
    print(
        f"training wall time {train_seconds:.2f} s, {done * s.batch_size / train_seconds:,.0f} img/s "
        f"({'eager launches' if args.eager else 'CUDA graph per step'}); evaluation {eval_seconds:.2f} s"
    )
    if phases:
        print(
            f"per-phase mean, {phase_count} sampled steps, eager launches with CUDA events: "
            + ", ".join(f"{k} {v * 1000:.1f} us" for k, v in phases.items())
            + (" (fast kernels: zero-grad is fused into the update)" if s.kernels == "fast" else "")
        )
    if args.target_accuracy is not None:
        print(
            f"target {args.target_accuracy:g}%: "
            + (
                f"reached in epoch {reached[0]} after {reached[1]:.3f} s of training (evaluation {reached[2]:.3f} s "
                f"more, not counted)"
                if reached
                else "not reached"
            )
        )
    if args.save:
        print(f"checkpoint: {args.save}")
    if args.plot:
        run = curves.Curves(np.concatenate([st for st, _ in plotted]), np.concatenate([ls for _, ls in plotted]), evals)
        curves.plot_training(run, args.plot, title=f"{s.dataset}, batch {s.batch_size}, lr {s.lr}, seed {s.seed}")
        print(f"plot: {args.plot}")
    return 0


def _keep_metrics_until(path: Path, step: int):
    """A continued run appends to its metrics file: first drop the records of steps after the checkpoint (an
    earlier continuation, or an epoch interrupted after its records were written), atomically, a line at a
    time (the file may be long)."""
    if not path.is_file():
        return

    def copy_kept(out):
        with open(path, errors="replace") as lines:
            for line in lines:
                try:
                    keep = json.loads(line)["step"] <= step
                except (ValueError, KeyError, TypeError):
                    keep = True  # not ours to judge: leave it
                if keep:
                    out.write(line.encode())

    cli.write_atomic(path, copy_kept)


def _optimizer_words(o: optim.SGDOptions) -> str:
    words = [f"momentum {o.momentum:g}" + (" (Nesterov)" if o.nesterov else "")] if o.momentum else []
    words += [f"dampening {o.dampening:g}"] if o.dampening else []
    words += [f"weight decay {o.weight_decay:g}"] if o.weight_decay else []
    words += [f"{o.schedule.kind} schedule"] if o.schedule.kind != "constant" else []
    return "".join(", " + w for w in words)


def _where_saved(args, saved: Position | None) -> str:
    if args.save is None:
        return " Nothing was saved (no --save)."
    if saved is None:
        return f" No checkpoint was written yet; {args.save} was left as it was."
    return (
        f" The last checkpoint, {args.save}, holds step {saved.step} (written at the end of an epoch) and is "
        f"intact: continue with --init {args.save}"
    )


def main(argv=None) -> int:
    return cli.run(build_parser(), train, argv)


if __name__ == "__main__":
    sys.exit(main())
