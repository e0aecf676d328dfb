"""The package's layout is a contract: stages in layers, imports one way, no cycle, light imports.

Layers, lowest first: the leaf helpers (``_units``, ``_log``), ``resources`` (the probe) and
``_compat`` (every private Lightning and torch access),
``observe`` (windows, diagnosis, report), the stages built on them (``loader``, ``batch_size``,
``strategy``, ``pack``, ``inference``), ``data``, ``knobs`` (one module per knob), ``tuning``
(the loop's decisions, pure), ``callbacks`` (the Lightning glue), ``bench``
(which times jobs with the callback), then the top level (``__init__``, ``cli``, ``triage``,
``_register``).
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
    "_units": 0, "_log": 0, "_checks": 0,
    "resources": 1, "_compat": 1,
    "observe": 2,
    "loader": 3, "batch_size": 3, "strategy": 3, "pack": 3,
    "data": 4, "inference": 4,
    "knobs": 5,
    "tuning": 6,
    "callbacks": 7,
    "bench": 8,
    "__init__": 9, "cli": 9, "_register": 9, "triage": 9,
}  # fmt: skip
SUBPACKAGES = sorted(k for k in LAYERS if (PACKAGE / k).is_dir())
LONG_MODULE_LINES = 500
"""A module longer than this says why in its docstring (a line starting "Long because")."""


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


def _runtime_imports(path: Path, *, typing: bool = False) -> set[str]:
    """Package modules ``path`` imports outside ``if TYPE_CHECKING:`` (any depth); with
    ``typing``, those inside it too."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if (
                not typing
                and isinstance(child, ast.If)
                and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
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
TYPED_GRAPH = {name: _runtime_imports(path, typing=True) for name, path in MODULES.items()}
"""The imports with those under ``if TYPE_CHECKING:`` too: a cycle hidden there is a cycle."""


def test_every_module_belongs_to_a_layer_and_a_long_one_says_why() -> None:
    assert {_stage(m) for m in MODULES} <= set(LAYERS), sorted({_stage(m) for m in MODULES})
    unexplained = {}
    for module, path in MODULES.items():
        text = path.read_text()
        lines = len(text.splitlines())
        doc = ast.get_docstring(ast.parse(text)) or ""
        if lines > LONG_MODULE_LINES and "Long because" not in doc:
            unexplained[module] = lines
    assert not unexplained, (
        f"over {LONG_MODULE_LINES} lines without a 'Long because ...' in the docstring (split "
        f"where a name helps, or say why it is one idea): {unexplained}"
    )
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == [
        "__init__.py", "_checks.py", "_log.py", "_register.py", "_units.py", "cli.py", "triage.py"
    ]  # fmt: skip


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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one (depth-first, in sorted order)."""
    done: set[str] = set()
    path: list[str] = []
    found: list[list[str]] = []

    def walk(module: str) -> None:
        if module in path:
            found.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if not module.startswith(target + "."):  # a package imports its own modules
                walk(target)
        path.pop()
        done.add(module)

    for module in MODULES:
        walk(module)
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_hidden_under_type_checking() -> None:
    # A type-only import back up the chain still ties the two modules together: neither can be
    # read, tested or moved without the other.
    cycles = _cycles(TYPED_GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


STEP_PATH = [
    "lightning_maxtp.callbacks.step_clock",
    "lightning_maxtp.callbacks.bottleneck_monitor",
    "lightning_maxtp.callbacks.journal",
    "lightning_maxtp.callbacks.math_trial",
    "lightning_maxtp.callbacks.tuner",
    "lightning_maxtp.callbacks.max_throughput",
]
"""One step's timing, from the clock up to the callback: each part returns what it found to
the one above it, which acts on it."""


def test_the_step_path_runs_one_way() -> None:
    # Nothing on the step path calls back into a part above it: no module imports one above it
    # (not even for types), and no constructor below the top takes a listener or its owner. A
    # window goes up as a return value; the owner acts on it, in turn.
    for i, module in enumerate(STEP_PATH):
        above = set(STEP_PATH[i + 1 :])
        assert not TYPED_GRAPH[module] & above, f"{module} imports {TYPED_GRAPH[module] & above}"
    for module in STEP_PATH[:-1]:
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                for arg in node.args.args + node.args.kwonlyargs:
                    shown = ast.unparse(arg.annotation) if arg.annotation else ""
                    listener = "Callable" in shown and "Window" in shown
                    assert not listener and "Tuner" not in shown, (
                        f"{module}: {arg.arg}: {shown} (return values up, not calls back)"
                    )
                    assert not arg.arg.startswith("on_"), f"{module}: a listener {arg.arg}"
    # Each part talks to the one below it, not through it: only the monitor reaches its clock
    # (the tuner once read the step log and closed windows two levels down).
    for module, path in MODULES.items():
        if module == "lightning_maxtp.callbacks.bottleneck_monitor":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "clock":
                owner = ast.unparse(node.value)
                assert "monitor" not in owner, f"{module}: {owner}.clock (ask the monitor)"
    # observe/ and tuning/ never receive a callbacks/ object, not even as a type.
    for module, targets in TYPED_GRAPH.items():
        if _stage(module) in ("observe", "tuning"):
            assert not [t for t in targets if _stage(t) == "callbacks"], module


def test_tuning_is_pure() -> None:
    # The loop's decisions are plain data in and out: no torch or lightning in any of its
    # modules, not even inside a function (the light-import test below covers import time).
    for module, path in MODULES.items():
        if not module.startswith("lightning_maxtp.tuning"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            heavy = [n for n in names if n.split(".")[0] in ("torch", "lightning")]
            assert not heavy, f"{module} imports {heavy}"
            # ...and reads no clock: ``now`` comes in as data, so the same inputs decide the
            # same (tests/tuning/test_tuning_loop.py holds that property).
            clock = [n for n in names if n == "time" or n.startswith("time.")]
            assert not clock, f"{module} imports {clock}: take `now` as an argument"


NAMES_THE_KNOBS = ("observe", "tuning", "callbacks", "bench", "__init__")
"""The loop, its diagnosis and report, ``maxtp bench``, triage and the rest of the top level:
none spells a knob's name. The stages below the knobs (``loader``, ``batch_size``,
``inference``...) spell torch's DataLoader and Lightning's own arguments, which the knobs wrap,
not the knobs; the knobs' advice is in ``knobs/`` and names each knob by its class."""

NOT_THE_KNOB = {
    ("lightning_maxtp.observe.window", "tf32"): "the TF32 dtype of a measured peak",
    ("lightning_maxtp.observe.report_rows", "gc"): "a window's garbage-collection measurements",
}
"""Strings there that equal a knob's name and mean something else."""


def _knob_names_spelled(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Where ``tree`` compares with, looks up or recommends a knob by its name spelled out.

    Comparisons (``==``, ``in``, either side, tuples and sets too), subscripts and ``.get``
    with a name, and a ``Recommendation`` whose knob (positional or ``knob=``) or ``also``
    spells one.
    """

    def spelled(node: ast.AST | None) -> list[str]:
        if node is None:
            return []
        return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]

    found = []
    for node in ast.walk(tree):
        hits: list[str] = []
        if isinstance(node, ast.Compare):
            hits = [n for side in (node.left, *node.comparators) for n in spelled(side)]
        elif isinstance(node, ast.Subscript):
            hits = spelled(node.slice)
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.endswith("Recommendation"):
                parts = [
                    *node.args[:1],
                    *(k.value for k in node.keywords if k.arg in ("knob", "also")),
                ]
                hits = [n for part in parts for n in spelled(part)]
            elif func.endswith(".get") and node.args:
                hits = spelled(node.args[0])
        found += [(node.lineno, name) for name in hits]
    return found


def test_no_module_outside_knobs_tests_or_recommends_a_knob_by_its_name() -> None:
    # A knob renamed or added changes knobs/ (and triage's imports of the classes it names)
    # only: the loop, the diagnosis and the report never compare a value with a knob's name,
    # look one up, nor recommend one spelled out; they read the registry's sets, a knob class's
    # ``name``, or an ``Advisor``'s answer.
    from lightning_maxtp.knobs.registry import KNOBS, SETTINGS

    names = {k.name for k in (*KNOBS, *SETTINGS)}
    found = [
        f"{module}:{line}: {name!r}"
        for module, path in MODULES.items()
        if _stage(module) in NAMES_THE_KNOBS
        for line, name in _knob_names_spelled(ast.parse(path.read_text()), names)
        if (module, name) not in NOT_THE_KNOB
    ]
    assert not found, found
    # The scan finds them: the recommendations the diagnosis made itself before the advice.
    before = (
        'Recommendation("num_workers", 0, 2, "", True)\nif knob in ("precision", "tf32"): pass\n'
    )
    before += 'Recommendation(knob="gc", current=0, proposed=1, reason="", auto_apply=True)\n'
    before += 'Recommendation("x", 0, 1, "", True, also=(("persistent_workers", True),))\n'
    before += 'workers = settings["num_workers"] or ctx.get("pin_memory")\n'
    hits = [name for _, name in _knob_names_spelled(ast.parse(before), names)]
    assert sorted(hits) == sorted(["num_workers", "precision", "tf32", "gc",
                                   "persistent_workers", "num_workers", "pin_memory"])  # fmt: skip


@pytest.mark.parametrize("subpackage", [p for p in SUBPACKAGES if p != "callbacks"])
def test_subpackage_import_is_light(subpackage: str) -> None:
    code = (
        f"import sys, lightning_maxtp.{subpackage}\n"
        "print([m for m in ('torch', 'lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"lightning_maxtp.{subpackage} imports {out.stdout}"


# Private names of other libraries the package may use outside ``_compat``: documented ones.
FOREIGN_PRIVATE_OK = {
    "_exit": "os._exit, documented: leave a forked child without running the parent's cleanup",
    "_SubParsersAction": "argparse: the documented type add_subparsers() returns",
}
_GETATTR_FAMILY = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names() -> set[str]:
    """Private names the package defines outside ``_compat``: its functions, classes, globals
    and the attributes it assigns on ``self``/``cls``."""
    names: set[str] = set()
    for module, path in MODULES.items():
        if module.startswith("lightning_maxtp._compat"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def _foreign_private_uses(path: Path, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("lightning_maxtp") or node.module == "__future__":
                continue
            parts = node.module.split(".")
            names = [a.name for a in node.names]
            if any(_private(p) for p in parts) or any(_private(n) for n in names):
                found.append(f"{where} from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(p) for p in alias.name.split(".")):
                    found.append(f"{where} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not on_self and node.attr not in own and node.attr not in FOREIGN_PRIVATE_OK:
                found.append(f"{where} {ast.unparse(node)}")
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            setter = isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
            args = node.args[1:2] if name in _GETATTR_FAMILY or setter else []
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
                target = node.func.value  # vars(obj).get("_name") / obj.__dict__.pop("_name")
                if (isinstance(target, ast.Call) and getattr(target.func, "id", "") == "vars") or (
                    isinstance(target, ast.Attribute) and target.attr == "__dict__"
                ):
                    args = node.args[:1]
            for arg in args:
                text = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(text, str) and _private(text) and text not in own:
                    found.append(f"{where} {ast.unparse(node)}")
    return found


def test_private_apis_of_other_libraries_only_in_compat() -> None:
    # Lightning's and torch's private names move between releases; ``_compat`` holds every
    # access, each behind a function with its own test (tests/compat), so an upgrade breaks in
    # one place. Our own private names (defined in the package) are free to use. Not seen here:
    # a subclass reading an inherited private attribute through ``self``; review catches those.
    own = _own_private_names()
    found = [
        use
        for module, path in MODULES.items()
        if not module.startswith("lightning_maxtp._compat")
        for use in _foreign_private_uses(path, own)
    ]
    assert not found, "use lightning_maxtp._compat for these:\n" + "\n".join(found)


MAX_FMT_SKIPS = 15


def test_the_formatter_lays_out_the_package() -> None:
    # Lines packed by hand (to stay under a line cap) cost readability; ``# fmt: skip`` is for a
    # table that reads better aligned, and there are few of those.
    skips = {m: n for m, p in MODULES.items() if (n := p.read_text().count("# fmt: skip"))}
    assert sum(skips.values()) <= MAX_FMT_SKIPS, f"`# fmt: skip` per module: {skips}"
