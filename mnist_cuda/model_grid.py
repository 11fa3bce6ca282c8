"""The models of one trainer run: the cross product of the lists its per-model flags were given
(`--seed 0-15 --lr 0.02,0.05` is 32 models), or the checkpoints --init names, each model's flags as a single
run would take them; their names, which say the flags in which they differ, and their groups (the models
that differ only in their seed).

Architecture, data set, batch size, kernels, precision and the length of the run are shared: those flags take
one value (mnist_cuda.train_arguments). A single model is the single run of mnist_cuda.train, unchanged.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import math
from pathlib import Path

from . import optim

# the flags a model has its own value of, in the order a name lists them
PER_MODEL = ("seed", "lr", "momentum", "dampening", "nesterov", "weight_decay", "schedule") + (
    "step_size",
    "gamma",
    "pct_start",
    "anneal",
    "augment",
)
# a run's models each hold their step's buffers, graphs and streams on the GPU, and their checkpoints and
# curves on the host: a bound on the count that the memory check (mnist_cuda.train_many) then narrows
MAX_MODELS = 1024


@dataclasses.dataclass
class Model:
    """One model of a run: its flags as a single run takes them (scalars; init one checkpoint or None)."""

    args: argparse.Namespace
    values: dict = dataclasses.field(default_factory=dict)  # its per-model settings, once resolved (name_models)
    name: str = ""  # the settings in which it differs from the run's other models, e.g. "seed3-lr0.02"
    group: str = ""  # the same without the seed: the models of a group differ only in their seed


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def expand(args: argparse.Namespace, parser) -> list[Model]:
    """The run's models from its flags: one per combination of the per-model lists (each list's order, the
    first list slowest), or one per --init checkpoint. A value given twice in a list, lists beside several
    checkpoints, or more than MAX_MODELS models is a usage error."""
    lists = {k: getattr(args, k) for k in PER_MODEL if getattr(args, k) is not None}
    for key, values in lists.items():
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            parser.fail(flag(key), f"lists {_word(repeated[0])} twice; each value makes a model, and two would be one")
    inits = args.init or [None]
    if len(inits) > 1:
        listed = [k for k, v in lists.items() if len(v) > 1]
        if listed:
            parser.fail(
                flag(listed[0]),
                "a list starts new models, while several --init checkpoints continue theirs: give one or the other",
            )
        _refuse_repeated_inits(parser, inits)
    count = len(inits) * math.prod(len(v) for v in lists.values())
    if count > MAX_MODELS:
        sizes = " x ".join(f"{len(v)} ({flag(k)})" for k, v in lists.items() if len(v) > 1)
        parser.fail(flag(next(iter(lists))), f"{sizes} make {count:,} models; at most {MAX_MODELS:,} train in one run")
    models = []
    for init in inits:
        for combination in itertools.product(*lists.values()):
            one = copy.copy(args)
            for key, value in zip(lists, combination):
                setattr(one, key, value)
            one.init = init
            models.append(Model(one))
    return models


def _refuse_repeated_inits(parser, inits):
    from .cli import same_file

    for i, path in enumerate(inits):
        for other in inits[:i]:
            if same_file(path, other):
                parser.fail("--init", f"{path} and {other} are one checkpoint; each model continues from its own")


def resolved_values(setup) -> dict:
    """A model's per-model settings as its checked Setup (mnist_cuda.train_setup) resolves them."""
    record = optim.describe(setup.optimizer)
    values = {"seed": setup.seed, "lr": setup.lr, "augment": setup.augment}
    values.update({k: record.get(k) for k in optim.ARGUMENTS})
    return values


def name_models(models: list[Model], setups) -> None:
    """Each model's values, name and group from its Setup: the settings that differ between the run's models,
    in PER_MODEL's order (all models the same: the name is the seed's). Two models with the same settings are
    a usage error of the caller (check_distinct)."""
    for model, setup in zip(models, setups):
        model.values = resolved_values(setup)
    differ = [k for k in PER_MODEL if len({repr(m.values[k]) for m in models}) > 1] or ["seed"]
    for model in models:
        words = [_name_part(k, model.values[k]) for k in differ]
        model.name = "-".join(words)
        model.group = "-".join(w for k, w in zip(differ, words) if k != "seed") or "all"


def _name_part(key: str, value) -> str:
    label = key.replace("_", "-")
    if isinstance(value, bool):
        return label if value else f"no-{label}"
    if isinstance(value, str):
        return f"{label}-{value}"
    if value is None:
        return f"{label}-none"
    return f"{label}{value:g}" if isinstance(value, float) else f"{label}{value}"


def _word(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def duplicate(models: list[Model]) -> tuple[Model, Model] | None:
    """Two models whose settings are the same (they would train the same bits), if any."""
    seen = {}
    for model in models:
        key = repr(sorted(model.values.items()))
        if key in seen:
            return seen[key], model
        seen[key] = model
    return None


def model_path(path: Path | None, model: Model) -> Path | None:
    """A run-level output path made the model's: run.npz -> run-seed3-lr0.02.npz."""
    if path is None:
        return None
    return path.with_name(f"{path.stem}-{model.name}{path.suffix}")


def groups(models: list[Model]) -> dict[str, list[Model]]:
    """The models by group, in the order of their first model."""
    out: dict[str, list[Model]] = {}
    for model in models:
        out.setdefault(model.group, []).append(model)
    return out
