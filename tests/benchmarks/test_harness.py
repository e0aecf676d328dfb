"""Tests of the benchmark harness: A/B runner, report, JPEG workload, fit timing."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.baseline_jpeg import default_settings, tuned_settings
from benchmarks.runner import Config, Measurement, format_table, report, run_ab, time_fit
from benchmarks.workloads.common import LoaderSettings, make_loader
from benchmarks.workloads.jpeg import (
    MANIFEST_NAME,
    ImageClassifier,
    JpegFolderDataset,
    JpegSpec,
    generate_jpeg_dataset,
)
from benchmarks.workloads.tensors import PRESETS, build_tensor_workload
from tests.helpers.runif import RunIf

SPEC = JpegSpec(images=12, image_size=40, classes=3, quality=85, seed=7)


def _fake(name: str, rates: list[float], calls: list[str]) -> Config:
    """A config whose i-th call returns ``rates[i]`` samples/s (100 samples), logging the call."""
    it: Iterator[float] = iter(rates)

    def run() -> Measurement:
        calls.append(name)
        return Measurement(samples=100, seconds=100 / next(it), steps=5, warmup_steps=1)

    return Config(name, run, {"batch_size": 32, "label": name})


def test_run_ab_alternates_and_reports(tmp_path: Path) -> None:
    calls: list[str] = []
    configs = [_fake("A", [100.0, 300.0, 200.0], calls), _fake("B", [150.0, 450.0, 600.0], calls)]
    result = run_ab("fake", configs, rounds=3, params={"images": 12})
    assert calls == ["A", "B", "A", "B", "A", "B"]
    assert result.values("B") == pytest.approx([150.0, 450.0, 600.0])

    out = io.StringIO()
    report(result, stream=out, json_out=tmp_path / "r.json", table_out=tmp_path / "r.txt")
    lines = out.getvalue().rstrip("\n").splitlines()
    data = json.loads(lines[-1])
    assert data["benchmark"] == "fake"
    assert data["order"] == calls
    assert data["medians"] == pytest.approx({"A": 200.0, "B": 450.0})
    assert data["ratios"] == pytest.approx({"A": 1.0, "B": 2.25})
    assert [r["A"]["samples_per_s"] for r in data["rounds"]] == pytest.approx([100, 300, 200])
    assert data["configs"][1] == {"name": "B", "settings": {"batch_size": 32, "label": "B"}}
    assert data["params"] == {"images": 12}
    assert data["machine"]["cpu"]["effective"] >= 1
    assert "advice" in data["machine"] and "timestamp" in data and "git_commit" in data
    assert set(data["load_avg"]) == {"before", "after"}

    table = "\n".join(lines[:-1])
    assert table == format_table(result)
    assert "machine:" in table
    row_b = next(line for line in table.splitlines() if line.startswith("B "))
    assert row_b.split()[1:5] == ["450.0", "150.0", "600.0", "2.25x"]
    assert row_b.endswith("150.0 450.0 600.0")
    assert json.loads((tmp_path / "r.json").read_text()) == data
    assert (tmp_path / "r.txt").read_text() == table + "\n"


def test_run_ab_rejects_bad_input() -> None:
    calls: list[str] = []
    with pytest.raises(ValueError, match="unique"):
        run_ab("x", [_fake("A", [1.0], calls), _fake("A", [1.0], calls)], machine={})
    with pytest.raises(ValueError, match="rounds"):
        run_ab("x", [_fake("A", [1.0], calls)], rounds=0, machine={})
    assert calls == []


def _age_files(root: Path) -> dict[Path, int]:
    """Set every file's mtime to a fixed old time; return the mtimes."""
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_jpeg_generator_writes_decodable_classes_and_is_idempotent(tmp_path: Path) -> None:
    root = generate_jpeg_dataset(tmp_path / "a", SPEC)
    class_dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert class_dirs == ["class_000", "class_001", "class_002"]
    files = sorted(root.rglob("*.jpg"))
    assert len(files) == SPEC.images
    for path in files:
        index = int(path.stem)
        assert path.parent.name == f"class_{index % SPEC.classes:03d}"
        with Image.open(path) as image:
            assert image.format == "JPEG"
            assert image.size == (SPEC.image_size, SPEC.image_size)
            pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
        assert pixels.std() > 10  # structure and noise, not a flat colour
    assert json.loads((root / MANIFEST_NAME).read_text())["images"] == SPEC.images

    before = _age_files(root)
    assert generate_jpeg_dataset(root, SPEC) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before

    other = generate_jpeg_dataset(tmp_path / "b", SPEC)  # deterministic from the seed
    assert all((other / p.relative_to(root)).read_bytes() == p.read_bytes() for p in files)

    victim = root / "class_001" / "000001.jpg"
    original = victim.read_bytes()
    victim.unlink()  # incomplete -> regenerated, identically
    generate_jpeg_dataset(root, SPEC)
    assert victim.read_bytes() == original

    changed = JpegSpec(images=6, image_size=40, classes=2, quality=85, seed=7)
    generate_jpeg_dataset(root, changed)
    assert len(list(root.rglob("*.jpg"))) == 6
    assert not (root / "class_002").exists()


