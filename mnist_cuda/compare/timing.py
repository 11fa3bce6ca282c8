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


def run_timing(torch, ds, state, args, channels, hidden, batch, log, device="") -> dict:
    speed_defaults(torch)
    order = data.epoch_order(len(ds.train_x), args.seed, 0)

    def loop(side, mode, labels):
        return measure_loop(side, ds.train_x, labels, order, args.warmup, args.steps, mode, args.timing_window,
                            args.warmup_seconds)

    # Each side's whole-step loops come first (graph modes before eager), its per-phase runs after: other
    # work earlier in the process (eager steps on another net of ours, per-phase runs) can make our step
    # graph slower for the rest of the process (docs/performance.md). Each side's fastest mode is measured
    # once more at the end ("again"), after all of its runs.
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

    bf16 = args.precision == "bf16"
    t = {"modes": {}, "tf32": {"cudnn": True, "matmul": False}, "cudnn_benchmark": True,
         "autocast": "bfloat16" if bf16 else None}
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
            if candidate.compiled:
                m.update(compile_s=side.compile_s, frames_compiled=side.frames_compiled, recompiles=0)
            sides[candidate.name] = side
            log(f"batch {batch}: torch, {candidate.name}: {m['median_us']:,.1f} us"
                + (f" (compiled in {side.compile_s:.1f} s)" if candidate.compiled else ""))
            t["optimizer"] = "SGD(fused=True)" if side.fused else "SGD(foreach)"
        except Exception as e:  # a candidate that fails on this machine is reported, not fatal
            m = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        t["modes"][candidate.name] = m
    log(f"batch {batch}: torch eager, per phase")
    eager = sides.get(EAGER.name) or TorchSide(torch, state, batch, EAGER, channels, hidden, args.lr, bf16=bf16)
    t["phases"] = measure_phases(eager, ds.train_x, ds.train_y64, order, args.warmup, args.steps)

    torch_mode, torch_m = fastest(t["modes"])
    our_mode, our_m = fastest(o["modes"])
    for d, side, mode, labels in ((o, ours, our_mode, ds.train_y), (t, sides[torch_mode], torch_mode, ds.train_y64)):
        log(f"batch {batch}: {side.name}, whole step, {mode}, again")
        try:
            if side is not ours:
                side.watch_recompiles()
            d["again"] = {"mode": mode, **loop(side, mode, labels)}
            if side is not ours:
                side.check_no_recompile("the timed steps again")
        except Exception as e:  # reported: the headline stands on the first measurement
            d["again"] = {"mode": mode, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    headline = {"torch_mode": torch_mode, "torch_median_us": torch_m["median_us"], "ours_mode": our_mode,
                "ours_median_us": our_m["median_us"], "speedup": torch_m["median_us"] / our_m["median_us"]}
    check = outside_check(device, args.precision, batch, torch_m["median_us"])
    if check is not None:
        headline["outside_check"] = check
        if not check["pass"]:
            log(f"batch {batch}: WARNING: PyTorch's fastest here, {torch_m['median_us']:,.1f} us, is slower than "
                f"the outside figure ({check['ceiling_us']:,.0f} us): PyTorch is not yet at its best in this run")
    return {"ours": o, "torch": t, "headline": headline}
