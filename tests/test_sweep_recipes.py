"""scripts/sweep_recipes.py: its candidates are valid trainer settings and the recipes it chose are the
trainer's (CPU; the sweep itself runs on a GPU)."""

import importlib.util
import json

from conftest import REPO
from mnist_cuda import optim, training


def load_script():
    spec = importlib.util.spec_from_file_location("sweep_recipes", REPO / "scripts" / "sweep_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_candidates_are_valid_options():
    sweep = load_script()
    for name, batch, lr, options, epochs in sweep.FAST + sweep.BEST:
        assert optim.options_from(options, lr, epochs * (60000 // batch)).momentum == 0.9, name


def test_the_committed_choice_is_the_trainers_recipe():
    result = json.loads((REPO / "benchmarks" / "results" / "recipes-h200.json").read_text())
    rows = {r["name"]: r for r in result["candidates"]}
    for recipe, name in result["chosen"].items():
        row, flags = rows[name], training.RECIPES[recipe]
        assert (row["batch_size"], row["lr"], row["epochs"]) == (flags["batch_size"], flags["lr"], flags["epochs"])
        for key, value in row["options"].items():
            assert flags[key] == value, (recipe, key)
    fast = rows[result["chosen"]["fast"]]
    assert fast["all_reach_target"] and fast["mean_time_to_target"] == min(
        r["mean_time_to_target"] for r in rows.values() if r.get("all_reach_target") and r["name"].startswith("fast")
    )
