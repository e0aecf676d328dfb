"""The documentation: runnable snippets only, one metrics table, the README one screenful a section.

``mkdocs build --strict`` (in ``.ci/run``) fails on a broken link, a missing snippet or an API
reference it cannot resolve; these tests keep the rules it cannot see.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback, metrics
from lightning_maxtp.tuning.config import TuningConfig

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


def _hooks() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_callback_page_gives_every_argument_with_the_codes_default() -> None:
    hooks = _hooks()
    page = (DOCS / "callback.md").read_text()
    assert hooks.ARGUMENTS_MARK in page and "| `warmup_steps` |" not in page, "a copy in the page"
    rendered = hooks.on_page_markdown(page)
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \| `([^`]*)` \| (.*) \|$", rendered, re.M)
    shown = {name: default for name, _, default, _ in rows}
    signature = inspect.signature(MaxThroughputCallback).parameters
    assert list(shown) == list(signature), "every argument, in the signature's order"
    assert shown == {name: repr(p.default) for name, p in signature.items()}
    # The loop's settings: the callback's defaults are TuningConfig's, and so is the text.
    fields = {f.name: f.default for f in dataclasses.fields(TuningConfig)}
    assert {k: shown[k] for k in fields} == {k: repr(v) for k, v in fields.items()}
    texts = {name: text for name, _, _, text in rows}
    assert all(texts.values()), [n for n, t in texts.items() if not t]
    assert not [n for n, t in texts.items() if "same default" in t]
    assert texts["time_budget_s"] == "No trial starts after this many seconds of tuning."


def test_the_api_reference_shows_the_callbacks_real_defaults_and_texts() -> None:
    import griffe

    extensions = griffe.load_extensions(f"{DOCS / 'griffe_defaults.py'}:RealDefaults")
    package = griffe.load(
        "lightning_maxtp", search_paths=[str(ROOT)], docstring_parser="google",
        extensions=extensions,
    )  # fmt: skip
    callback = package["callbacks.max_throughput.MaxThroughputCallback"]
    defaults = {p.name: str(p.default) for p in callback["__init__"].parameters}
    signature = inspect.signature(MaxThroughputCallback).parameters
    assert {n: defaults[n] for n in signature} == {n: repr(p.default) for n, p in signature.items()}
    assert "same default" not in callback.docstring.value
    assert "- docs/griffe_defaults.py:RealDefaults" in (ROOT / "mkdocs.yml").read_text()


def test_every_public_name_has_its_entry_in_the_api_reference() -> None:
    import importlib

    import lightning_maxtp

    page = (DOCS / "api.md").read_text()
    entries = re.findall(r"^::: ([\w.]+)$", page, re.M)
    documented = {}
    for path in entries:
        module, name = path.rsplit(".", 1)
        documented[name] = getattr(importlib.import_module(module), name)
    public = [name for name in lightning_maxtp.__all__ if name != "__version__"]
    missing = [name for name in public if name not in documented]
    assert not missing, f"add a `::: module.Name` entry to docs/api.md for {missing}"
    wrong = [n for n in public if documented[n] is not getattr(lightning_maxtp, n)]
    assert not wrong, f"docs/api.md documents another object under these names: {wrong}"
    assert "`lightning_maxtp.__version__`" in page


GPU_RESULTS = ROOT / "benchmarks" / "results" / "gpu"
NOT_MEASURED = "Not yet measured on a GPU"


def test_the_not_measured_on_a_gpu_notice_stays_exactly_until_a_gpu_result_exists() -> None:
    results = sorted(
        p.relative_to(ROOT)
        for p in (GPU_RESULTS.rglob("*") if GPU_RESULTS.is_dir() else [])
        if p.is_file() and p.name not in ("README.md", ".gitkeep")
    )
    for page in (ROOT / "README.md", DOCS / "index.md"):
        shown = NOT_MEASURED in page.read_text()
        if results:
            assert not shown, (
                f"{page.name} says '{NOT_MEASURED}' but {results[0]} is a GPU result: replace "
                "the notice with what the GPU run measured"
            )
        else:
            assert shown, (
                f"{page.name}: nothing under benchmarks/results/gpu/ yet, so the page must say "
                f"'{NOT_MEASURED}' (its GPU figures are targets)"
            )


def test_the_readmes_knob_table_is_the_one_the_hook_renders_from_the_registry() -> None:
    # GitHub shows the README raw, so its table is committed text: stale once a knob changes.
    hooks = _hooks()
    assert hooks.main(["--check"]) == 0, "stale knob table: run `python docs/hooks.py`"
    region = hooks.README_REGION.search((ROOT / "README.md").read_text())
    assert region and "| `compile` |" in region.group(2)


def test_the_knob_table_check_fails_when_stale_and_passes_once_rewritten(tmp_path: Path) -> None:
    hooks = _hooks()
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n<!-- maxtp:knobs-readme -->typed by hand<!-- /maxtp:knobs-readme -->\n"
    )
    assert hooks.main(["--check", "--root", str(tmp_path)]) == 1
    assert "typed by hand" in readme.read_text(), "--check writes nothing"
    assert hooks.main(["--root", str(tmp_path)]) == 0
    assert hooks.readme_knobs_table() in readme.read_text()
    assert hooks.main(["--check", "--root", str(tmp_path)]) == 0, "rendering twice changes nothing"
    readme.write_text("# no region\n")
    assert hooks.main(["--check", "--root", str(tmp_path)]) == 2
