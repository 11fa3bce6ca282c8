"""The timed runs at one batch size: our modes, then each of PyTorch's candidates, then each side's fastest
once more, and the headline: ours against PyTorch's fastest candidate, named, checked against the outside
figure where there is one."""

from __future__ import annotations

from .. import data
from .candidates import EAGER, chosen, fastest, outside_check
from .measure import measure_epoch, measure_loop, measure_phases
from .ours import OurSide
from .torch_side import TorchSide

OUR_MODES = ("eager", "graph")  # Step's modes timed as whole-step loops; its "phases" mode is timed per phase


def speed_defaults(torch):
    """PyTorch's defaults for speed: cuDNN picks its algorithms by timing them, and its convolutions run in
    TF32 (matmuls do not)."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False


class RunFailed(Exception):
    """A batch size at which PyTorch could not be timed at all: every candidate failed, or its eager run."""


def _error(e: Exception) -> dict:
    return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}


def run_timing(torch, ds, state, args, channels, hidden, batch, log, device="") -> dict:
    """Ours, then every PyTorch candidate, then each side's fastest again, at one batch size. Each side's
    whole-step loops come first (graph modes before eager), its per-phase runs after: other work earlier in
    the process (eager steps on another net of ours, per-phase runs) can make our step graph slower for the
    rest of the process (docs/performance.md); "again" shows by how much."""
    speed_defaults(torch)
    order = data.epoch_order(len(ds.train_x), args.seed, 0)

    def loop(side, mode, labels):
        return measure_loop(
            side, ds.train_x, labels, order, args.warmup, args.steps, mode, args.timing_window, args.warmup_seconds
        )

    ours, o = _time_ours(ds, state, args, channels, hidden, batch, order, loop, log)
    t, sides = _time_torch(torch, ds, state, args, channels, hidden, batch, order, loop, log)
    our_mode, torch_mode = fastest(o["modes"])[0], fastest(t["modes"])[0]
    o["again"] = _again(ours, our_mode, loop, ds.train_y, batch, log)
    t["again"] = _again(sides[torch_mode], torch_mode, loop, ds.train_y64, batch, log)
    return {
        "ours": o,
        "torch": t,
        "headline": _headline(o, t, our_mode, torch_mode, device, args.precision, batch, log),
    }


def _time_ours(ds, state, args, channels, hidden, batch, order, loop, log):
    ours = OurSide(state, batch, args.lr, args.kernels, channels, hidden, args.precision)
    o = {"modes": {}}
    for mode in ("graph", "eager"):
        log(f"batch {batch}: ours, whole step, {mode}")
        m = loop(ours, mode, ds.train_y)
        if not args.no_epoch:
            m["epoch_s"] = measure_epoch(ours, ds.train_x, ds.train_y, args.seed, mode)
        o["modes"][mode] = m
        log(f"batch {batch}: ours, {mode}: {m['median_us']:,.1f} us")
    o["modes"] = {mode: o["modes"][mode] for mode in OUR_MODES}
    log(f"batch {batch}: ours, per phase")
    o["phases"] = measure_phases(ours, ds.train_x, ds.train_y, order, args.warmup, args.steps)
    # (Step's "phases" mode: a CUDA graph per phase; the result keeps its key, "phase_graphs")
    o["phase_graphs"] = measure_phases(ours, ds.train_x, ds.train_y, order, args.warmup, args.steps, "phases")
    return ours, o


def _time_torch(torch, ds, state, args, channels, hidden, batch, order, loop, log):
    """Every candidate (one that fails on this machine is reported, not fatal), then eager per phase."""
    bf16 = args.precision == "bf16"
    t = {
        "modes": {},
        "tf32": {"cudnn": True, "matmul": False},
        "cudnn_benchmark": True,
        "autocast": "bfloat16" if bf16 else None,
        "optimizer": "SGD(fused=True)",
    }
    sides = {}
    for candidate in chosen(args.no_compile, args.no_autotune, args.compile):
        log(f"batch {batch}: torch, whole step, {candidate.name}")
        try:
            side = TorchSide(torch, state, batch, candidate, channels, hidden, args.lr, bf16=bf16)
            side.prepare(ds.train_x, ds.train_y64, order)
            m = loop(side, candidate.name, ds.train_y64)
            if not args.no_epoch:
                m["epoch_s"] = measure_epoch(side, ds.train_x, ds.train_y64, args.seed, candidate.name)
            side.check_no_recompile("the timed steps")
        except Exception as e:
            t["modes"][candidate.name] = _error(e)
            log(f"batch {batch}: torch, {candidate.name}: failed ({t['modes'][candidate.name]['error']})")
            continue
        if candidate.compiled:
            m.update(compile_s=side.compile_s, frames_compiled=side.frames_compiled, recompiles=0)
        if not side.fused:
            t["optimizer"] = "SGD(foreach)"
        t["modes"][candidate.name], sides[candidate.name] = m, side
        log(
            f"batch {batch}: torch, {candidate.name}: {m['median_us']:,.1f} us"
            + (f" (compiled in {side.compile_s:.1f} s)" if candidate.compiled else "")
        )
    if not sides:
        first = next(iter(t["modes"].values()), {}).get("error", "none was tried")
        raise RunFailed(f"batch {batch}: every PyTorch candidate failed (the first: {first})")
    log(f"batch {batch}: torch eager, per phase")
    try:
        eager = sides.get(EAGER.name) or TorchSide(torch, state, batch, EAGER, channels, hidden, args.lr, bf16=bf16)
        t["phases"] = measure_phases(eager, ds.train_x, ds.train_y64, order, args.warmup, args.steps)
    except Exception as e:
        raise RunFailed(f"batch {batch}: PyTorch eager could not be timed per phase ({_error(e)['error']})") from None
    return t, sides


def _again(side, mode, loop, labels, batch, log) -> dict:
    """The fastest mode of a side once more, after all of that side's runs (reported where it fails: the
    headline stands on the first measurement)."""
    log(f"batch {batch}: {side.name}, whole step, {mode}, again")
    watched = hasattr(side, "watch_recompiles")
    try:
        if watched:
            side.watch_recompiles()
        m = {"mode": mode, **loop(side, mode, labels)}
        if watched:
            side.check_no_recompile("the timed steps again")
        return m
    except Exception as e:
        return {"mode": mode, **_error(e)}


def _headline(o, t, our_mode, torch_mode, device, precision, batch, log) -> dict:
    torch_us, our_us = t["modes"][torch_mode]["median_us"], o["modes"][our_mode]["median_us"]
    headline = {
        "torch_mode": torch_mode,
        "torch_median_us": torch_us,
        "ours_mode": our_mode,
        "ours_median_us": our_us,
        "speedup": torch_us / our_us,
    }
    check = outside_check(device, precision, batch, torch_us)
    if check is not None:
        headline["outside_check"] = check
        if not check["pass"]:
            log(
                f"batch {batch}: WARNING: PyTorch's fastest here, {torch_us:,.1f} us, is slower than the outside "
                f"figure ({check['ceiling_us']:,.0f} us): PyTorch is not yet at its best in this run"
            )
    return headline
