"""``cached_peak`` reads without measuring; a measurement leaves the training's random numbers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lightning_maxtp.resources import peak as peak_mod
from lightning_maxtp.resources.peak import cache_path, cached_peak, measure_peak


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return cache_path()


def test_cached_peak_never_measures_and_reads_what_measure_peak_cached(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_measuring(*args: object) -> float:
        raise AssertionError("measured by cached_peak")

    monkeypatch.setattr(peak_mod, "matmul_rate", no_measuring)
    assert cached_peak("cpu") is None and not cache.exists()
    monkeypatch.setattr(peak_mod, "matmul_rate", lambda *args: 2e9)
    measured = measure_peak("cpu")
    monkeypatch.setattr(peak_mod, "matmul_rate", no_measuring)
    read = cached_peak("cpu")
    assert read is not None and read.cached and read.rates == measured.rates
    with pytest.raises(ValueError, match=r"`device` must be 'cpu' or an available 'cuda\[:i\]'"):
        cached_peak("tpu")


def test_a_corrupt_cache_reads_as_none_quietly_and_warns_once_when_measured(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=peak_mod.__name__):
        assert cached_peak("cpu") is None
        assert not caplog.records  # the fit that reads it measures later, and warns then
        monkeypatch.setattr(peak_mod, "matmul_rate", lambda *args: 2e9)
        measure_peak("cpu")
    assert [r.getMessage() for r in caplog.records if "ignoring the peak cache" in r.getMessage()]
    assert cached_peak("cpu") is not None  # rewritten by the measurement


def test_measuring_the_peak_leaves_the_global_random_state_alone() -> None:
    # Measured in the middle of a fit, it must not change the training's dropout or shuffling.
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    measure_peak("cpu", cache=False, seconds_per_size=0.005)
    assert torch.equal(torch.random.get_rng_state(), before)
