"""A trainer run of several models (mnist_cuda.model_grid makes them from the flags' lists or the --init
checkpoints): each model trains exactly as a single run with its flags would, its own initial weights, data
order and augmentation from its seed, so its losses and weights are that run's bits (but at 1,024 images or more
per model with the fast kernels, where the single run takes BN2's statistics from conv2's forward:
there they round differently, and the runs part by rounding from the first step; nets.models_net says why).

The models train in rounds, each round a step of every model. With the fast kernels one step runner steps them
all (Stacked: nets.ModelsNet, each kernel launched once for the K models, the whole round one CUDA graph);
with the naive ones each model has its own step runner and its graph runs on its own stream (Streams), so the
GPU runs the models' steps side by side. docs/performance.md measures the designs.

One progress bar per epoch counts the rounds; the metrics are one JSON-lines file whose records name their
model; the checkpoints are one per model, named after the flags in which the models differ; the summary
prints each model's test accuracy and, per group of hyperparameters, the mean, standard deviation, min and max
over its seeds, and with --ensemble the accuracy of the mean of the models' probabilities.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from . import checkpoint, cli, cuda, curves, data, optim, sizes
from .model_grid import PER_MODEL, Model, duplicate, flag, groups, model_path, name_models
from .train_setup import Setup, check
from .training import TrainingDiverged, plan, run_rounds

# the settings the models of one run share: a model that differs in one is a usage error
SHARED = ("dataset", "batch_size", "kernels", "precision", "shuffle", "channels", "hidden", "steps")


def check_models(models: list[Model], args, parser) -> list[Setup]:
    """Each model's flags checked as a single run's, then the run's: shared settings shared, no two models the
    same, no output replacing an input or another model's."""
    if args.target_accuracy is not None:
        parser.fail("--target-accuracy", "times one run to its target; give one model (no lists, one --init)")
    setups = [check(m.args, parser) for m in models]
    for key in SHARED:
        values = [getattr(s, key) for s in setups]
        if len(set(values)) > 1:
            at = next(i for i, v in enumerate(values) if v != values[0])
            parser.fail(
                "--init",
                f"{models[at].args.init} has {key} {values[at]} where {models[0].args.init} has {values[0]}; the "
                f"models of one run share their {key.replace('_', ' ')}",
            )
    if len({s.start.step for s in setups}) > 1:
        parser.fail("--init", "the checkpoints stopped at different steps; the models of one run train in step")
    name_models(models, setups)
    s = setups[0]
    if s.kernels == "fast":  # Stacked steps the models' batches as one batch
        cli.fail_on(parser, sizes.stacked_problem(len(models), s.channels, s.batch_size, list_flag(models)))
    same = duplicate(models)
    if same:
        parser.fail(
            flag("seed") if models[0].args.init is None else "--init",
            f"two models have the same settings ({same[0].name}): they would train the same bits",
        )
    cli.refuse_clashes(
        parser,
        inputs=[("--init", [m.args.init for m in models if m.args.init])]
        + cli.data_inputs(setups[0].dataset, args.data_dir),
        outputs=[("--save", [model_path(args.save, m) for m in models]), ("--metrics", args.metrics)]
        + [("--plot", args.plot)],
        allowed=[("--save", "--init")],
    )
    if args.plot is not None:
        points = len(models) * setups[0].steps
        cli.fits_host_or_fail(parser, "--plot", curves.plot_bytes(points), f"drawing {points:,} model-steps")
    return setups


def list_flag(models: list[Model]) -> str:
    """The flag a problem with the number of models blames: the first per-model flag whose values differ, else
    --init."""
    for key in PER_MODEL:
        if len({repr(m.values.get(key)) for m in models}) > 1:
            return flag(key)
    return "--init"


