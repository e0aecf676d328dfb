"""The documentation: runnable snippets only, one metrics table, the README one screenful a section.

``mkdocs build --strict`` (in ``.ci/run``) fails on a broken link, a missing snippet or an API
reference it cannot resolve; these tests keep the rules it cannot see.
"""

from __future__ import annotations

import re
from pathlib import Path

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback, metrics

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"```python\n(.*?)```", re.S)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')
PAGES = sorted(DOCS.glob("*.md"))


def test_every_python_snippet_in_the_docs_is_an_example_script_included_whole() -> None:
    found = 0
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            lines = block.strip().splitlines()
            match = INCLUDE.match(lines[0]) if len(lines) == 1 else None
            assert match, f"{page.name}: a python block that is not an included example:\n{block}"
            path = ROOT / match.group(1)
            assert path.parts[len(ROOT.parts)] == "examples" and path.is_file(), (page, path)
            found += 1
    assert found >= 10


def test_the_metrics_table_is_written_once_and_every_docstring_lists_its_keys() -> None:
    import importlib.util

    page = (DOCS / "metrics.md").read_text()
    spec = importlib.util.spec_from_file_location("hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.MARK in page and "`maxtp/" not in page.replace(hooks.MARK, "")
    rendered = hooks.on_page_markdown(page)
    for metric in metrics.METRICS:
        assert f"| `{metric.key}` | {metric.where} | {metric.text} |" in rendered
        assert f"``{metric.key}``" in (MaxThroughputCallback.__doc__ or ""), metric.key
    for key in metrics.LOGGED:
        assert f"``{key}``" in (BottleneckMonitor.__doc__ or ""), key
    readme = (ROOT / "README.md").read_text()
    assert not [m.key for m in metrics.METRICS if f"`{m.key}`" in readme], "a copy in README"


def _outside_measured(text: str) -> str:
    """The text without its "Measured" sections (where the machine is part of the number)."""
    return re.sub(r"^## Measured.*?(?=^## |\Z)", "", text, flags=re.S | re.M)


def test_no_page_names_the_development_machine_a_date_or_an_issue() -> None:
    banned = re.compile(r"\b20\d\d-\d\d-\d\d\b|issue \[\d|2-core|development (?:VM|machine)")
    for page in [*PAGES, ROOT / "README.md"]:
        if page.name == "measured.md":
            continue
        hits = banned.findall(_outside_measured(page.read_text()))
        assert not hits, f"{page.name}: {hits}"


def test_the_readme_is_short_and_leads_with_install_and_the_one_line() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 250, len(lines)
    install = text.index("pip install")
    assert install < text.index("callbacks=[MaxThroughputCallback(") < text.index("## The two")
    assert "bash examples/demo.sh" in text and "bash .ci/run" in text