def test_jpeg_dataset_and_loader_shapes(tmp_path: Path) -> None:
    dataset = JpegFolderDataset(generate_jpeg_dataset(tmp_path, SPEC), crop=24)
    assert len(dataset) == SPEC.images
    assert dataset.classes == ["class_000", "class_001", "class_002"]
    assert sorted(label for _, label in dataset.samples) == sorted(i % 3 for i in range(12))
    image, label = dataset[5]
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32
    assert label == 1 and isinstance(label, int)  # sorted by class: 0,3,6,9 then 1,4,...
    assert dataset.samples[5][0].name == "000004.jpg"
    assert image.min() < 0 < image.max()  # normalized

    loader = make_loader(dataset, LoaderSettings(batch_size=5), steps=7)
    batches = list(loader)
    assert len(loader) == len(batches) == 7  # more steps than one pass over 12 images
    x, y = batches[0]
    assert x.shape == (5, 3, 24, 24) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and set(y.tolist()) <= {0, 1, 2}

    model = ImageClassifier("resnet18", num_classes=3, channels_last=True).eval()
    with torch.no_grad():
        assert model(x).shape == (5, 3)
    assert model.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_tuned_settings_follow_the_machine() -> None:
    cpu = tuned_settings(gpu=False, workers=1, batch_size=32).to_dict()
    assert cpu["num_workers"] == 1 and cpu["prefetch_factor"] == 4 and cpu["persistent_workers"]
    assert not cpu["pin_memory"] and cpu["precision"] == "32-true" and not cpu["channels_last"]
    gpu = tuned_settings(gpu=True, workers=7, batch_size=128).to_dict()
    assert gpu["pin_memory"] and gpu["precision"] == "bf16-mixed" and gpu["channels_last"]
    assert gpu["num_workers"] == 7 and gpu["batch_size"] == 128
    none = tuned_settings(gpu=False, workers=0, batch_size=32).to_dict()
    assert none["prefetch_factor"] is None and not none["persistent_workers"]
    assert default_settings().to_dict() == {
        "batch_size": 32,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
        "persistent_workers": False,
        "precision": "32-true",
        "channels_last": False,
    }


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_tensor_presets_build_and_run(name: str) -> None:
    small = {"hidden": 16} if "mlp" in name else {"d_model": 16, "layers": 1, "seq_len": 8}
    workload = build_tensor_workload(name, samples=4, classes=5, **small)
    x, y = workload.dataset.tensors
    assert len(workload.dataset) == 4 and y.max() < 5
    assert workload.module(x).shape == (4, 5)
    assert workload.to_dict()["name"] == name


def test_time_fit_on_tensor_workload() -> None:
    workload = build_tensor_workload("tiny-mlp", samples=64)
    loader = make_loader(workload.dataset, LoaderSettings(batch_size=8), steps=5)
    measurement = time_fit(workload.module, loader, warmup_steps=2, steps=3, accelerator="cpu")
    assert measurement.samples == 3 * 8
    assert measurement.steps == 3 and measurement.warmup_steps == 2
    assert measurement.seconds > 0 and measurement.samples_per_s > 0
    assert measurement.to_dict()["samples_per_s"] == pytest.approx(measurement.samples_per_s)
    with pytest.raises(ValueError, match="batches"):
        time_fit(workload.module, loader, warmup_steps=2, steps=4, accelerator="cpu")


@RunIf(min_cuda_gpus=1)
def test_time_fit_on_gpu_with_tuned_settings(tmp_path: Path) -> None:
    dataset = JpegFolderDataset(generate_jpeg_dataset(tmp_path, SPEC), crop=32)
    settings = tuned_settings(gpu=True, workers=1, batch_size=4)
    loader = make_loader(dataset, settings.loader, steps=4)
    module = ImageClassifier("resnet18", num_classes=3, channels_last=True)
    measurement = time_fit(
        module, loader, warmup_steps=1, steps=3, accelerator="gpu", precision=settings.precision
    )
    assert measurement.samples == 3 * 4 and measurement.samples_per_s > 0
