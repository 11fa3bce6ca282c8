#!/usr/bin/env python3
"""The README's results table, generated from compare_pytorch.py's result files (never typed by hand).

    python scripts/results_table.py FILE.json [FILE.json ...]     # print the table
    python scripts/results_table.py --readme README.md             # rewrite the README's table

In the README the table stands between two marker lines; the first names the result files:
    <!-- results-table: benchmarks/results/A.json benchmarks/results/B.json -->
    ...
    <!-- results-table end -->

A row from a result of the earlier script (schema mnist_cuda.compare/1, which compiled PyTorch once for
every batch size and tried neither channels_last nor autotuning) is marked: its PyTorch is not at its best.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, installed or not
from mnist_cuda.cli import Parser, input_file, precision_of  # noqa: E402

PROG = "results_table.py"
# the table's rows per batch size, in this order
PRECISION_LABELS = {"fp32": "fp32", "tf32": "TF32 convolutions", "bf16": "bf16 (PyTorch: autocast)"}
SCHEMAS = {"mnist_cuda.compare/2": "current", "mnist_cuda.compare/1": "earlier"}
EARLIER = "†"
BEGIN = re.compile(r"^<!-- results-table: (.+) -->$")
END = "<!-- results-table end -->"


class TableError(Exception):
    """A result file that is missing, unreadable or not a comparison result, or a README without the markers."""


def load(path: Path) -> dict:
    try:
        result = json.loads(Path(path).read_text())
    except IsADirectoryError:
        raise TableError(f"{path} is a folder, not a result file") from None
    except FileNotFoundError:
        raise TableError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TableError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(result, dict) or result.get("schema") not in SCHEMAS:
        schema = result.get("schema") if isinstance(result, dict) else None
        raise TableError(f"{path} is not a compare_pytorch.py result (schema {schema!r})")
    return result


def _us(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}")


def _epoch(m: dict | None) -> str:
    return f"{m['epoch_s']:.3f}" if m and m.get("epoch_s") is not None else "-"


def table(results: list[dict]) -> str:
    """One row per batch size and precision: PyTorch eager, PyTorch's fastest candidate (named) and ours
    (whole-step medians, us), the speed-up against that fastest, and each side's epoch (s)."""
    devices = sorted({r["env"]["device"] for r in results})
    earlier = any(SCHEMAS[r["schema"]] == "earlier" for r in results)
    lines = [
        f"Whole training step, median us (load + forward + backward + update + zero-grad), and one epoch at "
        f"that batch size, s; {', '.join(devices)}:",
        "",
        "| batch | precision | PyTorch eager | PyTorch's fastest | its mode | **ours** (graph) | "
        "vs PyTorch's fastest | epoch: PyTorch's fastest / ours |",
        "|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    rows = []
    for r in results:
        precision = PRECISION_LABELS[precision_of(r["config"])]
        mark = EARLIER if SCHEMAS[r["schema"]] == "earlier" else ""
        for batch, b in r["batch_sizes"].items():
            torch_modes, ours, head = b["torch"]["modes"], b["ours"]["modes"], b["headline"]
            cells = [
                batch,
                precision,
                _us(torch_modes.get("eager", {}).get("median_us")),
                _us(head["torch_median_us"]) + mark,
                head["torch_mode"],
                f"**{_us(head['ours_median_us'])}**",
                f"{head['speedup']:.2f}x{mark}",
                f"{_epoch(torch_modes.get(head['torch_mode']))} / {_epoch(ours.get(head['ours_mode']))}",
            ]
            rows.append(
                (int(batch), list(PRECISION_LABELS.values()).index(precision), mark, "| " + " | ".join(cells) + " |")
            )
    lines += [row for *_, row in sorted(rows)]
    if earlier:
        lines += [
            "",
            f"{EARLIER} measured by the earlier script, which compiled PyTorch once for every batch size "
            "(recompiled with a symbolic batch dimension from the second one on) and tried neither "
            "channels_last nor autotuning: PyTorch was not at its best there, and the speed-up is overstated.",
        ]
    return "\n".join(lines)


def _blocks(readme: Path) -> tuple[list[str], int, int, list[Path]]:
    try:
        lines = readme.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"cannot read {readme}: {e}") from None
    try:
        begin = next(i for i, line in enumerate(lines) if BEGIN.match(line))
        end = lines.index(END, begin)
    except (StopIteration, ValueError):
        raise TableError(f"{readme} has no '<!-- results-table: FILES -->' ... '{END}' block") from None
    files = [readme.parent / f for f in BEGIN.match(lines[begin]).group(1).split()]
    return lines, begin, end, files


def update_readme(readme: Path) -> bool:
    """Rewrite the table between the markers from the files the first marker names; True if it changed."""
    from mnist_cuda.cli import write_atomic

    lines, begin, end, files = _blocks(readme)
    old = "\n".join(lines)
    new = "\n".join(lines[: begin + 1] + [table([load(f) for f in files])] + lines[end:])
    try:
        write_atomic(readme, lambda f: f.write(new.encode()))
    except OSError as e:
        raise TableError(f"cannot write {readme}: {e}") from None
    return new != old


def readme_table(readme: Path) -> tuple[str, str]:
    """(the table in the README, the table its result files give)."""
    lines, begin, end, files = _blocks(readme)
    return "\n".join(lines[begin + 1 : end]), table([load(f) for f in files])


def main(argv=None) -> int:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=input_file, help="result JSON files of scripts/compare_pytorch.py")
    p.add_argument(
        "--readme", type=input_file, default=None, help="rewrite this README's table from the files it names"
    )
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
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
