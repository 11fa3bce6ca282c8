"""PyTorch at its best in the comparison (mnist_cuda/compare/candidates.py, torch_side.py): which candidates a
run times, which one the headline takes, the check that nothing recompiles while timed (a fake torch here,
the real one where installed), the outside figure, and the rate table of a graphed schedule."""

import collections
import json
import types

import numpy as np
import pytest

from conftest import REPO, mnist_or_skip
from mnist_cuda import optim
from mnist_cuda.compare import candidates as c
from mnist_cuda.compare.plot import MODE_COLOURS


def test_every_run_times_each_candidate_graphed_and_compiled_for_its_batch_alone():
    names = [x.name for x in c.chosen()]
    assert names == [
        "graph",
        "graph, channels_last",
        "compiled+graph",
        "compiled+graph, channels_last",
        "max-autotune+graph",
        "max-autotune+graph, channels_last",
        "eager",
    ]
    assert all(x.graph for x in c.chosen() if x.name != "eager")
    assert c.BY_NAME["max-autotune+graph, channels_last"].compile_mode == "max-autotune-no-cudagraphs"
    assert [x.name for x in c.chosen(no_autotune=True)] == names[:4] + ["eager"]
    assert [x.name for x in c.chosen(no_compile=True)] == names[:2] + ["eager"]
    alone = [x.name for x in c.chosen(compile_alone=True)]
    # "compiled" without a graph compiles last: no reset of TorchDynamo comes between it and its "again" run
    assert alone[-2:] == ["compiled", "eager"]
    assert {("torch", n) for n in c.NAMES} <= set(MODE_COLOURS)  # every candidate has its colour in the plot


def test_the_headline_takes_the_fastest_candidate_that_ran():
    modes = {
        "graph": {"median_us": 400.0},
        "compiled+graph": {"median_us": 290.0},
        "max-autotune+graph": {"error": "RuntimeError: no triton"},
        "eager": {"median_us": 2000.0},
    }
    assert c.fastest(modes)[0] == "compiled+graph"
    modes["max-autotune+graph, channels_last"] = {"median_us": 280.0}
    assert c.fastest(modes) == ("max-autotune+graph, channels_last", {"median_us": 280.0})
    with pytest.raises(ValueError):
        c.fastest({"graph": {"error": "x"}})


def test_the_outside_figure_flags_a_pytorch_slower_than_measured_independently():
    assert c.outside_check("NVIDIA H200", "fp32", 4096, 5500.0) == {"ceiling_us": 5840.0, "pass": True}
    assert c.outside_check("NVIDIA H200", "bf16", 512, 800.0) == {"ceiling_us": 755.0, "pass": False}
    assert c.outside_check("NVIDIA H200", "tf32", 64, 306.0)["pass"] is False  # PyTorch's own TF32 = its fp32
    assert c.outside_check("NVIDIA H100 80GB HBM3", "fp32", 64, 1.0) is None
    assert c.outside_check("NVIDIA H200", "fp32", 128, 1.0) is None


def fake_torch():
    """Just what CompileWatch reads: TorchDynamo's frame counters."""
    counters = collections.defaultdict(collections.Counter)
    return types.SimpleNamespace(_dynamo=types.SimpleNamespace(utils=types.SimpleNamespace(counters=counters)))


def test_recipe_modes_take_every_candidate_by_its_name():
    from argparse import ArgumentTypeError

    from mnist_cuda.compare.recipes import RECIPE_TORCH_MODES, recipe_modes

    assert recipe_modes(",".join(c.BY_NAME)) == tuple(c.BY_NAME)  # names with ", channels_last" too
    assert recipe_modes("graph, channels_last,eager") == ("graph, channels_last", "eager")
    assert set(RECIPE_TORCH_MODES) <= set(c.BY_NAME)
    for bad in ("channels_last", "graph,graph", "graph,,eager", "fast"):
        with pytest.raises(ArgumentTypeError):
            recipe_modes(bad)


def test_compile_watch_fails_a_candidate_that_compiles_again():
    torch = fake_torch()
    frames = torch._dynamo.utils.counters["frames"]
    frames["ok"] += 3  # earlier candidates' compiles
    watch = c.CompileWatch(torch)
    watch.expect_none("the timed steps")
    frames["ok"] += 1  # a guard failed: a recompile
    assert watch.since() == 1
    with pytest.raises(c.Recompiled, match="1 frame.*during the timed steps"):
        watch.expect_none("the timed steps")


