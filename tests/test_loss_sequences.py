"""dev/loss_sequences.py: a bundled recording compares as its folder does, and a changed byte is found."""

import pytest

from conftest import DEV, REPO, load_script


@pytest.fixture(scope="module")
def loss_sequences():
    return load_script(DEV / "loss_sequences.py")


def test_bundle_round_trip_and_a_changed_byte(loss_sequences, tmp_path, capsys):
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    (folder / "b.jsonl").write_text('{"step": 1, "loss": 1.25}\n{"step": 1, "test_accuracy": 0.5}\n')
    assert loss_sequences.bundle(folder, tmp_path / "rec.jsonl") == 0
    assert loss_sequences.load(tmp_path / "rec.jsonl") == loss_sequences.load(folder)
    assert loss_sequences.compare(tmp_path / "rec.jsonl", folder) == 0
    (folder / "b.jsonl").write_text('{"step": 1, "loss": 1.25}\n{"step": 1, "test_accuracy": 0.6}\n')
    assert loss_sequences.compare(tmp_path / "rec.jsonl", folder) == 1
    assert "DIFFERENT b.jsonl" in capsys.readouterr().out


def test_the_committed_recording_reads(loss_sequences):
    runs = loss_sequences.load(REPO / "benchmarks" / "results" / "loss-sequences-h200.jsonl")
    assert set(runs) == {f"{name}.jsonl" for name in loss_sequences.cases()}
    assert len(runs["fast-defaults-600.jsonl"].splitlines()) == 601
