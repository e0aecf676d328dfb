"""Real CPU fits with the device half of the data paths: uint8 batches and packed JPEG bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms as T

from lightning_maxtp.callbacks import StepClock
from lightning_maxtp.data import DeviceTransform, EncodedImages, ToUint8, collate_encoded
from lightning_maxtp.data.hooks import add_batch_step
from lightning_maxtp.data.ops import IMAGENET_MEAN, IMAGENET_STD
from lightning_maxtp.knobs.channels_last import CHANNELS_LAST_ORDER, to_channels_last
from tests.helpers.jpegs import write_jpegs

ONE_LEVEL = 1 / 255 / min(IMAGENET_STD)
CPU_TAIL = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]


class Files(torch.utils.data.Dataset[tuple[Any, int]]):
    """(transform(PIL image), label) for (path, label) pairs."""

    def __init__(self, samples: list[tuple[Path, int]], transform: Any) -> None:
        self.samples, self.transform = samples, transform  # ImageFolder's name for them

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        return self.transform(Image.open(path).convert("RGB")), label


class Recorder(pl.LightningModule):
    """A linear classifier on 3x16x16 images that keeps every batch it trains and validates on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 16 * 16, 16)
        self.train_x: list[torch.Tensor] = []
        self.val_x: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.train_x.append(x.detach().clone())
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_x.append(batch[0].detach().clone())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(model: Recorder, train: DataLoader[Any], val: DataLoader[Any] | None, *callbacks: Any,
         datamodule: Any = None) -> None:  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=list(callbacks),
    )  # fmt: skip
    if datamodule is not None:
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, train_dataloaders=train, val_dataloaders=val)


def test_uint8_batches_train_on_the_cpu_pipelines_tensors(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 12)
    resize = T.Resize((16, 16))
    shipped = DataLoader(Files(pairs, T.Compose([resize, ToUint8()])), batch_size=4)
    model, clock = Recorder(), StepClock(window_steps=2)
    _fit(model, shipped, shipped, DeviceTransform(), clock)
    cpu = Files(pairs, T.Compose([resize, *CPU_TAIL]))
    want = torch.stack([cpu[i][0] for i in range(12)])
    got = torch.cat(model.train_x)
    assert got.dtype == torch.float32 and got.shape == (12, 3, 16, 16)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.cat(model.val_x), want, atol=1e-6, rtol=1e-6)
    # The hooks are the module's own again, and the clock saw what crossed from the loader.
    assert "on_after_batch_transfer" not in vars(model)
    assert "on_before_batch_transfer" not in vars(model)
    facts = clock.context.data_facts
    assert facts.pixel_dtype == "uint8" and facts.sample_bytes == 3 * 16 * 16 + 8
    # The dataset lists its files, so a few samples (and their decode) were timed.
    assert facts.files == "jpeg" and facts.per_sample_s > 0


def test_random_flip_runs_while_training_only(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 16)
    loader = DataLoader(Files(pairs, T.Compose([T.Resize((16, 16)), ToUint8()])), batch_size=16)
    model = Recorder()
    torch.manual_seed(0)
    _fit(model, loader, loader, DeviceTransform(flip=True))
    plain = torch.cat(model.val_x)
    trained = torch.cat(model.train_x)
    mirrored = [bool(torch.equal(t, p.flip(-1))) for t, p in zip(trained, plain, strict=True)]
    same = [bool(torch.equal(t, p)) for t, p in zip(trained, plain, strict=True)]
    assert all(m or s for m, s in zip(mirrored, same, strict=True))
    assert 0 < sum(mirrored) < 16


def test_packed_jpeg_bytes_are_decoded_and_cropped_on_the_device(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 12, size=(40, 48))
    loader = DataLoader(EncodedImages(pairs), batch_size=4, collate_fn=collate_encoded,
                        num_workers=2)  # fmt: skip
    model, clock = Recorder(), StepClock(window_steps=2)
    transform = DeviceTransform(decode=True, crop=16, flip=True)
    _fit(model, loader, loader, transform, clock)
    trained = torch.cat(model.train_x)
    assert trained.dtype == torch.float32 and trained.shape == (12, 3, 16, 16)
    assert transform.batches == {"decoded": 6, "normalized": 6}
    # Outside training: resize to 18 (16 * 8 / 7) and a center crop, as the CPU pipeline does.
    cpu = Files(pairs, T.Compose([T.Resize(18), T.CenterCrop(16), *CPU_TAIL]))
    want = torch.stack([cpu[i][0] for i in range(12)])
    assert (torch.cat(model.val_x) - want).abs().max() <= ONE_LEVEL + 1e-5
    facts = clock.context.data_facts
    assert facts.pixel_dtype is None  # packed bytes crossed, not images
    # EncodedImages lists its files, but a sample only reads one: no decode in the loader.
    assert facts.files == "jpeg" and facts.per_sample_s > 0 and facts.decode_s is None
    assert facts.sample_bytes < 40 * 48 * 3  # compressed bytes, not pixels
    assert "on_before_batch_transfer" not in vars(model)


class Data(pl.LightningDataModule):
    def __init__(self, loader: DataLoader[Any]) -> None:
        super().__init__()
        self.loader, self.calls = loader, 0

    def train_dataloader(self) -> DataLoader[Any]:
        return self.loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls += 1
        assert batch[0].dtype == torch.uint8  # the user's hook runs first, on what arrived
        return batch


def test_a_datamodule_that_overrides_the_hook_gets_the_step(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 8)
    loader = DataLoader(Files(pairs, T.Compose([T.Resize((16, 16)), ToUint8()])), batch_size=4)
    data, model = Data(loader), Recorder()
    _fit(model, loader, None, DeviceTransform(), datamodule=data)
    assert data.calls == 2 and all(x.dtype == torch.float32 for x in model.train_x)
    assert "on_after_batch_transfer" not in vars(data)


def test_channels_last_converts_the_floats_the_device_transform_makes() -> None:
    class Stub:
        training = True

    module = pl.LightningModule()
    # The knob's step is added first, as when the loop tries channels_last on a fit that
    # already has the transform; the order puts it after the normalize step all the same.
    add_batch_step(module, "on_after_batch_transfer", "cl", to_channels_last, CHANNELS_LAST_ORDER)
    transform = DeviceTransform()
    add_batch_step(module, "on_after_batch_transfer", "n", transform._normalize(Stub()), 0)  # type: ignore[arg-type]
    out = module.on_after_batch_transfer((torch.zeros(2, 3, 4, 4, dtype=torch.uint8),), 0)
    assert out[0].dtype == torch.float32
    assert out[0].is_contiguous(memory_format=torch.channels_last) and not out[0].is_contiguous()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="`crop` must be the output side"):
        DeviceTransform(decode=True)
    with pytest.raises(ValueError, match="same number of channels, got 3 and 1"):
        DeviceTransform(std=(0.5,))
    with pytest.raises(ValueError, match="`std` must be > 0"):
        DeviceTransform(std=(0.5, 0.0, 0.5))
    with pytest.raises(ValueError, match="`eval_resize` must be >= `crop`"):
        DeviceTransform(decode=True, crop=16, eval_resize=8)
    with pytest.raises(ValueError, match="`source` must be"):
        EncodedImages([1, 2, 3])