def fits_gpu_or_exit(parser, models: list[Model], s: Setup) -> None:
    """The models' buffers fit the GPU's free memory, or a usage error naming the most models that fit."""
    cp = cuda.require_gpu()
    free, _ = cp.cuda.Device().mem_info
    momentum, augment = any(m.values["momentum"] for m in models), any(m.values["augment"] for m in models)
    cli.fits_gpu_or_exit(parser, s.channels, s.hidden, s.batch_size, s.kernels, s.precision, momentum, augment)
    each = sizes.device_bytes(s.channels, s.hidden, s.batch_size, s.kernels, cuda.sm_count(), s.precision)
    cli.fail_on(parser, sizes.models_problem(len(models), each, free, list_flag(models), s.batch_size))


def train_many(models: list[Model], args, parser) -> int:
    setups = check_models(models, args, parser)
    from .train import checkpoint_meta

    saves = [model_path(args.save, m) for m in models]
    if args.steps == 0:
        for s, path in zip(setups, saves):
            checkpoint.save_checkpoint(path, {**s.state, **_momentum(s.buffers)}, checkpoint_meta(s, s.start))
        print(f"wrote the initial checkpoints of {len(models)} models: {saves[0]} ... {saves[-1]}")
        return 0
    s0 = setups[0]
    cli.check_data_dir_or_exit(parser.prog, s0.dataset, args.data_dir)
    cli.gpu_or_exit(parser.prog)
    fits_gpu_or_exit(parser, models, s0)
    arrays = cli.load_data_or_exit(parser.prog, s0.dataset, args.data_dir, args.quiet)
    ds = data.host_data(s0.dataset, arrays, empty=cuda.pinned_empty)
    engine = make_models(setups, args.eager)
    plans = [plan(len(ds.train_x), s.batch_size, s.seed, s.shuffle, s.start, s.steps) for s in setups]
    if args.metrics and args.init:
        from .train import _keep_metrics_until

        _keep_metrics_until(args.metrics, s0.start.step)
    run = _Run(models, setups, engine, ds, args)
    try:
        run.train(plans, saves, checkpoint_meta)
    except TrainingDiverged as e:
        print(f"{parser.prog}: {e}; stopping." + _where_saved(args, run.saved), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"\n{parser.prog}: interrupted in epoch {run.epoch + 1}." + _where_saved(args, run.saved), file=sys.stderr
        )
        return 130
    finally:
        run.close()
    run.summary()
    return 0


def _momentum(buffers: dict) -> dict:
    return {checkpoint.MOMENTUM_PREFIX + k: v for k, v in buffers.items()}


class Streams:
    """K step runners, one per model, each its graph on its own stream (any kernels): a round launches each."""

    design = "a CUDA graph per model step, the models' steps side by side on their own streams"

    def __init__(self, setups: list[Setup], eager: bool):
        from .nets import Parameters, make_net
        from .step import Step

        self.engine = []
        for s in setups:
            params = Parameters(s.channels, s.hidden)
            params.load_state_dict(s.state)
            optimizer = optim.Optimizer(params, s.optimizer, s.start.step, s.buffers)
            net = make_net(params, s.batch_size, s.kernels, s.precision)
            mode = "eager" if eager else "graph"
            self.engine.append(Step(net, optimizer, mode, s.augment, s.seed, s.start.step))

    def round(self, ds, pairs):
        for step, (idx, next_idx) in zip(self.engine, pairs):
            step.run(ds.train_x, ds.train_y, idx, next_idx)

    def losses(self, reset: bool = False) -> list:
        return [step.losses(reset) for step in self.engine]

    def synchronize(self):
        for step in self.engine:
            step.synchronize()

    def accuracies(self, x, y) -> list[float]:
        return [step.evaluate(x, y) for step in self.engine]

    def logits(self, m: int, x):
        return self.engine[m].logits(x)

    def state(self, m: int) -> dict:
        step = self.engine[m]
        return {**step.net.params.state_dict(), **step.optimizer.buffer_state()}


