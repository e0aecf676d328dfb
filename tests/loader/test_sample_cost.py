"""What a sample costs the loader and what a batch ships: measured on real files and tensors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from lightning_maxtp.loader.sample_cost import batch_facts, file_samples, measure_sample_costs
from tests.helpers.jpegs import write_jpegs


class SlowFiles(torch.utils.data.Dataset[tuple[Any, int]]):
    """Decodes its file, then works 5 ms more: decode is a small, measurable share."""

    def __init__(self, samples: list[tuple[Path, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        image = Image.open(path).convert("RGB")
        time.sleep(0.005)
        return image, label


def test_decode_share_of_a_dataset_that_lists_its_files(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 8)
    costs = measure_sample_costs(SlowFiles(pairs), count=4)
    assert costs is not None and costs.samples == 4 and costs.files == "jpeg"
    assert costs.per_sample_s >= 0.005 and costs.decode_s is not None
    assert costs.decode_share is not None and 0 < costs.decode_share < 1
    assert costs.to_dict()["decode_share"] == costs.decode_share


class PreemptedBytes(torch.utils.data.Dataset[tuple[bytes, int]]):
    """Returns its file's bytes (no decode), but most reads are stalled 3 ms, as a process
    preempted on a loaded machine is: the median read is slower than a decode."""

    def __init__(self, samples: list[tuple[Path, int]]) -> None:
        self.samples, self.calls = samples, 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        self.calls += 1
        if self.calls % 4:  # 3 of every 4 reads; spins, as sleep overshoots by milliseconds here
            until = time.perf_counter() + 0.003
            while time.perf_counter() < until:
                pass
        path, label = self.samples[index]
        return path.read_bytes(), label


def test_a_dataset_returning_bytes_does_not_decode_though_most_reads_stall(
    tmp_path: Path,
) -> None:
    costs = measure_sample_costs(PreemptedBytes(write_jpegs(tmp_path, 8)), count=8)
    assert costs is not None and costs.files == "jpeg" and costs.per_sample_s >= 0.003
    assert costs.decode_s is None and costs.decode_share is None


def test_what_cannot_be_timed_is_none_and_the_budget_stops_early(tmp_path: Path) -> None:
    assert measure_sample_costs(torch.utils.data.TensorDataset(torch.zeros(4))).decode_s is None

    class Stream(torch.utils.data.IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    assert measure_sample_costs(Stream()) is None
    assert measure_sample_costs([]) is None
    slow = SlowFiles(write_jpegs(tmp_path, 8))
    assert measure_sample_costs(slow, count=8, budget_s=0.001).samples == 1  # type: ignore[union-attr]
    assert file_samples([("a.jpg", 1)]) == [(Path("a.jpg"), 1)]
    assert file_samples([(torch.zeros(1), 1)]) is None and file_samples("abc") is None


def test_batch_facts_name_the_largest_image_tensor() -> None:
    batch = {"x": torch.zeros(4, 3, 8, 8, dtype=torch.uint8), "y": torch.zeros(4),
             "mask": torch.zeros(4, 1, 2, 2)}  # fmt: skip
    samples, nbytes, dtype = batch_facts(batch)
    assert (samples, dtype) == (4, "uint8") and nbytes == 4 * 192 + 4 * 4 + 4 * 4 * 4
    assert batch_facts((torch.zeros(2, 5),))[2] is None


class MainProcessFails(SlowFiles):
    """Loads in workers only: in the training process it cannot open its store (a handle that
    each worker opens for itself), and says so with its own error."""

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if torch.utils.data.get_worker_info() is None:
            raise KeyError(f"no store handle in this process for sample {index}")
        return torch.zeros(3, 8, 8), self.samples[index][1] % 10


def test_a_sample_that_raises_is_named_and_the_fit_reports_it(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import pytest

    from lightning_maxtp.callbacks import BottleneckMonitor
    from lightning_maxtp.loader.sample_cost import SampleError
    from tests.helpers.models import ConvModel

    dataset = MainProcessFails(write_jpegs(tmp_path, 16))
    with pytest.raises(SampleError, match=r"dataset\[0\] raised KeyError: .*no store handle"):
        measure_sample_costs(dataset, count=4)
    # In a fit, training goes on (its workers load fine) and the report says what is missing.
    monitor = BottleneckMonitor(window_steps=3, sampler_interval_s=None)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=6, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=1)
    trainer.fit(ConvModel(), loader)
    (note,) = [n for n in monitor.report.notes if "sample's cost" in n]
    assert note.startswith("a sample's cost was not measured (SampleError: dataset[0] raised")
