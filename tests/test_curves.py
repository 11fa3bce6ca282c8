"""Training curves from a metrics file (`python -m mnist_cuda.curves`, the trainer's --plot): CPU."""

import json
import os
import subprocess
import sys

import pytest
from test_cli import one_line_usage_error

from conftest import REPO

pytest.importorskip("matplotlib")


def run_curves(*args):
    return subprocess.run(
        [sys.executable, "-m", "mnist_cuda.curves", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


def write_metrics(path, epochs=3, steps=120):
    lines, step = [], 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps):
            step += 1
            lines.append({"step": step, "epoch": epoch, "loss": 2.3 / step**0.5})
        lines.append({"step": step, "epoch": epoch, "test_accuracy": 0.97 + 0.005 * epoch})
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def test_draws_a_png(tmp_path):
    import matplotlib.image

    metrics = write_metrics(tmp_path / "run.jsonl")
    r = run_curves(str(metrics))
    assert r.returncode == 0, r.stderr
    png = tmp_path / "run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width > 2 * height > 500
    r = run_curves(str(metrics), "--out", str(tmp_path / "other.png"), "--title", "a run")
    assert r.returncode == 0 and (tmp_path / "other.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.png", "run.jsonl", "run.png"]


def test_bad_input(tmp_path):
    one_line_usage_error(run_curves(str(tmp_path / "none.jsonl")), "METRICS", "does not exist")
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "epoch": 1, "loss": 1.0}\nnot json\n')
    one_line_usage_error(run_curves(str(tmp_path / "bad.jsonl")), "bad.jsonl line 2 is not a metrics record")
    (tmp_path / "acc.jsonl").write_text('{"step": 1, "epoch": 1, "test_accuracy": 0.9}\n')
    one_line_usage_error(run_curves(str(tmp_path / "acc.jsonl")), "holds no step losses")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    one_line_usage_error(run_curves(str(tmp_path / "binary.jsonl")), "not a text file")
    (tmp_path / "noepoch.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    one_line_usage_error(run_curves(str(tmp_path / "noepoch.jsonl")), "line 1 is not a metrics record")
    (tmp_path / "text.jsonl").write_text('{"step": 1, "epoch": 1, "loss": "low"}\n')
    one_line_usage_error(run_curves(str(tmp_path / "text.jsonl")), "line 1 is not a metrics record")
    metrics = write_metrics(tmp_path / "run.jsonl")
    one_line_usage_error(run_curves(str(metrics), "--out", str(tmp_path / "no" / "x.png")), "--out", "does not exist")
    named_png = write_metrics(tmp_path / "odd.png")  # the default output is never the metrics file itself
    assert run_curves(str(named_png)).returncode == 0 and (tmp_path / "odd.png.png").is_file()
    assert named_png.read_text().startswith('{"step": 1')
