"""CONTRIBUTING's "How to add a knob", done in a copy of the tree: a throwaway knob in the four
files the walk-through names (its module, its lines in the registry, its test, a changelog
line) and the one command (``python docs/hooks.py``); then a short CPU fit in a fresh
interpreter that allows it by name must try it, step with it and put it back.

Before its registry lines the same copy refuses the name (``allow`` raises a ``ValueError``
naming it): the module alone is not a knob. When adding a knob needs another file or other
names than the walk-through says, this test fails, and the walk-through (or the registry) is
what to fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME, CLASS = "throwaway_flag", "ThrowawayFlag"

KNOB_MODULE = f'''\
"""``{NAME}``: a flag of this module, set and put back; nothing reads it but its test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from lightning_maxtp.knobs.base import BaseKnob, FitView

ON = False
"""The flag the knob switches."""
RESTORES = 0
"""How many times ``restore`` put the flag back."""


class {CLASS}(BaseKnob):
    name = "{NAME}"
    reason = "a throwaway flag"
    changes = "``ON`` of its module, put back when the fit ends"
    tried_for: ClassVar[Mapping[str, int]] = {{"compute": 0, "healthy": 0}}

    def __init__(self) -> None:
        self._was: bool | None = None

    def current(self, fit: FitView) -> bool:
        return ON

    def apply(self, fit: FitView, value: Any) -> None:
        global ON
        if self._was is None:
            self._was = ON
        ON = bool(value)

    def restore(self, fit: FitView) -> None:
        global ON, RESTORES
        if self._was is not None:
            ON, self._was = self._was, None
            RESTORES += 1