class Stacked:
    """The K models in one step runner whose kernels step them all at once (nets.ModelsNet, fast kernels)."""

    design = "one CUDA graph per round stepping all the models, each kernel launched once for all of them"

    def __init__(self, setups: list[Setup], eager: bool):
        from .models_step import ModelsStep
        from .nets import ModelsNet, Parameters

        s0 = setups[0]
        self.models = Parameters.stacked(len(setups), s0.channels, s0.hidden)
        for params, s in zip(self.models, setups):
            params.load_state_dict(s.state)
        self.optimizer = optim.ModelsOptimizer(
            self.models, [s.optimizer for s in setups], s0.start.step, [s.buffers for s in setups]
        )
        net = ModelsNet(self.models, s0.batch_size, s0.precision)
        augments, seeds = [s.augment for s in setups], [s.seed for s in setups]
        mode = "eager" if eager else "graph"
        self.step = ModelsStep(net, self.optimizer, augments, seeds, mode, s0.start.step)

    def round(self, ds, pairs):
        idx = [p[0] for p in pairs]
        next_idx = None if pairs[0][1] is None else [p[1] for p in pairs]
        self.step.run(ds.train_x, ds.train_y, idx, next_idx)

    def losses(self, reset: bool = False) -> list:
        return self.step.losses(reset)

    def synchronize(self):
        self.step.synchronize()

    def accuracies(self, x, y) -> list[float]:
        return self.step.evaluate_models(x, y)

    def logits(self, m: int, x):
        return self.step.model_logits(m, x)

    def state(self, m: int) -> dict:
        return {**self.models[m].state_dict(), **self.optimizer.optimizers[m].buffer_state()}


def make_models(setups: list[Setup], eager: bool):
    """The run's models: stacked where the kernels take a model index (the fast ones), else side by side."""
    return (Stacked if setups[0].kernels == "fast" else Streams)(setups, eager)


