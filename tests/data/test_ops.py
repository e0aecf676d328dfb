"""The data paths' tensor operations against the CPU pipeline they replace."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.io import read_file

from lightning_maxtp.data import ToUint8
from lightning_maxtp.data.ops import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    _crop_box,
    center_crops,
    decode_packed,
    normalize_uint8,
    pack_encoded,
    random_flip,
    random_resized_crops,
    to_uint8_chw,
    unpack_encoded,
)
from tests.helpers.jpegs import decoded, write_jpegs

NORMALIZE = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
ONE_LEVEL = 1 / 255 / min(IMAGENET_STD)
"""One grey level after normalizing: what two resizers may differ by."""


def test_device_normalize_equals_the_cpu_pipeline_on_the_same_crops(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 8)
    geometry = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
    cpu = T.Compose([*geometry, T.ToTensor(), NORMALIZE])
    uint8 = T.Compose([*geometry, ToUint8()])
    expected, shipped = [], []
    for index, (path, _) in enumerate(pairs):
        image = Image.open(path).convert("RGB")
        torch.manual_seed(index)  # the same crop and flip on both sides
        expected.append(cpu(image))
        torch.manual_seed(index)
        shipped.append(uint8(image))
    batch = torch.stack(shipped)
    assert batch.dtype == torch.uint8 and batch.shape == (8, 3, 24, 24)
    got = normalize_uint8(batch)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.stack(expected), atol=1e-6, rtol=1e-6)
    # A quarter of the bytes cross from the workers.
    assert batch.numel() * batch.element_size() * 4 == got.numel() * got.element_size()


def test_normalize_keeps_channels_last_and_checks_channels() -> None:
    batch = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    out = normalize_uint8(batch.to(memory_format=torch.channels_last))
    assert out.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="one value per channel"):
        normalize_uint8(batch, mean=(0.5,), std=(0.5,))


def test_to_uint8_takes_pil_arrays_and_uint8_tensors_and_refuses_floats() -> None:
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    from_pil = to_uint8_chw(Image.fromarray(array))
    from_array = to_uint8_chw(array)
    assert from_pil.shape == (3, 2, 3) and torch.equal(from_pil, from_array)
    assert torch.equal(from_array[:, 1, 2], torch.from_numpy(array[1, 2]))
    assert to_uint8_chw(np.zeros((4, 5), dtype=np.uint8)).shape == (1, 4, 5)  # greyscale
    with pytest.raises(ValueError, match="end the CPU pipeline before ToTensor"):
        to_uint8_chw(torch.rand(3, 4, 4))
    with pytest.raises(ValueError, match="must be a uint8 array, got float64"):
        to_uint8_chw(np.zeros((4, 4, 3)))
    with pytest.raises(ValueError, match="got list"):
        to_uint8_chw([1, 2])


def test_random_flip_mirrors_some_images_and_leaves_the_others() -> None:
    torch.manual_seed(0)
    batch = torch.arange(64 * 3 * 2 * 4, dtype=torch.float32).reshape(64, 3, 2, 4)
    out = random_flip(batch)
    flipped = [bool(torch.equal(o, b.flip(-1))) for o, b in zip(out, batch, strict=True)]
    kept = [bool(torch.equal(o, b)) for o, b in zip(out, batch, strict=True)]
    assert all(f != k for f, k in zip(flipped, kept, strict=True))
    assert 16 < sum(flipped) < 48


def test_packed_bytes_round_trip_and_a_bad_header_is_named(tmp_path: Path) -> None:
    payloads = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (5, 300, 1)]
    packed = pack_encoded(payloads)
    assert packed.shape == (3, 4 + 300) and packed.dtype == torch.uint8
    for got, want in zip(unpack_encoded(packed), payloads, strict=True):
        assert torch.equal(got, want)
    packed[1, :4] = 255
    with pytest.raises(ValueError, match="row 1 of the packed images says"):
        unpack_encoded(packed)
    with pytest.raises(ValueError, match="2-D uint8 CPU tensor"):
        unpack_encoded(torch.zeros(3, 4))


def test_decode_on_the_device_equals_pil_and_takes_png_too(tmp_path: Path) -> None:
    pairs = write_jpegs(tmp_path, 4)
    png = tmp_path / "extra.png"
    Image.fromarray(decoded(pairs[0][0])).save(png)
    files = [p for p, _ in pairs] + [png]
    images = decode_packed(pack_encoded([read_file(str(p)) for p in files]), "cpu")
    for path, image in zip(files, images, strict=True):
        want = torch.from_numpy(decoded(path).copy()).permute(2, 0, 1)
        assert image.dtype == torch.uint8 and torch.equal(image, want), path.name


def test_cuda_decoding_runs_on_its_own_stream_and_hands_the_images_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nvJPEG writes before the work queued on its stream has run: decoding on the step's stream
    # can overwrite blocks the previous step still reads. A fake CUDA records the order.
    import torchvision.io

    from lightning_maxtp.data import ops

    calls: list[str] = []

    class FakeStream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: FakeStream) -> None:
            calls.append(f"{self.name} waits for {other.name}")

    class Recorded(torch.Tensor):
        def record_stream(self, stream: FakeStream) -> None:  # type: ignore[override]
            calls.append(f"image recorded on {stream.name}")

    current = FakeStream("step stream")
    active = [current]

    class Entered:
        def __init__(self, stream: FakeStream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            active.append(self.stream)

        def __exit__(self, *args: object) -> None:
            active.pop()

    def fake_decode(payloads: list[torch.Tensor], **kwargs: object) -> list[torch.Tensor]:
        calls.append(f"decode {len(payloads)} on {active[-1].name} to {kwargs['device']}")
        return [torch.zeros(3, 2, 2, dtype=torch.uint8).as_subclass(Recorded) for _ in payloads]

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream("decode stream"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: current)
    monkeypatch.setattr(torch.cuda, "stream", Entered)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torchvision.io, "decode_jpeg", fake_decode)
    monkeypatch.setattr(ops, "_DECODE_STREAMS", {})
    pairs = write_jpegs(tmp_path, 2)
    images = decode_packed(pack_encoded([read_file(str(p)) for p, _ in pairs]), "cuda")
    assert len(images) == 2
    assert calls == [
        "decode 2 on decode stream to cuda:0",
        "step stream waits for decode stream",
        "image recorded on step stream",
        "image recorded on step stream",
    ]


def test_decode_and_crop_on_the_device_match_the_cpu_pipeline(tmp_path: Path) -> None:
    """Whole-image crops (scale 1, the images' own ratio): only the resizers differ."""
    pairs = write_jpegs(tmp_path, 4, size=(48, 48))
    images = decode_packed(pack_encoded([read_file(str(p)) for p, _ in pairs]), "cpu")
    got = normalize_uint8(random_resized_crops(images, 24, scale=(1.0, 1.0), ratio=(1.0, 1.0)))
    cpu = T.Compose([T.Resize((24, 24)), T.ToTensor(), NORMALIZE])
    want = torch.stack([cpu(Image.open(p).convert("RGB")) for p, _ in pairs])
    diff = (got - want).abs()
    assert diff.max() <= ONE_LEVEL + 1e-5 and diff.mean() < 0.5 * ONE_LEVEL
    evaluated = center_crops(images, 24, 28)
    assert evaluated.shape == (4, 3, 24, 24)


def test_crop_boxes_follow_random_resized_crops_rule() -> None:
    random.seed(0)
    scale, ratio = (0.2, 0.6), (3 / 4, 4 / 3)
    for _ in range(200):
        top, left, h, w = _crop_box(60, 80, scale, ratio)
        assert 0 <= top <= 60 - h and 0 <= left <= 80 - w
        assert 0.2 * 4800 * 0.9 <= h * w <= 0.6 * 4800 * 1.1
        assert math.log(3 / 4) - 0.1 <= math.log(w / h) <= math.log(4 / 3) + 0.1
    # No box fits: the central fallback, clipped to the ratio range.
    assert _crop_box(10, 100, (0.99, 1.0), (1.0, 1.0)) == (0, 45, 10, 10)
