"""The measured peak: a CPU matmul microbenchmark, its cache, and ``maxtp inspect --peak``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_maxtp.resources import peak as peak_mod
from lightning_maxtp.resources.peak import Peak, PeakRate, cache_path, measure_peak


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "lightning_maxtp" / "peaks.json"


@pytest.mark.serial  # two timings compared: the machine to itself
def test_the_cpu_peak_is_positive_and_repeatable() -> None:
    first = measure_peak("cpu", cache=False, seconds_per_size=0.05)
    second = measure_peak("cpu", cache=False, seconds_per_size=0.05)
    a, b = first.rate("fp32"), second.rate("fp32")
    assert a is not None and b is not None and a > 0 and b > 0
    assert 0.5 < a / b < 2.0, (a, b)
    assert [r.dtype for r in first.rates] == ["fp32"] and not first.cached
    assert "thread(s)" in first.device and first.key.startswith("cpu|")


def test_the_peak_is_cached_per_device_and_refreshed_on_request(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cache_path() == cache
    measured = measure_peak("cpu", seconds_per_size=0.01)
    assert cache.exists() and not measured.cached

    def no_measuring(*args: object) -> float:
        raise AssertionError("measured although cached")

    monkeypatch.setattr(peak_mod, "matmul_rate", no_measuring)
    cached = measure_peak("cpu")
    assert cached.cached and cached.rates == measured.rates and cached.key == measured.key
    with pytest.raises(AssertionError, match="measured although cached"):
        measure_peak("cpu", refresh=True)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"version": 2, "peaks": []}',
        '{"version": 1, "peaks": {}}',  # measured the old way: a window's mean
        '{"version": 99}',
        "[]",
    ],
)
def test_a_corrupt_cache_is_ignored_with_a_warning(
    cache: Path, content: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    monkeypatch.setattr(peak_mod, "matmul_rate", lambda *a: 1e9)
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp.resources.peak"):
        peak = measure_peak("cpu")
    assert peak.rate("fp32") == 1e9 and not peak.cached
    assert "ignoring the peak cache" in caplog.text
    assert json.loads(cache.read_text())["version"] == peak_mod._CACHE_VERSION, "rewritten whole"


def test_a_cached_entry_with_no_rate_is_measured_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(peak_mod, "matmul_rate", lambda *a: 2e9)
    key = measure_peak("cpu").key
    entry = {"device": "x", "rates": []}
    cache.write_text(json.dumps({"version": peak_mod._CACHE_VERSION, "peaks": {key: entry}}))
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp.resources.peak"):
        assert measure_peak("cpu").rate("fp32") == 2e9
    assert "ignoring the cached peak" in caplog.text


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"`seconds_per_size` must be > 0, got 0"):
        measure_peak("cpu", seconds_per_size=0)
    with pytest.raises(ValueError, match=r"`device` must be 'cpu' or an available 'cuda\[:i\]'"):
        measure_peak("tpu")


def test_the_datasheet_is_shown_beside_the_measured_peak_never_instead() -> None:
    peak = Peak("NVIDIA H200", "k", (PeakRate("bf16", 700e12, 8192),), {"bf16": 989.5e12})
    assert peak.rate("bf16") == 700e12 and peak.rate("fp8") is None
    text = str(peak)
    assert "bf16  700.000 TFLOP/s at 8192x8192 (datasheet 989.5: 71% of it)" in text
    assert peak_mod._datasheet("NVIDIA H200")["bf16"] == 989.5e12
    assert peak_mod._datasheet("NVIDIA GeForce RTX 4090") == {}


def test_maxtp_inspect_peak_prints_and_caches_it(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "lightning_maxtp.cli", "inspect", "--peak", "--json"]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True, env=env)
    peak = json.loads(out.stdout)["peak"]
    assert peak["rates"][0]["dtype"] == "fp32" and peak["rates"][0]["flops_per_s"] > 0
    assert (tmp_path / "lightning_maxtp" / "peaks.json").exists()
    text = subprocess.run(run[:-1], capture_output=True, text=True, timeout=120, check=True,
                          env=env).stdout  # fmt: skip
    assert "peak (cached): " in text and "TFLOP/s at " in text


def test_measuring_puts_the_users_matmul_precision_back_as_it_was() -> None:
    import torch

    from lightning_maxtp.resources.peak import matmul_rate

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        assert matmul_rate("cpu", torch.float32, 64, 0.01, True) > 0
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