def test_compile_watch_sees_a_real_recompile_at_another_batch_size():
    """With the CPU build of torch: a model compiled with dynamic=False compiles once per batch size, and the
    watch counts the second compile (what automatic dynamic shapes would turn into slower kernels)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager", dynamic=False)  # (TorchDynamo alone: no compiler needed)
    compiled(torch.randn(4, 8))
    watch = c.CompileWatch(torch)
    compiled(torch.randn(4, 8))
    watch.expect_none("a step of the same shape")
    compiled(torch.randn(16, 8))
    with pytest.raises(c.Recompiled):
        watch.expect_none("a step of another batch size")


@pytest.mark.parametrize(
    "flags",
    [
        dict(schedule="onecycle", momentum=0.9, nesterov=True, weight_decay=5e-4),
        dict(schedule="onecycle", anneal="linear", pct_start=0.25),
        dict(schedule="cosine"),
        dict(schedule="step", step_size=40, gamma=0.5),
    ],
)
def test_the_graphs_rate_table_is_torchs_scheduler_to_one_ulp(flags):
    """PyTorch's graph modes read each step's rate from a float32 table of its scheduler's rates: the same
    float32 rates its eager mode's scheduler sets, and ours (optim.Schedule) within 1 ulp."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from mnist_cuda.compare.torch_side import scheduler_rates

    steps = 300
    options = optim.options_from(flags, 0.05, steps)
    table = np.array(scheduler_rates(torch, options, steps), np.float32)
    opt, scheduler = options.torch_optimizer(torch, [torch.nn.Parameter(torch.zeros(1))])
    eager = []
    for _ in range(steps):
        eager.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert np.array_equal(table, np.array(eager, np.float32))
    ours = np.array([options.schedule.lr_at(0.05, t) for t in range(steps)], np.float32)
    ulps = np.abs(table.view(np.int32).astype(np.int64) - ours.view(np.int32))
    assert ulps.max() <= 1


def test_committed_results_give_pytorch_its_best():
    """Every committed comparison ran every candidate (none skipped), compiled each for its batch size alone
    with no recompile while timed, and finds PyTorch's fastest at or below the outside figure."""
    results = sorted((REPO / "benchmarks" / "results").glob("compare-*.json"))
    honest = [json.loads(p.read_text()) for p in results]
    honest = [(p, r) for p, r in zip(results, honest) if r["schema"] == "mnist_cuda.compare/2"]
    assert honest, "no comparison result of the current script is committed"
    for path, r in honest:
        assert not r["config"]["no_autotune"] and not r["config"]["no_compile"], path.name
        for batch, b in r["batch_sizes"].items():
            modes = b["torch"]["modes"]
            assert set(modes) >= {x.name for x in c.chosen()}, (path.name, batch)
            for name, m in modes.items():
                if c.BY_NAME[name].compiled and "error" not in m:
                    assert m["recompiles"] == 0 and m["frames_compiled"] >= 1, (path.name, batch, name)
            check = b["headline"].get("outside_check")
            assert check is None or check["pass"], (path.name, batch, check)


# ---- the graphed schedule on the GPU --------------------------------------------------------------------


