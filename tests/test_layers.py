"""The Python packages form layers, each importing only those below it:

    shim          the runtime dir, an app's environment, the shared block
    processpool   MPS and the worker pool
    predictors    samples, profiling, models
    controlplane  the controller, its policies, the command line

Imports inside functions count too: a lazy import is still a dependency,
and a cycle hidden in a function is the one that bites at run time."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

LAYERS = ["shim", "processpool", "predictors", "controlplane"]


def imports_of(path: Path) -> set[str]:
    """Top-level package names a module imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_each_package_imports_only_the_layers_below_it():
    wrong = []
    for rank, pkg in enumerate(LAYERS):
        above = set(LAYERS[rank + 1:])
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad = imports_of(path) & above
            if bad:
                wrong.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(bad))}")
    assert not wrong, "layering broken:\n" + "\n".join(wrong)


def test_the_check_sees_a_lazy_import(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from controlplane import daemon\n    import predictors.train\n")
    assert imports_of(mod) == {"controlplane", "predictors"}
