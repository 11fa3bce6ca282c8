"""The comparison on one page (PNG): the whole step and the epoch of every mode on top (the headline), the
per-phase eager times and the parity run below."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..cli import precision_of, save_figure
from ..step import PHASES
from .candidates import CANDIDATES, EAGER
from .parity import PARITY_TOL
from .report import parity_words
from .timing import OUR_MODES

# Each side and mode has one colour in every panel: ours saturated and outlined, PyTorch's candidates shades
# of one blue-grey, darker for the candidates that do more to be fast. The order is the bars' order in a group.
_TORCH_SHADES = ("#c9d6e3", "#aabfd4", "#8ba7c5", "#6d90b5", "#5479a0", "#3f6389", "#2c4a6e", "#1c3352")
_TORCH_ORDER = (EAGER.name,) + tuple(c.name for c in CANDIDATES if c is not EAGER)
MODE_COLOURS = {
    ("ours", "eager"): "#f39c12",
    ("ours", "graph"): "#c0392b",
    **{("torch", name): shade for name, shade in zip(_TORCH_ORDER, _TORCH_SHADES)},
}
SIDE_NAMES = {"ours": "ours", "torch": "PyTorch"}


def _precision_words(result: dict) -> str:
    return {"fp32": "ours in fp32", "tf32": "ours with TF32 convolutions", "bf16": "ours with bf16 products"}[
        precision_of(result["config"])
    ]


def _plain_log_axis(ax, label_of):
    """A log y axis ticked at 1, 2 and 5 of each decade, labelled as plain numbers (10^3 makes the
    reader convert)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: label_of(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(axis="y", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)


def _us_label(v):
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _s_label(v):
    return f"{v:g}"


def _grouped_bars(ax, result, value_of, label_of):
    """One group of bars per batch size: ours' modes, then PyTorch's, each that value_of gives a number
    for (a mode that failed leaves no gap), its value written above it. Returns the tallest bar of each
    group."""
    bss = list(result["batch_sizes"])
    tallest = []
    for group, bs in enumerate(bss):
        r = result["batch_sizes"][bs]
        bars = []
        for side, modes in (("ours", OUR_MODES), ("torch", _TORCH_ORDER)):
            for mode in modes:
                m = r[side]["modes"].get(mode)
                if m is not None and "error" not in m and value_of(m) is not None:
                    bars.append((side, mode, value_of(m)))
        width = min(0.13, 0.84 / max(len(bars), 1))
        left = group - width * (len(bars) - 1) / 2
        for k, (side, mode, value) in enumerate(bars):
            ours = side == "ours"
            x = left + k * width
            ax.bar(
                x, value, width * 0.9, color=MODE_COLOURS[side, mode], edgecolor="black", linewidth=1.0 if ours else 0.0
            )
            ax.text(
                x,
                value * 1.06,
                label_of(value),
                ha="center",
                va="bottom",
                rotation=90,
                fontsize=7.5,
                fontweight="bold" if ours else "normal",
            )
        tallest.append(max((value for *_, value in bars), default=1.0))
    ax.set_xticks(range(len(bss)), [f"batch {bs}" for bs in bss])
    ax.tick_params(axis="x", length=0, labelsize=10)
    ax.set_xlim(-0.5, len(bss) - 0.5)
    return tallest


def plot(result, path: Path):
    """The comparison on one page, written atomically to path as a PNG: the whole step and the epoch of
    every mode on top (the headline), the per-phase eager times and the parity run below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bss = list(result["batch_sizes"])
    fig = plt.figure(figsize=(14, 8.5), layout="constrained")
    # a row of its own for the legend of both top panels: inside either it would cover bars, and a figure
    # legend "outside" the axes lands on the suptitle
    rows = fig.add_gridspec(3, 1, height_ratios=(0.1, 1.3, 1))
    legend_ax = fig.add_subplot(rows[0])
    legend_ax.set_axis_off()
    step_ax, epoch_ax = (fig.add_subplot(g) for g in rows[1].subgridspec(1, 2, width_ratios=(3, 2)))
    bottom = rows[2].subgridspec(1, len(bss) + 1)
    phase_axes = [fig.add_subplot(bottom[0, k]) for k in range(len(bss))]
    parity_ax = fig.add_subplot(bottom[0, len(bss)])

    # whole step: above each batch size's group, the speed-up of ours over PyTorch's fastest mode, placed
    # clear of the bars' rotated value labels
    tallest = _grouped_bars(step_ax, result, lambda m: m.get("median_us"), _us_label)
    _plain_log_axis(step_ax, _us_label)
    for group, bs in enumerate(bss):
        h = result["batch_sizes"][bs].get("headline")
        if h:
            above_labels = (group, tallest[group] * 2.2)
            step_ax.annotate(
                f"ours {h['ours_mode']}\nvs PyTorch {h['torch_mode']}",
                above_labels,
                ha="center",
                va="bottom",
                fontsize=8,
                linespacing=1.1,
            )
            step_ax.annotate(
                f"{h['speedup']:.2f}x faster",
                above_labels,
                xytext=(0, 20),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=12,
                fontweight="bold",
                color=MODE_COLOURS["ours", "graph"],
            )
    step_ax.set_ylim(top=max(tallest) * 6)
    step_ax.set_ylabel("median us per step (log)")
    torch_tf32 = any(r["torch"].get("tf32", {}).get("cudnn") for r in result["batch_sizes"].values())
    torch_bf16 = any(r["torch"].get("autocast") for r in result["batch_sizes"].values())
    step_ax.set_title(
        "whole training step, every mode"
        + (
            " (PyTorch under autocast(bfloat16))"
            if torch_bf16
            else " (PyTorch's convolutions in TF32, its default)"
            if torch_tf32
            else ""
        )
    )

    # one epoch's wall clock: permutation, gather, load and every step
    dataset = result["config"].get("dataset")
    epoch_ax.set_title(f"one epoch of the training set{f' ({dataset})' if dataset else ''}, wall clock")
    if any(
        m.get("epoch_s") is not None
        for r in result["batch_sizes"].values()
        for side in ("ours", "torch")
        for m in r[side]["modes"].values()
    ):
        tallest = _grouped_bars(epoch_ax, result, lambda m: m.get("epoch_s"), lambda v: f"{v:.3f}")
        _plain_log_axis(epoch_ax, _s_label)
        epoch_ax.set_ylim(top=max(tallest) * 3)
        epoch_ax.set_ylabel("seconds per epoch (log)")
    else:
        epoch_ax.set_axis_off()
        epoch_ax.text(0.5, 0.5, "no epoch runs (--no-epoch)", ha="center", va="center", transform=epoch_ax.transAxes)

    shown = {
        (side, mode)
        for r in result["batch_sizes"].values()
        for side in ("ours", "torch")
        for mode, m in r[side]["modes"].items()
        if "error" not in m
    }
    handles = [
        Patch(
            facecolor=MODE_COLOURS[key],
            edgecolor="black",
            linewidth=1.0 if key[0] == "ours" else 0.0,
            label=f"{SIDE_NAMES[key[0]]} {key[1]}",
        )
        for key in MODE_COLOURS
        if key in shown
    ]
    legend_ax.legend(handles=handles, loc="center", ncol=min(len(handles), 5), fontsize=9.5, frameon=False)

    for ax, bs in zip(phase_axes, bss):
        r = result["batch_sizes"][bs]
        xs = np.arange(len(PHASES))
        ax.bar(
            xs - 0.2,
            [r["torch"]["phases"][p]["median_us"] for p in PHASES],
            0.4,
            color=MODE_COLOURS["torch", "eager"],
            label="PyTorch eager",
        )
        ax.bar(
            xs + 0.2,
            [r["ours"]["phases"][p]["median_us"] for p in PHASES],
            0.4,
            color=MODE_COLOURS["ours", "eager"],
            edgecolor="black",
            linewidth=1.0,
            label="ours eager",
        )
        ax.set_xticks(xs, [p.replace("_", "\n") for p in PHASES], fontsize=8)
        _plain_log_axis(ax, _us_label)
        # headroom above the tallest bar for the legend
        ax.set_ylim(top=max(r[side]["phases"][p]["median_us"] for side in ("torch", "ours") for p in PHASES) * 3)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(f"batch {bs}: per phase, eager", fontsize=10)
    phase_axes[0].set_ylabel("median us (log)")
    phase_axes[0].legend(fontsize=8, loc="upper right")

    par = result.get("parity")
    if par:
        tol = par.get("tolerances", PARITY_TOL)
        ax = parity_ax
        ax.plot(
            par.get("losses_torch", []), color=MODE_COLOURS["torch", "compiled+graph"], linewidth=1.2, label="PyTorch"
        )
        ax.plot(par.get("losses_ours", []), "--", color=MODE_COLOURS["ours", "graph"], linewidth=1.2, label="ours")
        verdict = "PASS" if par["pass"] else "FAIL"
        ax.set_title(
            f"parity: loss per step, {verdict}",
            fontsize=10,
            color="black" if par["pass"] else MODE_COLOURS["ours", "graph"],
            fontweight="bold",
        )
        lr = f", lr {par['lr']}" if par.get("lr") is not None else ""
        ax.text(
            0.97,
            0.97,
            f"batch {par['batch_size']}{lr}, {parity_words(par)}\n"
            f"max |diff| {par['max_loss_diff']:.1e} (tol {tol['all']:.3g})",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=7.5,
        )
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, loc="lower left")
    else:
        parity_ax.set_axis_off()
        parity_ax.text(0.5, 0.5, "no parity run", ha="center", va="center", transform=parity_ax.transAxes)

    fig.suptitle(
        f"{result['env'].get('device', '?')}, {_precision_words(result)}: our CUDA training step against PyTorch's",
        fontsize=14,
        fontweight="bold",
    )
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
