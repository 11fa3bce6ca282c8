"""The repository's promises: CI runs the README's test command."""
from conftest import REPO


def test_ci_runs_the_readme_test_command():
    lines = (REPO / "README.md").read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith("<!-- test-command"))
    assert lines[marker + 1] == "```"
    command = lines[marker + 2]
    assert "pytest tests/" in command
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci
