"""The knob registry agrees with everything that names knobs: the ``allow`` Literal, the docs'
knob tables (rendered from it), the docstrings of ``allow``, the diagnosis's recommendations;
and the sets the loop derives follow from each knob's declarations.

Nothing here lists the knobs by hand: a new knob passes when its declarations are consistent,
and a broken derivation fails whatever the knobs are."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import pytest

from lightning_maxtp.callbacks.max_throughput import MaxThroughputCallback
from lightning_maxtp.knobs import registry
from lightning_maxtp.knobs.base import BaseKnob
from lightning_maxtp.observe.diagnosis import BottleneckKind
from lightning_maxtp.observe.limit import DATA_KINDS
from lightning_maxtp.tuning.allow import Allow, math_knobs_for, resolve_allow
from lightning_maxtp.tuning.config import TuningConfig

ROOT = Path(__file__).resolve().parents[2]

ADVICE = {
    # Recommendations for the user that no knob carries out: not knob names.
    "activation checkpointing", "batch_size x accumulate_grad_batches", "data path",
    "dataset format", "dataset location", "devices", "jobs per GPU", "jobs per machine",
    "syncs per step", "torch.compile mode",
}  # fmt: skip


def test_the_literal_lists_the_registry_in_order() -> None:
    assert get_args(registry.MathKnob) == registry.MATH_KNOBS
    assert len(set(registry.MATH_KNOBS)) == len(registry.MATH_KNOBS)
    preset, names = get_args(Allow)
    assert get_args(preset) == ("safe", "all") and get_args(names)[0] is registry.MathKnob


def test_every_knob_declares_what_the_loop_reads() -> None:
    for knob in registry.KNOBS:
        assert issubclass(knob, BaseKnob) and knob.name and knob.reason, knob
        assert knob.preset in ("safe", "all") and knob.settle_steps >= 0
        assert set(knob.tried_for) <= set(registry.MATH_ORDER)
        assert not (knob.before_fit and knob.tried_for), f"{knob.name}: chosen before the fit"
        assert knob.changes, f"{knob.name}: the docs' knob table shows what it changes"
    assert registry.knob_class("compile").min_budget_s >= 30
    with pytest.raises(ValueError, match=r"unknown knob 'turbo'; the knobs are \("):
        registry.knob_class("turbo")


def test_the_derived_sets_follow_from_each_knobs_declarations() -> None:
    knobs = registry.KNOBS
    assert tuple(k.name for k in knobs) == registry.MATH_KNOBS
    assert tuple(k.name for k in knobs if k.preset == "safe") == registry.SAFE
    assert {k.name for k in knobs if k.guarded} == registry.GUARDED
    assert {k.name for k in knobs if not k.deterministic} == registry.NOT_DETERMINISTIC
    assert {k.name: k.devices for k in knobs if k.devices is not None} == registry.DEVICE_LIMITED
    assert registry.math_order(knobs) == registry.MATH_ORDER
    # What the declarations mean, for any knob: "safe" is same math, so never guarded; a watch
    # after a keep restores the guard's snapshot; every knob is tried somewhere or before the
    # fit; a device-limited knob names the devices.
    for knob in knobs:
        assert not (knob.preset == "safe" and knob.guarded), f"{knob.name}: safe yet rounds"
        assert not knob.watched or knob.guarded, f"{knob.name}: watched needs the guard"
        assert knob.tried_for or knob.before_fit, f"{knob.name}: never tried"
        assert not knob.named_only or knob.tried_for, f"{knob.name}: named for what?"
        assert knob.devices is None or knob.devices, f"{knob.name}: an effect on no device"
    assert registry.SAFE, "allow='safe' adds at least one knob beyond the loader's"


def test_each_kinds_order_holds_its_knobs_by_rank_then_registry_order() -> None:
    kinds = {str(kind) for kind in BottleneckKind}
    assert set(registry.MATH_ORDER) <= kinds - set(DATA_KINDS), "faster math cannot show there"
    for kind, order in registry.MATH_ORDER.items():
        declared = [k for k in registry.KNOBS if kind in k.tried_for]
        assert sorted(order) == sorted(k.name for k in declared), kind
        keys = [
            (registry.knob_class(n).tried_for[kind], registry.MATH_KNOBS.index(n)) for n in order
        ]
        assert keys == sorted(keys), f"{kind}: {order} is not by rank, then registry order"
        assert math_knobs_for(kind, registry.MATH_KNOBS[::-1]) == order, "allow's order is moot"
        assert math_knobs_for(kind, order[1:]) == order[1:]
    assert math_knobs_for("data_pipeline", registry.MATH_KNOBS) == ()


def _knob(name: str, tried_for: Mapping[str, int], before_fit: bool = False) -> type[BaseKnob]:
    """A knob class declaring only what ``math_order`` reads."""
    attrs: dict[str, Any] = {"name": name, "tried_for": tried_for, "before_fit": before_fit}
    return type(name.title(), (BaseKnob,), attrs)


def test_math_order_ranks_lower_first_and_breaks_ties_by_registry_order() -> None:
    a = _knob("a", {"compute": 1, "vram": 0})
    b = _knob("b", {"compute": 0})
    c = _knob("c", {"compute": 1})
    before = _knob("d", {}, before_fit=True)
    assert registry.math_order((a, b, c, before)) == {"compute": ("b", "a", "c"), "vram": ("a",)}
    assert registry.math_order((c, b, a)) == {"compute": ("b", "c", "a"), "vram": ("a",)}
    assert registry.math_order(()) == {}


def test_allow_resolves_to_the_sets_the_registry_derives() -> None:
    assert resolve_allow("safe") == registry.SAFE
    assert resolve_allow("all") == registry.MATH_KNOBS
    unsure = registry.GUARDED | registry.NOT_DETERMINISTIC
    assert resolve_allow("all", deterministic=True) == tuple(
        n for n in registry.MATH_KNOBS if n not in unsure
    )
    assert resolve_allow(registry.MATH_KNOBS[::-1]) == registry.MATH_KNOBS
    before_fit = [k.name for k in registry.KNOBS if k.before_fit]
    assert before_fit == [registry.BEFORE_FIT], "the one knob chosen before fit"
    assert registry.BEFORE_FIT in resolve_allow("safe", batch_size=True)


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def _rows(table: str) -> dict[str, list[str]]:
    """A rendered knob table's rows: the knob's name -> its other cells."""
    rows = {}
    for line in table.splitlines()[2:]:
        name, *cells = (c.strip() for c in line.strip("|").split(" | "))
        rows[name.strip("`")] = cells
    return rows


def test_the_docs_knob_table_is_rendered_from_each_knobs_attributes() -> None:
    hooks = _hooks()
    page = (ROOT / "docs" / "knobs.md").read_text()
    assert hooks.KNOBS_MARK in page and "| `compile` |" not in page, "a copy in the page"
    rows = _rows(hooks.knobs_table())
    assert list(rows) == list(registry.MATH_KNOBS)
    unsure = registry.GUARDED | registry.NOT_DETERMINISTIC
    for knob in registry.KNOBS:
        allow, changes, tried_for, trial = rows[knob.name]
        assert allow.startswith('`"safe"`') == (knob.name in registry.SAFE), knob.name
        assert ("deterministic" in allow) == (knob.name in unsure), knob.name
        assert changes == knob.changes.replace("``", "`")
        kinds = {k for k in knob.tried_for if k != "healthy" or "compute" not in knob.tried_for}
        shown = tried_for.removesuffix(", when the diagnosis names it").split(", ")
        assert set(shown) == (kinds or {"before training" if knob.before_fit else "-"})
        assert trial.startswith(knob.reason)
        assert ("numerics guard" in trial) == knob.guarded, knob.name
        assert ("watched" in trial) == knob.watched, knob.name
        assert (" only" in trial) == (knob.devices is not None), knob.name
    rendered = hooks.on_page_markdown(page)
    assert hooks.KNOBS_MARK not in rendered and "| `gc` |" in rendered


def test_the_readme_knob_table_has_a_row_per_knob_after_the_loaders() -> None:
    hooks = _hooks()
    rows = _rows(hooks.readme_knobs_table())
    holders = [what.strip("`") for what, _ in hooks.setting_rows()]
    assert list(rows) == holders + list(registry.MATH_KNOBS)
    shown = {name.strip("` ") for what, _ in hooks.setting_rows() for name in what.split(",")}
    assert shown == {k.name for k in registry.SETTINGS}, "a row per holder names each setting"
    readme = (ROOT / "README.md").read_text()
    assert hooks.readme_knobs_table() in readme, "stale: run `python docs/hooks.py`"


QUOTED = re.compile(r'``"?([\w.]+)"?``|"(\w+)"')
"""A name a docstring quotes: ````name````, ````"name"```` or ``"name"``."""


def test_the_allow_docstrings_point_to_the_registry_instead_of_listing_it() -> None:
    # A hand list of the knobs in a docstring drifts when a knob is added.
    field = _hooks().field_docstrings(TuningConfig)["allow"]
    doc = MaxThroughputCallback.__doc__ or ""
    (paragraph,) = [p for p in doc.split("\n\n") if p.strip().startswith("``allow``")]
    for text in (field, paragraph):
        assert "knobs.registry" in text, text
        listed = {a or b for a, b in QUOTED.findall(text)} & set(registry.MATH_KNOBS)
        assert not listed, f"knob names listed by hand: {sorted(listed)}"


def _recommended_names() -> tuple[set[str], set[str]]:
    """What the advice and triage recommend: ``(names spelled out, knob classes named)``."""
    spelled, classes = set(), set()
    paths = [*(ROOT / "lightning_maxtp" / "knobs").glob("advice*.py")]
    for path in [*paths, ROOT / "lightning_maxtp" / "triage.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "Recommendation"
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant):
                spelled.add(first.value)
            else:
                assert isinstance(first, ast.Attribute) and first.attr == "name", ast.unparse(first)
                classes.add(ast.unparse(first.value))
    return spelled, classes


def test_the_advice_recommends_knobs_by_their_classes_and_spells_out_only_advice() -> None:
    # A knob is recommended by its class's name (renaming it renames the recommendation); a
    # name spelled out is advice no knob carries out, never a knob's.
    spelled, classes = _recommended_names()
    assert {"Precision", "Compile", "NumWorkers"} <= classes  # the scan finds them
    known = {k.__name__ for k in (*registry.KNOBS, *registry.SETTINGS)}
    assert classes <= known, f"recommended under a class no registry line has: {classes - known}"
    assert spelled == ADVICE, f"spelled-out recommendations: {sorted(spelled ^ ADVICE)}"


def test_the_docs_setting_table_is_rendered_from_each_settings_attributes() -> None:
    hooks = _hooks()
    page = (ROOT / "docs" / "knobs.md").read_text()
    assert hooks.SETTINGS_MARK in page and "| `num_workers` |" not in page, "a copy in the page"
    rows = _rows(hooks.settings_table())
    assert list(rows) == [k.name for k in registry.SETTINGS]
    for knob in registry.SETTINGS:
        held, changes, also, why = rows[knob.name]
        assert held == {"loader": "train loader", "process": "main process"}[knob.holder]
        assert changes == knob.changes.replace("``", "`")
        assert ("with workers only" in also) == knob.needs_workers, knob.name
        assert ("max_workers" in also) == knob.counts_workers, knob.name
        assert (" only" in also.replace("with workers only", "")) == (knob.devices is not None)
        assert why == knob.reason
    assert hooks.SETTINGS_MARK not in hooks.on_page_markdown(page)
