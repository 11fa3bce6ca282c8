"""mnist_cuda/cli.py and cli_types.py: bad values and output paths are usage errors before any work (one
line, exit 2); results are written whole (mnist_cuda/paths.py)."""

import argparse
import errno
import json
import os

import pytest

from mnist_cuda import cli, paths


def test_batch_sizes():
    assert cli.batch_sizes("64,512") == [64, 512]
    for bad in ("", "0", "64,x", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.batch_sizes(bad)


def test_seed_range():
    assert cli.seed("0") == 0 and cli.seed(str(cli.SEED_MAX)) == cli.SEED_MAX
    for bad in ("-1", str(cli.SEED_MAX + 1), "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.seed(bad)


def test_output_path_is_checked_up_front(tmp_path):
    assert cli.output_path(str(tmp_path / "r.json")) == tmp_path / "r.json"
    with pytest.raises(argparse.ArgumentTypeError, match="folder"):
        cli.output_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        cli.output_path(str(tmp_path / "missing" / "r.json"))
    (tmp_path / "file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="not a folder"):
        cli.output_path(str(tmp_path / "file" / "r.json"))


def test_a_path_the_system_refuses_is_named_in_its_words(tmp_path):
    """A name too long or a loop of links is not a permission problem: the message is the system's."""
    long_name, loop = str(tmp_path / ("a" * 300 + ".npz")), tmp_path / "loop"
    loop.symlink_to(loop)
    too_long, looping = os.strerror(errno.ENAMETOOLONG), os.strerror(errno.ELOOP)
    assert paths.kind_of(long_name) == paths.kind_of(loop) == "unusable"
    cases = [
        (cli.output_path, long_name, too_long),
        (cli.output_path, str(loop), looping),
        (cli.output_path, str(loop / "m.npz"), looping),
        (cli.input_file, long_name, too_long),
        (cli.input_file, str(loop), looping),
        (cli.existing_dir, str(loop), looping),
    ]
    for check, text, words in cases:
        with pytest.raises(argparse.ArgumentTypeError) as e:
            check(text)
        assert str(e.value).endswith(f"{text}: {words}") and "permission" not in str(e.value), str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_path_unwritable_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
        cli.output_path(str(locked / "r.json"))


def test_write_json_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "r.json"
    cli.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_interrupted_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")

    def write(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        paths.write_atomic(path, write)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_parser_errors_are_one_line(capsys):
    p = cli.Parser(prog="prog")
    p.add_argument("--n", type=cli.int_at_least(1))
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "argument --n: must be at least 1" in err


def test_precision_flags_and_the_record_of_older_checkpoints():
    """--tf32 is --precision tf32; a checkpoint from before --precision records tf32 as a bool."""
    p = cli.Parser(prog="t")
    cli.add_precision_arguments(p, "default: fp32")
    assert p.parse_args([]).precision is None
    assert p.parse_args(["--tf32"]).precision == "tf32"
    assert p.parse_args(["--precision", "bf16"]).precision == "bf16"
    assert cli.precision_of({}) == "fp32" and cli.precision_of({"tf32": False}) == "fp32"
    assert cli.precision_of({"tf32": True}) == "tf32"
    assert cli.precision_of({"precision": "bf16", "tf32": True}) == "bf16"
