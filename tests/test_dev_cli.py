"""dev/cli.py: bad batch sizes and output paths are usage errors before any work; results are written whole."""
import argparse
import json

import pytest

import cli  # dev/cli.py (conftest puts dev/ on sys.path)


def test_batch_sizes():
    assert cli.batch_sizes("64,512") == [64, 512]
    for bad in ("", "0", "64,x", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.batch_sizes(bad)


def test_output_path_is_checked_up_front(tmp_path):
    assert cli.output_path(str(tmp_path / "r.json")) == tmp_path / "r.json"
    with pytest.raises(argparse.ArgumentTypeError, match="folder"):
        cli.output_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        cli.output_path(str(tmp_path / "missing" / "r.json"))


def test_write_json_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "r.json"
    cli.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]
