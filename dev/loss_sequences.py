#!/usr/bin/env python3
"""Record the metrics files of a fixed set of training runs, or compare two such recordings byte for byte.

    python dev/loss_sequences.py record DIR [--data-dir data/mnist]
    python dev/loss_sequences.py compare BEFORE AFTER        (each a recording folder or a bundle)
    python dev/loss_sequences.py bundle DIR FILE.jsonl       (a recording as one file, to commit)

A change that should not change what is computed (a refactor, a move of kernels between files, a new
launch wrapper) must leave every file identical. The runs go through the trainer's command line only,
so the same script records any two trees of the project. The cases: 600 steps at the defaults (seed 0)
for each kernel version, and the first 20 steps at batch 1, 7 and 1000 of a small model (channels 8,16,
hidden 33) for each version, which exercises partial tiles and odd batch sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mnist_cuda.cli import Parser, existing_dir, input_file, output_path, refuse_clashes, write_atomic

VERSIONS = {
    "naive": ["--kernels", "naive"],
    "fast": ["--kernels", "fast"],
    "tf32": ["--kernels", "fast", "--tf32"],
    "bf16": ["--kernels", "fast", "--precision", "bf16"],
}


def cases() -> dict[str, list[str]]:
    """{name: trainer flags} of every recorded run."""
    out = {}
    for version, flags in VERSIONS.items():
        out[f"{version}-defaults-600"] = flags + ["--steps", "600"]
        for batch in (1, 7, 1000):
            out[f"{version}-small-b{batch}-20"] = flags + [
                "--steps",
                "20",
                "--batch-size",
                str(batch),
                "--channels",
                "8,16",
                "--hidden",
                "33",
            ]
    return out


def record(out_dir: Path, data_dir: Path | None, only: str) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    failed = 0
    for name, flags in cases().items():
        if only and only not in name:
            continue
        cmd = (
            [
                sys.executable,
                "-m",
                "mnist_cuda.train",
                "--seed",
                "0",
                "--quiet",
                "--metrics",
                str(out_dir / f"{name}.jsonl"),
            ]
            + flags
            + (["--data-dir", str(data_dir)] if data_dir else [])
        )
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"loss_sequences: {name} exited with {rc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


class NotARecording(Exception):
    pass


def load(recording: Path) -> dict[str, bytes]:
    """{run file name: its bytes} of a recording folder, or of a bundle written by `bundle`."""
    if recording.is_dir():
        return {p.name: p.read_bytes() for p in sorted(recording.glob("*.jsonl"))}
    try:
        runs = [json.loads(line) for line in recording.read_text().splitlines() if line.strip()]
        return {r["run"]: r["metrics"].encode() for r in runs}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise NotARecording(f"{recording} is neither a recording folder nor a bundle") from None


def bundle(folder: Path, out: Path) -> int:
    runs = load(folder)
    if not runs:
        print(f"loss_sequences: no .jsonl files in {folder}", file=sys.stderr)
        return 2
    text = "".join(json.dumps({"run": name, "metrics": text.decode()}) + "\n" for name, text in runs.items())
    write_atomic(out, lambda f: f.write(text.encode()))
    print(f"{len(runs)} runs bundled in {out}")
    return 0


def compare(before: Path, after: Path) -> int:
    old, new = load(before), load(after)
    if not old:
        print(f"loss_sequences: no recorded runs in {before}", file=sys.stderr)
        return 2
    differ = 0
    for name, text in old.items():
        if name not in new:
            print(f"MISSING   {name}")
            differ += 1
            continue
        same = text == new[name]
        print(f"{'IDENTICAL' if same else 'DIFFERENT'} {name} ({len(text.splitlines())} lines)")
        differ += not same
    print(f"{len(old) - differ} of {len(old)} metrics files identical")
    return 1 if differ else 0


def recording(text: str) -> Path:
    """A recording folder or a bundle file."""
    return existing_dir(text) if Path(text).is_dir() else input_file(text)


def build_parser() -> Parser:
    p = Parser(prog="loss_sequences.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    r = sub.add_parser("record", help="run every case and write DIR/<case>.jsonl")
    r.add_argument("dir", type=Path, help="folder for the metrics files (created)")
    r.add_argument("--data-dir", type=existing_dir, default=None, help="the MNIST files (passed to the trainer)")
    r.add_argument("--only", default="", help="only the cases whose name contains this")
    c = sub.add_parser("compare", help="compare the metrics files of two recordings byte for byte")
    c.add_argument("before", type=recording, help="a recording folder or bundle")
    c.add_argument("after", type=recording, help="a recording folder or bundle")
    b = sub.add_parser("bundle", help="write the runs of a recording folder into one file")
    b.add_argument("dir", type=existing_dir, help="a recording folder")
    b.add_argument("file", type=output_path, help="the bundle to write (.jsonl)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.command == "record":
        return record(args.dir, args.data_dir, args.only)
    try:
        if args.command == "bundle":
            refuse_clashes(p, inputs=[("DIR", sorted(args.dir.glob("*.jsonl")))], outputs=[("FILE", args.file)])
            return bundle(args.dir, args.file)
        return compare(args.before, args.after)
    except NotARecording as e:
        p.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
