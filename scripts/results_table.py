#!/usr/bin/env python3
"""The README's results tables, generated from compare_pytorch.py's result files (never typed by hand).

    python scripts/results_table.py FILE.json [FILE.json ...]     # print the results table
    python scripts/results_table.py --ladder FILE.json [...]      # print the whole-step ladder
    python scripts/results_table.py --readme README.md             # rewrite the README's tables

In the README each table stands between two marker lines; the first names the result files:
    <!-- results-table: benchmarks/results/A.json benchmarks/results/B.json -->
    ...
    <!-- results-table end -->
The whole-step ladder (between `<!-- step-ladder: FILES -->` and `<!-- step-ladder end -->`) takes our naive
kernels from a run with --kernels naive, and our fast kernels and PyTorch's modes from the fast runs.

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
KINDS = ("results-table", "step-ladder")  # the README's blocks; a README needs the first, may have the second


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


LADDER_ROWS = (  # (side, kernels, mode, words)
    ("ours", "naive", "eager", "ours: naive kernels, each launched from Python"),
    ("ours", "naive", "graph", "ours: naive kernels, the step as one CUDA graph"),
    ("ours", "fast", "eager", "ours: fast kernels, each launched from Python"),
    ("ours", "fast", "graph", "**ours: fast kernels, the step as one CUDA graph**"),
    ("torch", "fast", "eager", "PyTorch eager"),
    ("torch", "fast", "graph", "PyTorch, the step as one CUDA graph"),
    ("torch", "fast", "compiled+graph", "PyTorch torch.compile, in one CUDA graph"),
)


def step_ladder(results: list[dict]) -> str:
    """Per batch size that both a naive and a fast run timed: our naive and fast kernels, eager and as one graph,
    then PyTorch's modes and its fastest (from the fast run): us per step, one epoch's s, and each against ours."""
    by = {}
    for r in results:
        if precision_of(r["config"]) != "fp32":
            raise TableError("the whole-step ladder is in fp32; got a result in another precision")
        for batch, b in r["batch_sizes"].items():
            by.setdefault(int(batch), {})[r["config"]["kernels"]] = b
    batches = sorted(b for b, runs in by.items() if {"naive", "fast"} <= set(runs))
    if not batches:
        raise TableError("the whole-step ladder needs a --kernels naive and a fast result at one batch size")
    devices = sorted({r["env"]["device"] for r in results})
    lines = [
        f"Whole training step, fp32, median us, one epoch at that batch size, s, and the time against ours (fast "
        f"kernels, one graph); {', '.join(devices)}:",
        "",
        "| batch | what runs | us per step | epoch s | against ours |",
        "|---:|---|---:|---:|---:|",
    ]
    for batch in batches:
        runs = by[batch]
        ours = runs["fast"]["ours"]["modes"]["graph"]["median_us"]
        head = runs["fast"]["headline"]
        rows = list(LADDER_ROWS)
        if head["torch_mode"] not in ("eager", "graph", "compiled+graph"):
            rows.append(("torch", "fast", head["torch_mode"], f"PyTorch's fastest: {head['torch_mode']}"))
        for side, kernels, mode, words in rows:
            m = runs[kernels][side]["modes"].get(mode)
            if m is None or m.get("median_us") is None:
                continue
            cells = [str(batch), words, _us(m["median_us"]), _epoch(m), f"{m['median_us'] / ours:,.1f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _begin(kind: str):
    return re.compile(rf"^<!-- {kind}: (.+) -->$")


def _blocks(readme: Path, kind: str) -> tuple[list[str], int, int, list[Path]] | None:
    """(the README's lines, its `kind` block's first and last marker lines, the files it names); None where the
    README has no such block (an error for the results table)."""
    try:
        lines = readme.read_text().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"cannot read {readme}: {e}") from None
    begin, end = _begin(kind), f"<!-- {kind} end -->"
    try:
        first = next(i for i, line in enumerate(lines) if begin.match(line))
        last = lines.index(end, first)
    except (StopIteration, ValueError):
        if kind == KINDS[0] or any(begin.match(line) for line in lines):
            raise TableError(f"{readme} has no '<!-- {kind}: FILES -->' ... '{end}' block") from None
        return None
    files = [readme.parent / f for f in begin.match(lines[first]).group(1).split()]
    return lines, first, last, files


MAKERS = {"results-table": lambda results: table(results), "step-ladder": lambda results: step_ladder(results)}


def update_readme(readme: Path) -> bool:
    """Rewrite each table between its markers from the files its first marker names; True if any changed."""
    from mnist_cuda.cli import write_atomic

    old = readme.read_text() if readme.is_file() else None
    for kind in KINDS:
        if (block := _blocks(readme, kind)) is None:
            continue
        lines, first, last, files = block
        new = "\n".join(lines[: first + 1] + [MAKERS[kind]([load(f) for f in files])] + lines[last:])
        try:
            write_atomic(readme, lambda f, new=new: f.write(new.encode()))
        except OSError as e:
            raise TableError(f"cannot write {readme}: {e}") from None
    return readme.read_text() != old


def readme_table(readme: Path, kind: str = KINDS[0]) -> tuple[str, str]:
    """(the `kind` table in the README, the table its result files give)."""
    block = _blocks(readme, kind)
    if block is None:
        raise TableError(f"{readme} has no {kind} block")
    lines, first, last, files = block
    return "\n".join(lines[first + 1 : last]), MAKERS[kind]([load(f) for f in files])


def build_parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=input_file, help="result JSON files of scripts/compare_pytorch.py")
    p.add_argument(
        "--ladder", action="store_true", help="print the whole-step ladder of the files (a naive and a fast run)"
    )
    p.add_argument(
        "--readme", type=input_file, default=None, help="rewrite this README's table from the files it names"
    )
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if bool(args.files) == bool(args.readme):
        p.error("give result files, or --readme README.md (not both)")
    if args.ladder and args.readme:
        p.error("--ladder prints the ladder of the files given; --readme rewrites both of the README's tables")
    try:
        if args.readme:
            changed = update_readme(args.readme)
            print(f"{args.readme}: tables {'rewritten' if changed else 'unchanged'}")
        else:
            print((step_ladder if args.ladder else table)([load(f) for f in args.files]))
    except TableError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
