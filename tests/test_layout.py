"""The package's layout is a contract: stages in layers, imports one way, no cycle, light imports.

Layers, lowest first: the leaf helpers (``_units``, ``_log``), ``resources`` (the probe),
``observe`` (windows, diagnosis, report), the stages built on them (``loader``, ``batch_size``,
``strategy``, ``pack``, ``inference``), ``data``, ``callbacks`` (the Lightning glue), ``bench``
(which times jobs with the callback), then the top level (``__init__``, ``cli``, ``_register``).
A module imports its own subpackage or lower layers only, at module level or inside a function;
imports under ``TYPE_CHECKING`` are free.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_maxtp"
LAYERS = {
    "_units": 0, "_log": 0,
    "resources": 1,
    "observe": 2,
    "loader": 3, "batch_size": 3, "strategy": 3, "pack": 3,
    "data": 4, "inference": 4,
    "callbacks": 5,
    "bench": 6,
    "__init__": 7, "cli": 7, "_register": 7,
}  # fmt: skip
SUBPACKAGES = sorted(k for k in LAYERS if (PACKAGE / k).is_dir())
MAX_MODULE_LINES = 360


def _module_name(path: Path) -> str:
    parts = ["lightning_maxtp", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _stage(module: str) -> str:
    """The subpackage a module belongs to; the top-level modules are one stage, ``__init__``."""
    parts = module.split(".")
    if len(parts) == 1 or LAYERS.get(parts[1]) == LAYERS["__init__"]:
        return "__init__"
    return parts[1]


def _runtime_imports(path: Path) -> set[str]:
    """Package modules ``path`` imports outside ``if TYPE_CHECKING:`` (any depth)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module.startswith("lightning_maxtp"):
                    for alias in child.names:
                        sub = f"{child.module}.{alias.name}"
                        found.add(sub if sub in MODULES else child.module)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("lightning_maxtp"))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


GRAPH = {name: _runtime_imports(path) for name, path in MODULES.items()}


def test_every_module_belongs_to_a_layer_and_stays_small() -> None:
    assert {_stage(m) for m in MODULES} <= set(LAYERS), sorted({_stage(m) for m in MODULES})
    too_long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines()))
                > MAX_MODULE_LINES}  # fmt: skip
    assert not too_long, f"split these modules (at most {MAX_MODULE_LINES} lines): {too_long}"
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "_log.py", "_register.py", "_units.py", "cli.py"]


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        stage = _stage(module)
        for target in targets:
            other = _stage(target)
            if other != stage and LAYERS[other] >= LAYERS[stage]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports must point to a lower layer:\n" + "\n".join(sorted(wrong))


def test_no_module_imports_its_own_package_init() -> None:
    # Inside a subpackage, importing the package itself runs its __init__, which imports the
    # module back: a cycle that only works while the __init__ happens to import things in order.
    wrong = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target != module and module.startswith(target + ".") and _stage(module) != "__init__"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    done: set[str] = set()
    path: list[str] = []

    def walk(module: str) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if not module.startswith(target + "."):  # a package imports its own modules
                walk(target)
        path.pop()
        done.add(module)

    for module in MODULES:
        walk(module)


@pytest.mark.parametrize("subpackage", [p for p in SUBPACKAGES if p != "callbacks"])
def test_subpackage_import_is_light(subpackage: str) -> None:
    code = (
        f"import sys, lightning_maxtp.{subpackage}\n"
        "print([m for m in ('torch', 'lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"lightning_maxtp.{subpackage} imports {out.stdout}"
