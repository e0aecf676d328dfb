"""Every measured number the README and the documentation quote comes from a result file.

``python -m benchmarks.render_docs`` writes each measured number into a generated region
(``<!-- numbers:NAME -->`` ... ``<!-- /numbers -->``) from the files in ``benchmarks/results/``.
These tests fail when a region no longer matches its files, and when a number with a unit
(img/s, samples/s, a speed-up, %, ms, s, GiB, ...) stands outside a region, a code block or a
sample of the console without being one of the few settings and thresholds ``ALLOWED`` names.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks import render_docs
from benchmarks.render_docs import RenderError, Stat, ratio, render, spread, stat

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

GENERATED = re.compile(r"<!-- numbers:[a-z0-9-]+ -->.*?<!-- /numbers -->", re.S)
# Console samples are generated regions too: ``benchmarks/demo_record.py`` records a demo run's
# output, ``render_docs`` copies it (one code block, nothing else).
SAMPLE = re.compile(r"<!-- numbers:console(?:-[a-z]+)? -->\n(.*?)<!-- /numbers -->", re.S)
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.S | re.M)
NUMBER = re.compile(
    r"(?<![\w.,/-])[+-]?(\d[\d,]*(?:\.\d+)?)"
    r"(?:(x)|\s?(img/s|images/s|samples/s|items/s|TFLOP/s|GFLOP|ms|us|s|GiB|MiB|KiB|GB|%))"
    r"(?![\w/])"
)

ALLOWED: dict[str, str] = {
    # Settings, thresholds and defaults the pages explain, never measurements; each must still
    # be used somewhere (a test below), so the list stays as short as the pages need.
    "5 %": "cost_share's default, min_gain, the gc, data-wait and loader-gain thresholds",
    "10 %": "the judge's rank rule and noise floor, the loader's re-measure, a search margin",
    "15 %": "the judge's keep threshold (3x min_gain)",
    "25 %": "the shortcut gains and the loader plan's headroom",
    "30 %": "the data-wait share of the strong-evidence rule and of the early baseline",
    "40 %": "the busy-CPU threshold of a GPU host",
    "50 %": "the kernel-launch GPU-busy threshold",
    "60 %": "the busy-loader threshold",
    "90 %": "the compute and vram thresholds",
    "100 %": "the bound an MFU is never reported past",
    "3 %": "find_batch_size's and the inference batch search's tolerance",
    "20 %": "find_batch_size's memory margin",
    "3x": "min_gain's multiple in the judge",
    "4x": "the loader plan's cap on the CPU-budget multiple",
    "1.1x": "the inference pool's keep threshold for processes",
    "1.25x": "the consumption multiple the CPU-budget rule sizes for",
    "10x": "the inference pool's payback multiple for a process trial",
    "5 ms": "the demo's simulated read latency (--read-latency-ms' default)",
    "3 ms": "net_wallclock's simulated read latency, a benchmark parameter",
    "5 s": "the pack SIGKILL grace and the Ray connection timeout",
    "15 s": "tune_dataloader's time budget default and the forced Ray cancel",
    "30 s": "the compile trial's minimum budget",
    "1800 s": "maxtp bench --timeout's default",
    "2 GiB": "the host-RAM threshold for persistent workers",
    "2.5 GiB": "the inference pool's GPU memory headroom",
    "20 GiB": "a gpu_memory_gib example in the CLI page",
    "80 GiB": "the GPU size of the same example",
}


def _outside_generated(text: str) -> str:
    """``text`` without generated regions, console samples and code blocks."""
    for pattern in (GENERATED, SAMPLE, FENCE):
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return text


def _quoted(page: Path) -> list[tuple[int, str]]:
    """``(line, "number unit")`` for every number with a unit outside the generated parts."""
    text = _outside_generated(page.read_text())
    found = []
    for match in NUMBER.finditer(text):
        unit = match.group(2) or match.group(3)
        token = f"{match.group(1)}{unit}" if unit == "x" else f"{match.group(1)} {unit}"
        found.append((text.count("\n", 0, match.start()) + 1, token))
    return found


def test_every_generated_region_matches_the_committed_results() -> None:
    stale = render_docs.stale(ROOT, write=False)
    assert not stale, f"stale generated regions: {stale}; run `python -m benchmarks.render_docs`"


def test_every_number_with_a_unit_outside_a_generated_region_is_an_allowed_setting() -> None:
    unsourced = [
        f"{page.relative_to(ROOT)}:{line}: {token}"
        for page in PAGES
        for line, token in _quoted(page)
        if token not in ALLOWED
    ]
    assert not unsourced, (
        "numbers with no result file behind them (generate them with benchmarks/render_docs.py "
        "or, for a setting, add them to ALLOWED with the reason):\n" + "\n".join(unsourced)
    )


def test_every_allowed_number_is_still_quoted_somewhere() -> None:
    quoted = {token for page in PAGES for _, token in _quoted(page)}
    assert not set(ALLOWED) - quoted, f"drop from ALLOWED: {sorted(set(ALLOWED) - quoted)}"


def test_a_console_sample_holds_one_code_block_and_nothing_else() -> None:
    # A sample region is excluded from the check above, so prose must not hide in one.
    samples = [m.group(1) for page in PAGES for m in SAMPLE.finditer(page.read_text())]
    assert samples, "the README and the pages show the demo's console output"
    for sample in samples:
        assert FENCE.fullmatch(sample.strip()), sample[:200]


def test_every_region_the_script_renders_is_used_and_every_used_region_is_known() -> None:
    used = {
        name
        for page in PAGES
        for name in re.findall(r"<!-- numbers:([a-z0-9-]+) -->", page.read_text())
    }
    assert used == set(render_docs.REGIONS)


def test_gpu_figures_appear_only_as_targets() -> None:
    text = "\n".join(page.read_text() for page in PAGES)
    for figure in ("2,493", "5,036", "4,700"):
        for match in re.finditer(re.escape(figure), text):
            opened = text.rfind("<!-- numbers:", 0, match.start())
            closed = text.rfind("<!-- /numbers -->", 0, match.start())
            assert opened > closed, f"{figure} outside a generated region"
            assert text.startswith("<!-- numbers:gpu-", opened), f"{figure} outside the GPU ones"
    assert "target (not yet measured)" in text


def test_median_range_and_ratio_read_as_the_pages_print_them() -> None:
    assert spread(stat([1.0, 2.0, 3.0]), ".2f", "x", "runs") == (
        "median 2.00x (range 1.00x to 3.00x, 3 runs)"
    )
    assert spread(stat([-11.04, 3.0, -8.0]), "+.1f", "%") == (
        "median -8.0 % (range -11.0 to +3.0 %, 3 rounds)"
    )
    assert (
        spread(stat([1234.5]), ".1f", "img/s", note="commit abc")
        == "1,234 img/s (1 round, commit abc)"
    )
    per_round = Stat((0.69, 0.95, 1.10))
    assert ratio(stat([174.3]), stat([217.9]), per_round) == (
        "0.80x (ratio of the medians; per round 0.69x to 1.10x, 3 rounds)"
    )
    with pytest.raises(RenderError):
        stat([])


def _tree(tmp_path: Path) -> Path:
    """A repository with only what the ``gpu-reference`` region reads, and a README using it."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "benchmarks" / "targets.py", tmp_path / "benchmarks" / "targets.py")
    (tmp_path / "README.md").write_text(
        "# x\n\n<!-- numbers:gpu-reference -->typed by hand<!-- /numbers -->\n"
    )
    return tmp_path