@pytest.mark.gpu
def test_pytorch_graph_with_the_rate_on_the_device_trains_as_its_eager_mode():
    """PyTorch's whole-step graph with SGD's options (rate table, step counter and zero momentum buffers on the
    device) trains the losses its eager mode with torch's host-side scheduler trains, within the parity
    tolerance, from the same weights on the same batches; restarted, it trains them again."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    folder = mnist_or_skip()
    from mnist_cuda import cuda, data, reference
    from mnist_cuda.compare.parity import PARITY_TOL
    from mnist_cuda.compare.torch_side import TorchSide

    ds = data.load("mnist", folder, empty=cuda.pinned_empty, progress=False)
    y64 = ds.train_y.astype(np.int64)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = False
    steps, state = 120, reference.init_state_dict(0)
    options = optim.options_from(
        dict(schedule="onecycle", momentum=0.9, nesterov=True, weight_decay=5e-4), 0.0002, steps
    )
    order = np.random.default_rng(0).permutation(len(ds.train_x))
    idxs = [order[i * 64 : (i + 1) * 64] for i in range(steps)]
    losses = {}
    for name in ("eager", "graph", "graph again"):
        if name != "graph again":
            side = TorchSide(torch, state, 64, c.BY_NAME[name], (32, 64), 128, options, log_losses=True)
            side.prepare(ds.train_x, y64, order)
        side.restart(state, options)
        side.losses()
        for idx in idxs:
            side.step(ds.train_x, y64, idx)
        losses[name] = side.losses().astype(np.float64)
    assert np.abs(losses["graph"] - losses["eager"]).max() <= PARITY_TOL["first_50"]
    assert np.array_equal(losses["graph"], losses["graph again"])


# ---- one batch size's runs, with sides that only keep a clock ---------------------------------------------


class FakeEvent:
    def __init__(self, side):
        self.side, self.t = side, None

    def record(self):
        self.t = self.side.clock


class FakeSide:
    """A side whose steps cost `us` each on a clock its events read; fused SGD, nothing compiled."""

    name, fused, compile_s, frames_compiled = "torch", True, None, None

    def __init__(self, us, batch=4):
        self.us, self.batch, self.clock = us, batch, 0.0

    def step(self, x, y, idx, mode=None, phase_events=None, next_idx=None):
        for k, ev in enumerate(phase_events or []):
            ev.record()
            self.clock += self.us / 1000 / 6 if k < 5 else 0
        if not phase_events:
            self.clock += self.us / 1000

    def new_event(self):
        return FakeEvent(self)

    def event(self):
        ev = FakeEvent(self)
        ev.record()
        return ev

    def elapsed_ms(self, a, b):
        return b.t - a.t

    def synchronize(self):
        pass

    def prepare(self, x, y, order):
        pass

    def watch_recompiles(self):
        pass

    def check_no_recompile(self, during):
        pass


def timing_run(monkeypatch, torch_us: dict):
    """run_timing at batch 4 with our side at 50 us a step and PyTorch's candidates at torch_us[name] (a
    candidate missing from it fails to build)."""
    from mnist_cuda.compare import timing

    monkeypatch.setattr(timing, "OurSide", lambda *a, **k: FakeSide(50.0))

    def torch_side(torch, state, batch, candidate, *a, **k):
        if candidate.name not in torch_us:
            raise RuntimeError(f"no {candidate.name} here")
        side = FakeSide(torch_us[candidate.name])
        if candidate.compiled:
            side.compile_s, side.frames_compiled = 12.5, 2
        return side

    monkeypatch.setattr(timing, "TorchSide", torch_side)
    monkeypatch.setattr(timing, "speed_defaults", lambda torch: None)
    ds = types.SimpleNamespace(train_x=np.zeros((64, 1, 28, 28), np.uint8), train_y=np.zeros(64, np.int32))
    ds.train_y64 = ds.train_y.astype(np.int64)
    args = types.SimpleNamespace(
        seed=0,
        warmup=2,
        steps=20,
        timing_window=5,
        warmup_seconds=0.0,
        no_epoch=True,
        lr=0.05,
        kernels="fast",
        precision="fp32",
        no_compile=False,
        no_autotune=False,
        compile=False,
    )
    return timing.run_timing(None, ds, {}, args, (32, 64), 128, 4, lambda msg: None, device="NVIDIA H200")


def test_a_batch_size_reports_every_candidate_and_takes_the_fastest(monkeypatch):
    r = timing_run(monkeypatch, {"eager": 2000.0, "graph": 400.0, "compiled+graph, channels_last": 300.0})
    modes = r["torch"]["modes"]
    assert (
        modes["graph"]["median_us"] == pytest.approx(400.0)
        and "no max-autotune+graph" in modes["max-autotune+graph"]["error"]
    )
    h = r["headline"]
    assert h["torch_mode"] == "compiled+graph, channels_last" and h["speedup"] == pytest.approx(6.0)
    assert r["torch"]["again"]["median_us"] == pytest.approx(300.0) and r["ours"]["again"]["mode"] == "graph"
    assert "outside_check" not in h  # no outside figure at batch 4
    assert modes["compiled+graph, channels_last"]["compile_s"] == 12.5 and "compile_s" not in modes["graph"]


def test_a_batch_size_where_pytorch_cannot_run_is_one_clear_failure(monkeypatch):
    from mnist_cuda.compare.timing import RunFailed

    with pytest.raises(RunFailed, match="every PyTorch candidate failed .*no graph here"):
        timing_run(monkeypatch, {})
    with pytest.raises(RunFailed, match="eager could not be timed per phase"):
        timing_run(monkeypatch, {"graph": 400.0})
