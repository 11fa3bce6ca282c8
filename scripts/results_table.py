#!/usr/bin/env python3
"""The README's results table, generated from compare_pytorch.py's result files (never typed by hand).

    python scripts/results_table.py FILE.json [FILE.json ...]     # print the table
    python scripts/results_table.py --readme README.md             # rewrite the README's table

In the README the table stands between two marker lines; the first names the result files:
    <!-- results-table: benchmarks/results/A.json benchmarks/results/B.json -->
    ...
    <!-- results-table end -->
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from mnist_cuda.cli import precision_of  # noqa: E402 (the checkout's package, without installing it)

# the table's rows per batch size, in this order
PRECISION_LABELS = {"fp32": "fp32", "tf32": "TF32 convolutions", "bf16": "bf16 (PyTorch: autocast)"}
TORCH_MODES = (("eager", "eager"), ("graph", "CUDA graph"), ("compiled+graph", "compiled + graph"),
               ("compiled", "compiled"))
BEGIN = re.compile(r"^<!-- results-table: (.+) -->$")
END = "<!-- results-table end -->"


class TableError(Exception):
    """A result file that is missing or not a comparison result."""


def load(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TableError(f"cannot read {path}: {e}") from None
    if result.get("schema") != "mnist_cuda.compare/1":
        raise TableError(f"{path} is not a compare_pytorch.py result (schema {result.get('schema')!r})")
    return result


def _us(m: dict | None) -> str:
    if not m or m.get("median_us") is None:
        return "-"
    v = m["median_us"]
    return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"


def _epoch(m: dict | None) -> str:
    return f"{m['epoch_s']:.3f}" if m and m.get("epoch_s") is not None else "-"


def table(results: list[dict]) -> str:
    """One row per batch size and precision: every PyTorch mode's and our whole-step median (us), the
    epoch (s) of each side's fastest mode, and the speed-up against PyTorch's fastest."""
    devices = sorted({r["env"]["device"] for r in results})
    lines = [f"Whole training step, median us (load + forward + backward + update + zero-grad), and one "
             f"epoch at that batch size, s; {', '.join(devices)}:", "",
             "| batch | precision | " + " | ".join(f"PyTorch {name}" for _, name in TORCH_MODES)
             + " | **ours** (graph) | vs PyTorch's fastest | epoch: PyTorch's fastest / ours |",
             "|---:|---|" + "---:|" * (len(TORCH_MODES) + 3)]
    rows = []
    for r in results:
        precision = PRECISION_LABELS[precision_of(r["config"])]
        for batch, b in r["batch_sizes"].items():
            torch_modes, ours = b["torch"]["modes"], b["ours"]["modes"]
            head = b["headline"]
            cells = [batch, precision] + [_us(torch_modes.get(mode)) for mode, _ in TORCH_MODES]
            cells += [f"**{_us(ours.get(head['ours_mode']))}**", f"{head['speedup']:.2f}x",
                      f"{_epoch(torch_modes.get(head['torch_mode']))} / {_epoch(ours.get(head['ours_mode']))}"]
            rows.append((int(batch), list(PRECISION_LABELS.values()).index(precision), "| " + " | ".join(cells) + " |"))
    lines += [row for *_, row in sorted(rows)]
    return "\n".join(lines)


def update_readme(readme: Path) -> bool:
    """Rewrite the table between the markers from the files the first marker names; True if it changed."""
    text = readme.read_text()
    lines = text.split("\n")
    try:
        begin = next(i for i, line in enumerate(lines) if BEGIN.match(line))
        end = lines.index(END, begin)
    except (StopIteration, ValueError):
        raise TableError(f"{readme} has no '<!-- results-table: FILES -->' ... '{END}' block") from None
    files = [readme.parent / f for f in BEGIN.match(lines[begin]).group(1).split()]
    new = "\n".join(lines[:begin + 1] + [table([load(f) for f in files])] + lines[end:])
    readme.write_text(new)
    return new != text


def readme_table(readme: Path) -> tuple[str, str]:
    """(the table in the README, the table its result files give)."""
    lines = readme.read_text().split("\n")
    begin = next(i for i, line in enumerate(lines) if BEGIN.match(line))
    end = lines.index(END, begin)
    files = [readme.parent / f for f in BEGIN.match(lines[begin]).group(1).split()]
    return "\n".join(lines[begin + 1:end]), table([load(f) for f in files])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="result JSON files of scripts/compare_pytorch.py")
    p.add_argument("--readme", type=Path, default=None, help="rewrite this README's table from the files it names")
    args = p.parse_args(argv)
    if bool(args.files) == bool(args.readme):
        p.error("give result files, or --readme README.md (not both)")
    try:
        if args.readme:
            changed = update_readme(args.readme)
            print(f"{args.readme}: table {'rewritten' if changed else 'unchanged'}")
        else:
            print(table([load(f) for f in args.files]))
    except TableError as e:
        print(f"results_table: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
