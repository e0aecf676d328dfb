"""``pre_encode`` with LitData: every sample round-trips, and a fit trains on what it wrote."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from lightning_maxtp.data import DeviceTransform, open_pre_encoded, pre_encode
from tests.helpers.jpegs import decoded, write_jpegs

pytest.importorskip("litdata")

# LitData's processes: forked here, as a test process cannot be re-imported by `spawn`.
FAST = {"num_workers": 1, "start_method": "fork"}


def _pixels(image: torch.Tensor) -> np.ndarray:
    return image.permute(1, 2, 0).numpy()


def test_every_sample_round_trips_in_order_and_the_start_method_is_put_back(
    tmp_path: Path,
) -> None:
    pairs = write_jpegs(tmp_path / "jpg", 10, size=(40, 30))
    before = multiprocessing.get_start_method(allow_none=True)
    result = pre_encode(pairs, tmp_path / "enc", max_side=None, **FAST)
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert (result.samples, result.format, result.max_side) == (10, "uint8", None)
    assert result.bytes >= 10 * 40 * 30 * 3 and "pre-encoded 10 samples as uint8" in str(result)
    data = open_pre_encoded(tmp_path / "enc")
    assert len(data) == 10
    for index, (path, label) in enumerate(pairs):
        image, got_label = data[index]
        assert image.dtype == torch.uint8 and image.shape == (3, 30, 40)
        assert got_label == label and np.array_equal(_pixels(image), decoded(path))
    iterated = [label for _, label in data]
    assert iterated == list(range(10))


def test_resized_jpeg_and_a_dataset_of_images_as_sources(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path / "jpg", 6, size=(64, 32))
    pre_encode(pairs, tmp_path / "small", max_side=32, format="jpeg", quality=95, **FAST)
    small = open_pre_encoded(tmp_path / "small")
    for index, (path, _) in enumerate(pairs):
        image, _ = small[index]
        assert image.shape == (3, 16, 32)  # the longest side is 32, the aspect ratio kept
        want = np.asarray(Image.open(path).convert("RGB").resize((32, 16), Image.BICUBIC))
        assert np.abs(_pixels(image).astype(int) - want.astype(int)).mean() < 4  # JPEG q95

    class Images(torch.utils.data.Dataset[tuple[Any, int]]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> tuple[Any, int]:
            return torch.full((3, 5, 7), index, dtype=torch.uint8), 10 + index

    pre_encode(Images(), tmp_path / "tensors", **FAST)
    back = open_pre_encoded(tmp_path / "tensors")
    assert [(int(x[0, 0, 0]), y) for x, y in back] == [(i, 10 + i) for i in range(4)]


def test_bad_input_is_named_and_nothing_is_overwritten(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path / "jpg", 2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"`output_dir` .* is not empty; pass `overwrite=True`"):
        pre_encode(pairs, out, **FAST)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="`format` must be one of"):
        pre_encode(pairs, tmp_path / "x", format="png", **FAST)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`format` must be one of"):  # checked before removing
        pre_encode(pairs, out, format="png", overwrite=True, **FAST)  # type: ignore[arg-type]
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="`max_side` must be >= 8"):
        pre_encode(pairs, tmp_path / "x", max_side=2, **FAST)
    with pytest.raises(ValueError, match="`source` is empty"):
        pre_encode([], tmp_path / "x", **FAST)

    class Normalized(torch.utils.data.Dataset[tuple[Any, int]]):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> tuple[Any, int]:
            return torch.rand(3, 4, 4), 0

    with pytest.raises(ValueError, match=r"`source\[0\]`.*without ToTensor\(\)/Normalize\(\)"):
        pre_encode(Normalized(), tmp_path / "x", **FAST)

    class Failing(torch.utils.data.Dataset[tuple[Any, int]]):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, index: int) -> tuple[Any, int]:
            if index == 4:
                raise OSError("disk gone")
            return torch.zeros(3, 4, 4, dtype=torch.uint8), index

    before = multiprocessing.get_start_method(allow_none=True)
    with pytest.raises(RuntimeError, match="disk gone"):  # a worker's error reaches the caller
        pre_encode(Failing(), tmp_path / "failing", **FAST)
    assert multiprocessing.get_start_method(allow_none=True) == before
    with pytest.raises(ValueError, match=r"holds no LitData index\.json"):
        open_pre_encoded(tmp_path / "missing")
    pre_encode(pairs, out, overwrite=True, **FAST)
    assert not (out / "keep.txt").exists() and len(open_pre_encoded(out)) == 2


class Labels(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 16 * 16, 16)
        self.seen: list[int] = []
        self.dtypes: set[torch.dtype] = set()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen += y.tolist()
        self.dtypes.add(x.dtype)
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_fit_reads_every_sample_once_per_epoch_with_random_crops(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path / "jpg", 16, size=(24, 24))
    pre_encode(pairs, tmp_path / "enc", **FAST)
    crops = v2.Compose([v2.RandomResizedCrop(16, antialias=True), v2.RandomHorizontalFlip()])
    data = open_pre_encoded(tmp_path / "enc", crops, shuffle=True)
    loader = DataLoader(data, batch_size=4, num_workers=2)
    model = Labels()
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[DeviceTransform()],
    )  # fmt: skip
    trainer.fit(model, train_dataloaders=loader)
    assert model.dtypes == {torch.float32}
    first, second = model.seen[:16], model.seen[16:]
    assert sorted(first) == list(range(16)) and sorted(second) == list(range(16))