def _words(root: Path) -> str:
    """The README of ``root`` with its wrapped lines joined."""
    return " ".join((root / "README.md").read_text().split())


def test_check_fails_on_a_stale_region_and_passes_once_it_is_rewritten(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert render_docs.main(["--check", "--root", str(root)]) == 1
    assert "typed by hand" in (root / "README.md").read_text(), "--check writes nothing"
    assert render_docs.main(["--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    assert "targets (not yet measured" in _words(root)
    assert render_docs.main(["--check", "--root", str(root)]) == 0
    assert render(text, root)[1] == [], "rendering twice changes nothing"


def test_a_committed_gpu_run_ends_the_not_yet_measured_label(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert render_docs.main(["--root", str(root)]) == 0
    assert "not yet measured" in _words(root)
    (root / "benchmarks" / "results" / "gpu" / "2027-01-01-compact").mkdir(parents=True)
    assert render_docs.main(["--check", "--root", str(root)]) == 1
    assert render_docs.main(["--root", str(root)]) == 0
    assert "not yet measured" not in _words(root)


def test_an_unknown_region_or_a_missing_result_is_an_error(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    with pytest.raises(RenderError, match="unknown region"):
        render("<!-- numbers:no-such -->x<!-- /numbers -->", root)
    with pytest.raises(RenderError, match="no such result file"):
        render("<!-- numbers:scoreboard -->x<!-- /numbers -->", root)
    (root / "README.md").write_text("<!-- numbers:no-such --><!-- /numbers -->\n")
    assert render_docs.main(["--check", "--root", str(root)]) == 2