'''

KNOB_TEST = f"""\
from lightning_maxtp.knobs import {NAME}
from lightning_maxtp.knobs.{NAME} import {CLASS}


def test_it_is_set_read_back_undone_and_restored() -> None:
    knob, fit = {CLASS}(), None  # it reads nothing of the fit
    knob.apply(fit, True)
    assert knob.current(fit) is True
    knob.apply(fit, False)  # a reverted trial
    assert knob.current(fit) is False
    knob.apply(fit, True)  # a kept one: the fit's end puts the flag back
    knob.restore(fit)
    assert knob.current(fit) is False and {NAME}.RESTORES == 1
    knob.restore(fit)  # idempotent
    assert {NAME}.RESTORES == 1
"""

REFUSED = f"""\
from lightning_maxtp.tuning.config import TuningConfig
try:
    TuningConfig(allow=({NAME!r},))
except ValueError as err:
    print(err)
"""

FIT = f"""\
import json
import lightning.pytorch as pl
import lightning_maxtp
from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.knobs import {NAME}
from tests.helpers.models import ConvModel, image_loader


class Flagged(ConvModel):
    # The step sleeps, so the step, not the loader, sets the pace on a loaded machine.
    def __init__(self):
        super().__init__(step_sleep_s=0.02)
        self.flags = []

    def training_step(self, batch, batch_idx):
        self.flags.append({NAME}.ON)
        return super().training_step(batch, batch_idx)


pl.seed_everything(0, verbose=False)
cb = MaxThroughputCallback(warmup_steps=2, window_steps=8, tune_loader=False, max_trials=4,
                           verbose=False, sampler_interval_s=None, cost_share=None,
                           allow=({NAME!r},))
model = Flagged()
trainer = pl.Trainer(accelerator="cpu", max_steps=60, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
trainer.fit(model, image_loader())
print(json.dumps({{"package": lightning_maxtp.__file__, "trials": [t.to_dict() for t in cb.trials],
                  "stepped_with_it": any(model.flags), "on": {NAME}.ON,
                  "restores": {NAME}.RESTORES, "notes": cb.tuning.notes}}))
"""


def _python(tree: Path, *args: str) -> str:
    """``python args`` in ``tree`` with the copy first on the path; its stdout."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env=env,
        timeout=240,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"python {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _copy(tree: Path) -> dict[str, bytes]:
    """The package, the test helpers the fit needs, and what the walk-through edits or runs;
    each copied file's bytes, by its path in the tree."""
    shutil.copytree(
        ROOT / "lightning_maxtp",
        tree / "lightning_maxtp",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for path in (
        "tests/__init__.py",
        "tests/helpers/__init__.py",
        "tests/helpers/models.py",
        "tests/knobs/__init__.py",
        "tests/knobs/test_registry.py",
        "CHANGELOG.md",
        "README.md",
        "docs/hooks.py",
        "docs/knobs.md",
    ):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tree / path)
    return _files(tree)


def _files(tree: Path) -> dict[str, bytes]:
    """The tree's files (bytecode left out), by their paths in it."""
    files = (p for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in files}


def _insert(text: str, pattern: str, line: str) -> str:
    """``line`` inserted where ``pattern``'s one match ends."""
    matches = list(re.finditer(pattern, text, re.M))
    assert len(matches) == 1, f"the registry changed shape: {pattern!r} matches {len(matches)}"
    end = matches[0].end()
    return text[:end] + line + text[end:]


def _add_registry_lines(tree: Path) -> None:
    """Step 2: the class in ``KNOBS`` and its name in ``MathKnob`` (and the import they need)."""
    registry = tree / "lightning_maxtp" / "knobs" / "registry.py"
    text = registry.read_text()
    text = _insert(
        text,
        r"^from lightning_maxtp\.knobs\.tf32 import Tf32\n",
        f"from lightning_maxtp.knobs.{NAME} import {CLASS}\n",
    )
    text = _insert(
        text, r"^KNOBS: tuple\[type\[Knob\], \.\.\.\] = \(\n(?:    \w+,\n)+", f"    {CLASS},\n"
    )
    text = _insert(text, r'^MathKnob = Literal\[\n(?:    "\w+",\n)+', f'    "{NAME}",\n')
    registry.write_text(text)


def _add_changelog_line(tree: Path) -> None:
    """Step 4: a line under "Added" in the unreleased changes."""
    changelog = tree / "CHANGELOG.md"
    line = f"- `{NAME}`: a knob this test adds.\n"
    unreleased = r"^## \[Unreleased\]\n(?:.*\n)*?### Added\n"
    changelog.write_text(_insert(changelog.read_text(), unreleased, line))


def _changed(tree: Path, copied: dict[str, bytes]) -> list[str]:
    """The files of the tree that are new or differ from what was copied."""
    now = _files(tree)
    return sorted(rel for rel, data in now.items() if copied.get(rel) != data)


@pytest.mark.slow
def test_a_knob_added_as_contributing_says_is_tried_by_the_loop_and_put_back(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    copied = _copy(tree)
    # 1. Its module; 3. its test; 4. its changelog line.
    (tree / "lightning_maxtp" / "knobs" / f"{NAME}.py").write_text(KNOB_MODULE)
    (tree / "tests" / "knobs" / f"test_{NAME}.py").write_text(KNOB_TEST)
    _add_changelog_line(tree)
    # Without its registry lines the module is no knob: `allow` refuses the name.
    refused = _python(tree, "-c", REFUSED)
    assert f"unknown knob(s) [{NAME!r}]" in refused, refused
    # 2. Its lines in the registry; then the one command.
    _add_registry_lines(tree)
    four = {
        f"lightning_maxtp/knobs/{NAME}.py",
        "lightning_maxtp/knobs/registry.py",
        f"tests/knobs/test_{NAME}.py",
        "CHANGELOG.md",
    }
    assert set(_changed(tree, copied)) == four, "the walk-through names four files"
    assert "rewrote: README.md" in _python(tree, "docs/hooks.py")
    assert f"| `{NAME}` |" in (tree / "README.md").read_text()
    # Its test passes, and so do the registry's, which check the knobs' declarations and the
    # tables rendered from them, not a list of their names.
    tests = (f"tests/knobs/test_{NAME}.py", "tests/knobs/test_registry.py")
    _python(tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests)

    # On a loaded machine the loop's own time between steps can read as data wait, and tuning
    # stops on a data-bound diagnosis before any math knob: a second fit decides (as in
    # tests/callbacks/test_math_trials.py).
    (tree / "fit.py").write_text(FIT)
    out: dict[str, Any] = {}
    for _ in range(2):
        out = json.loads(_python(tree, "fit.py").strip().splitlines()[-1])
        if any(t["knob"] == NAME for t in out["trials"]):
            break
    assert Path(out["package"]).is_relative_to(tree), out["package"]  # the copy, not the checkout
    tried = [t for t in out["trials"] if t["knob"] == NAME]
    assert len(tried) == 1 and tried[0]["new"] is True, (out["trials"], out["notes"])
    assert out["stepped_with_it"], "the trial's steps ran with the flag on"
    assert out["restores"] == 1 and out["on"] is False, out  # put back when the fit ended
