"""The package's layers: the core (data, the kernels' loader, the nets, the step, the optimizer, checkpoints,
the training loop) imports nothing of the commands, so a script or a test can use it without a command line
and a command's flags stay the command's business."""

import ast

from conftest import REPO

PACKAGE = REPO / "mnist_cuda"
# what the core must not import: the command lines (train's in five modules: the run, its flags, their
# checks, the models its lists make and the run of several), what they share (cli, and cli_types: the argument
# types), the comparison with PyTorch, and
# kernel_cases (every kernel's check against the reference, for the tests and the benchmarks, with a command
# line of its own)
NOT_CORE = {
    "cli",
    "cli_types",
    "train",
    "train_arguments",
    "train_setup",
    "model_grid",
    "train_many",
    "evaluate",
    "predict",
    "curves",
    "compare",
    "data_command",
    "kernel_cases",
}


def _module_name(path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _is_main_guard(node) -> bool:
    """`if __name__ == "__main__":`, where a core module that is also a command (python -m mnist_cuda.data)
    hands over to its command module when run as one, and only then."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _imports(tree, module: str):
    """(line, absolute name) of every module an import names, outside a __main__ guard; for `from X import
    Y` both X and X.Y, since Y may be a module."""
    package = module.split(".")[:-1]
    todo = [tree]
    while todo:
        node = todo.pop()
        if _is_main_guard(node):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else [])
            named = ".".join(p for p in (base, node.module) if p)
            yield node.lineno, named
            yield from ((node.lineno, f"{named}.{a.name}") for a in node.names)


def outer_imports(source: str, module: str) -> list[str]:
    """Where `source`, the text of `module`, imports a module outside the core."""
    return [
        f"{module}:{line} imports {name}"
        for line, name in _imports(ast.parse(source), module)
        if name.split(".")[0] == "mnist_cuda" and name.split(".")[1:2] and name.split(".")[1] in NOT_CORE
    ]


def test_the_core_imports_nothing_outside_it():
    core = [p for p in sorted(PACKAGE.rglob("*.py")) if _module_name(p).split(".")[1] not in NOT_CORE]
    assert {_module_name(p).removesuffix(".__init__") for p in core} >= {  # a package by its name (nets)
        f"mnist_cuda.{m}"
        for m in (
            "checkpoint",
            "optim",
            "data",
            "preprocess",
            "reference",
            "nets",
            "step",
            "cuda",
            "sizes",
            "paths",
            "training",
        )
    }
    found = [hit for p in core for hit in outer_imports(p.read_text(), _module_name(p))]
    assert found == [], "\n".join(found)


def test_every_way_of_naming_a_module_outside_the_core_is_found():
    for text in (
        "from . import cli",
        "from .cli import kind_of",
        "from mnist_cuda import train",
        "import mnist_cuda.compare.main",
        "def f():\n    from .evaluate import main",
        "from .. import curves",
    ):
        module = "mnist_cuda.ops.x" if text.startswith("from ..") else "mnist_cuda.x"
        assert outer_imports(text, module), text
    for text in (
        "from . import data, paths",
        "from .cuda import Source",
        "import argparse",
        "if __name__ == '__main__':\n    from mnist_cuda.data_command import main",
    ):
        assert outer_imports(text, "mnist_cuda.x") == [], text