class _Run:
    """The training loop of a many-model run and what it prints and writes."""

    def __init__(self, models, setups, engine, ds, args):
        self.models, self.setups, self.engine, self.ds, self.args = models, setups, engine, ds, args
        self.metrics = open(args.metrics, "a" if args.init else "w") if args.metrics else None
        self.epoch, self.saved = setups[0].start.epoch, None
        self.train_seconds = self.eval_seconds = 0.0
        self.accuracy = [float("nan")] * len(models)
        self.curves = [([], [], []) for _ in models]  # per model: step arrays, loss arrays, evals
        self.done = 0

    def train(self, plans, saves, checkpoint_meta):
        from tqdm import tqdm

        K, B = len(self.models), self.setups[0].batch_size
        for chunks in zip(*plans):
            c0 = chunks[0]
            self.epoch = c0.epoch
            bar = tqdm(total=len(c0.batches), desc=f"epoch {c0.epoch + 1}", unit="round", disable=self.args.quiet)
            t0 = time.perf_counter()

            def progress(done, losses):
                mean = float(np.mean([ls[-1] for ls in losses]))
                rate = done * K * B / (time.perf_counter() - t0)
                bar.set_postfix(mean_loss=f"{mean:.4f}", img_s=f"{rate:,.0f}")
                bar.update(done - bar.n)

            losses = run_rounds(self.engine, self.ds, chunks, [m.name for m in self.models], progress)
            seconds = time.perf_counter() - t0
            self.train_seconds += seconds
            bar.close()
            t1 = time.perf_counter()
            self.accuracy = self.engine.accuracies(self.ds.test_x, self.ds.test_y)
            self.eval_seconds += time.perf_counter() - t1
            self._record(chunks, losses)
            print(
                f"epoch {c0.epoch + 1}: test accuracy mean {np.mean(self.accuracy) * 100:.2f}% (min "
                f"{min(self.accuracy) * 100:.2f}%, max {max(self.accuracy) * 100:.2f}%) over {K} models  "
                f"{len(c0.batches) * K * B / seconds:,.0f} img/s"
            )
            if self.args.save:
                with cli.interrupt_deferred():  # every model's checkpoint of this epoch, and `saved` saying so
                    for m, (s, path, acc) in enumerate(zip(self.setups, saves, self.accuracy)):
                        state = self.engine.state(m)
                        checkpoint.save_checkpoint(path, state, checkpoint_meta(s, c0.end, test_accuracy=acc))
                    self.saved = c0.end
            self.done = c0.end.step - self.setups[0].start.step

    def _record(self, chunks, losses):
        lines = []
        for m, chunk, ls, acc, (steps, values, evals) in zip(self.models, chunks, losses, self.accuracy, self.curves):
            first, epoch = chunk.first_step, chunk.epoch + 1
            whose = {"model": m.name, "group": m.group}
            lines += [{**whose, "step": first + j + 1, "epoch": epoch, "loss": float(v)} for j, v in enumerate(ls)]
            lines.append({**whose, "step": chunk.end.step, "epoch": epoch, "test_accuracy": acc})
            if self.args.plot:
                steps.append(np.arange(first + 1, first + len(ls) + 1))
                values.append(ls)
                evals.append((chunk.end.step, epoch, acc))
        if self.metrics:
            self.metrics.write("".join(json.dumps(d) + "\n" for d in lines))
            self.metrics.flush()

    def close(self):
        if self.metrics:
            self.metrics.close()

    def summary(self):
        args, s0, K = self.args, self.setups[0], len(self.models)
        width = max(len(m.name) for m in self.models)
        print(
            f"\ntest accuracy of each of the {K} models after {self.done} steps ({s0.dataset}, batch {s0.batch_size})"
        )
        for m, acc in zip(self.models, self.accuracy):
            print(f"  {m.name:<{width}}  {acc * 100:.2f}%")
        accuracy = dict(zip((m.name for m in self.models), self.accuracy))
        for group, members in groups(self.models).items():
            print(group_line(group, [accuracy[m.name] for m in members]))
        if args.ensemble:
            print(self._ensemble_line())
        model_steps = K * self.done
        print(
            f"training wall time {self.train_seconds:.2f} s for {K} models, {model_steps / self.train_seconds:,.0f} "
            f"model-steps/s, {model_steps * s0.batch_size / self.train_seconds:,.0f} img/s "
            f"({'eager launches' if args.eager else self.engine.design}); evaluation {self.eval_seconds:.2f} s"
        )
        if args.save:
            print(f"checkpoints: {model_path(args.save, self.models[0])} ... ({K} files)")
        if args.plot:
            self._plot()

    def _ensemble_line(self) -> str:
        from .evaluate import ensemble_log_probs

        t0 = time.perf_counter()
        logits = [self.engine.logits(m, self.ds.test_x) for m in range(len(self.models))]
        correct = int(np.sum(ensemble_log_probs(logits).argmax(axis=1) == self.ds.test_y))
        samples = len(self.ds.test_y)
        return (
            f"ensemble of the {len(logits)} models (the mean of their probabilities): test accuracy "
            f"{100 * correct / samples:.2f}% ({correct} of {samples}; {time.perf_counter() - t0:.2f} s)"
        )

    def _plot(self):
        runs = []
        for m, (steps, values, evals) in zip(self.models, self.curves):
            runs.append((m.name, m.group, curves.Curves(np.concatenate(steps), np.concatenate(values), evals)))
        s0 = self.setups[0]
        curves.plot_models(runs, self.args.plot, title=f"{len(runs)} models, {s0.dataset}, batch {s0.batch_size}")
        print(f"plot: {self.args.plot}")


def group_line(group: str, accuracy: list[float]) -> str:
    """A group's test accuracy over its seeds: mean, standard deviation (over the seeds, n - 1), min, max."""
    a = 100 * np.asarray(accuracy)
    std = f"{a.std(ddof=1):.2f}" if len(a) > 1 else "-"
    label = "all models" if group == "all" else f"group {group}"
    return (
        f"{label}, {len(a)} seed{'s' if len(a) > 1 else ''}: mean {a.mean():.2f}%  std {std}  "
        f"min {a.min():.2f}%  max {a.max():.2f}%"
    )


def _where_saved(args, saved) -> str:
    if args.save is None:
        return " Nothing was saved (no --save)."
    if saved is None:
        return " No checkpoint was written yet."
    return (
        f" The last checkpoints hold step {saved.step} (written at the end of an epoch) and are intact: continue "
        f"with --init and the {args.save.stem}-*{args.save.suffix} files"
    )
