"""The repository's promises: CI runs the README's test command; the code speaks for itself, in the
present (no lab version tags, no pointers to notes or folders outside the repository)."""

import io
import re
import tokenize

from conftest import REPO

CODE_FOLDERS = ("kernels", "mnist_cuda", "scripts", "dev", "tests")
# A lab tag names an experiment of the development history: "v" and a one- or two-digit number, maybe a
# letter, as a word of its own. Sought in comments and strings only: in code such a word is an
# ordinary variable name (a vector's components, say).
LAB_TAG = re.compile(r"\bv[0-9]{1,2}[a-z]?\b")
# Written in pieces, so that this file does not match itself.
OUTSIDE = ("NOTES" + ".md", ".." + "/shared")
_CU_PROSE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)


def test_ci_runs_the_readme_test_command():
    lines = (REPO / "README.md").read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith("<!-- test-command"))
    assert lines[marker + 1] == "```"
    command = lines[marker + 2]
    assert "pytest tests/" in command
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci


def code_files():
    for folder in CODE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in (".py", ".cu", ".cuh") and "__pycache__" not in path.parts:
                yield path


def prose(path) -> list[tuple[int, str]]:
    """(line, text) of the comments and string literals of a Python or CUDA file."""
    text = path.read_text()
    if path.suffix == ".py":
        kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
        return [
            (tok.start[0], tok.string)
            for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type in kinds
        ]
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _CU_PROSE.finditer(text)]


def test_prose_finds_comments_and_strings():
    import tempfile
    from pathlib import Path

    tag, name = "v" + "17k", "v" + "1"  # (in pieces: this file is scanned too)
    with tempfile.TemporaryDirectory() as tmp:
        py, cu = Path(tmp) / "a.py", Path(tmp) / "a.cu"
        py.write_text(f'{name} = 2  # after {tag}\ns = "{tag}"\n')
        cu.write_text(f'float {name} = 0; // {tag}\n/* {tag}\n */ const char* s = "{tag}";\n')
        for path in (py, cu):
            found = [(line, m.group(0)) for line, text in prose(path) for m in LAB_TAG.finditer(text)]
            assert [t for _, t in found] == [tag] * (2 if path is py else 3), found


def test_no_lab_version_tags():
    found = [
        f"{path.relative_to(REPO)}:{line}: {m.group(0)}"
        for path in code_files()
        for line, text in prose(path)
        for m in LAB_TAG.finditer(text)
    ]
    assert found == []


def test_no_references_outside_the_repository():
    found = [
        f"{path.relative_to(REPO)}:{i}: {ref}"
        for path in code_files()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        for ref in OUTSIDE
        if ref in line
    ]
    assert found == []
    assert OUTSIDE[1] not in (REPO / "README.md").read_text()


def test_readme_results_table_is_generated_from_the_result_files():
    """The README's tables (the results and the whole-step ladder) are what scripts/results_table.py makes of the
    result files they name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", REPO / "scripts" / "results_table.py")
    results_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_table)
    in_readme, generated = results_table.readme_table(REPO / "README.md")
    assert in_readme == generated
    assert "| 64 |" in generated and "| 512 |" in generated and "| 4096 |" in generated
    in_readme, generated = results_table.readme_table(REPO / "README.md", "step-ladder")
    assert in_readme == generated
    for batch in (64, 512):
        rows = ("naive kernels, each launched", "naive kernels, the step as one", "fast kernels, each", "PyTorch")
        for words in rows:
            assert any(line.startswith(f"| {batch} |") and words in line for line in generated.splitlines()), words


def test_results_table_reports_a_bad_file_in_one_line(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "other"}')
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "results_table.py"), str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a compare_pytorch.py result" in r.stderr


def test_performance_docs_show_the_committed_step_times():
    """docs/performance.md's table of current whole-step figures (section 2) shows, for each batch size, our step in
    each precision, PyTorch's fastest and the ratios of the committed comparison results
    (benchmarks/results/compare-h200-P-B.json), so a new comparison cannot leave a stale figure there."""
    import json
    import re

    text = (REPO / "docs" / "performance.md").read_text()
    rows = {}
    for line in text.split("\n"):
        m = re.match(r"\| (64|512|4096) \| ([\d,.]+) us \| ([\d,.]+) us \| ([\d,.]+) us \| (.+) us \| (.+) \|$", line)
        if m:
            rows[int(m.group(1))] = m.groups()[1:]
    assert set(rows) == {64, 512, 4096}

    def shown(cell: str, value: float) -> bool:
        cell = cell.strip().rstrip("x").replace(",", "")
        decimals = len(cell.split(".")[1]) if "." in cell else 0
        return float(cell) == round(value, decimals)

    for batch, (fp32, tf32, bf16, torch_cells, ratio_cells) in rows.items():
        torch_cells, ratio_cells = torch_cells.split(" / "), ratio_cells.split(" / ")
        for i, (precision, ours_cell) in enumerate((("fp32", fp32), ("tf32", tf32), ("bf16", bf16))):
            path = REPO / "benchmarks" / "results" / f"compare-h200-{precision}-{batch}.json"
            result = json.loads(path.read_text())["batch_sizes"][str(batch)]
            ours = result["ours"]["modes"]["graph"]["median_us"]
            fastest = min(m["median_us"] for mode, m in result["torch"]["modes"].items() if mode != "eager")
            assert shown(ours_cell, ours), (batch, precision, ours_cell, ours)
            assert shown(torch_cells[i], fastest), (batch, precision, torch_cells[i], fastest)
            assert shown(ratio_cells[i], fastest / ours), (batch, precision, ratio_cells[i], fastest / ours)
