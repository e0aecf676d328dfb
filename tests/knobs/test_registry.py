"""The knob registry agrees with everything that names knobs: the ``allow`` Literal, the docs'
knob table, the diagnosis's recommendations, and the sets the loop used to spell out by hand."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from lightning_maxtp.callbacks.knobs import THREADS
from lightning_maxtp.knobs import registry
from lightning_maxtp.knobs.base import BaseKnob
from lightning_maxtp.loader.candidate import LOADER_KNOBS
from lightning_maxtp.tuning.allow import Allow, math_knobs_for, resolve_allow

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
    assert registry.knob_class("compile").min_budget_s >= 30
    with pytest.raises(ValueError, match=r"unknown knob 'turbo'; the knobs are \("):
        registry.knob_class("turbo")


def test_the_derived_sets_are_the_ones_the_loop_always_used() -> None:
    # Spelled out by hand before the registry; a change here changes what the loop tries.
    tried = ("precision", "channels_last", "tf32", "cudnn_benchmark", "compile", "fused_optimizer")
    assert {
        "compute": tried, "healthy": tried,
        "kernel_launch": ("compile", "fused_optimizer", "cudnn_benchmark"),
        "host_overhead": ("gc", "compile", "fused_optimizer"),
        "vram": ("precision",),
    } == registry.MATH_ORDER  # fmt: skip
    assert {"precision", "channels_last", "tf32", "compile", "fused_optimizer"} == registry.GUARDED
    assert registry.SAFE == ("cudnn_benchmark", "gc")
    assert {"cudnn_benchmark"} == registry.NOT_DETERMINISTIC
    assert {"tf32": {"cuda"}, "cudnn_benchmark": {"cuda"}} == registry.DEVICE_LIMITED
    assert resolve_allow("safe") == ("cudnn_benchmark", "gc")
    assert resolve_allow("all", deterministic=True) == ("gc", "batch_size")
    assert [k.name for k in registry.KNOBS if k.named_only] == ["gc"]
    assert math_knobs_for("kernel_launch", ("cudnn_benchmark", "compile")) == (
        "compile", "cudnn_benchmark",
    )  # fmt: skip


def _readme_table() -> dict[str, str]:
    """The documentation's knob table (docs/knobs.md): name -> its "tried for" column."""
    lines = (ROOT / "docs" / "knobs.md").read_text().splitlines()
    start = lines.index("| knob | what changes, mid-fit | tried for |") + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[-1]
    return rows


def test_the_docs_knob_table_has_a_row_per_knob_with_what_it_is_tried_for() -> None:
    table = _readme_table()
    assert list(table) == list(registry.MATH_KNOBS)
    for knob in registry.KNOBS:
        kinds = {k for k in knob.tried_for if k != "healthy"} or {"-"}
        assert set(table[knob.name].split(", ")) == kinds, knob.name


def _recommended_names() -> set[str]:
    names = set()
    for path in (ROOT / "lightning_maxtp" / "observe").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "Recommendation"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return names


def test_the_diagnosis_recommends_knobs_by_their_registry_names() -> None:
    names = _recommended_names()
    assert {"precision", "compile", "num_workers"} <= names  # the scan finds them
    unknown = names - set(registry.MATH_KNOBS) - set(LOADER_KNOBS) - {THREADS} - ADVICE
    assert not unknown, f"recommended under a name no knob has: {unknown}"
