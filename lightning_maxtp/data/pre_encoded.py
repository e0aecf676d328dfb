"""``pre_encode``: decode and resize a data set once, with LitData; read it back each epoch.

Decoding a JPEG and resizing it costs a worker more than the random crop that follows. Done
once ahead of time, every epoch after that reads pixels (or small JPEGs) from LitData's chunked
files: sequential reads, local disk or object storage, sharded over ranks, nodes and workers by
``litdata.StreamingDataset``. The random transforms stay in the loader, applied after reading,
so each epoch still sees new crops.

LitData is an optional extra: ``pip install "lightning-maxtp[data]"``.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp._units import format_bytes
from lightning_maxtp.data.ops import to_uint8_chw
from lightning_maxtp.loader.sample_cost import file_samples

if TYPE_CHECKING:
    import torch
    from litdata import StreamingDataset

__all__ = ["PreEncodeResult", "open_pre_encoded", "pre_encode"]

Format = Literal["uint8", "jpeg"]
_FORMATS = ("uint8", "jpeg")


@dataclass(frozen=True)
class PreEncodeResult:
    """What ``pre_encode`` wrote.

    Attributes:
        output_dir: The LitData directory (``index.json`` and chunks).
        samples: Samples written.
        format: ``"uint8"`` (decoded pixels) or ``"jpeg"`` (re-encoded at the new size).
        max_side: Longest side of the stored images (``None``: sizes kept).
        bytes: Size of the chunks on disk.
        seconds: Wall time of the conversion.
    """

    output_dir: str
    samples: int
    format: str
    max_side: int | None
    bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)

    def __str__(self) -> str:
        side = "sizes kept" if self.max_side is None else f"longest side <= {self.max_side} px"
        return (
            f"pre-encoded {self.samples} samples as {self.format} ({side}) into {self.output_dir}: "
            f"{format_bytes(self.bytes, unit='MiB')} in {self.seconds:.1f} s"
        )


def _pil(image: Any) -> Any:
    """A PIL RGB image from a PIL image, an HWC array or a uint8 CHW tensor."""
    from PIL import Image

    if hasattr(image, "getbands"):
        return image.convert("RGB")
    array = to_uint8_chw(image).permute(1, 2, 0).numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array).convert("RGB")


class _Encode:
    """LitData's ``fn``: sample ``index`` -> ``{"index", "image", "label"}``, in its workers."""

    def __init__(self, source: Any, max_side: int | None, fmt: Format, quality: int) -> None:
        self.files = file_samples(source)
        self.source = None if self.files is not None else source
        self.max_side, self.format, self.quality = max_side, fmt, quality

    def load(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        if self.files is not None:
            path, label = self.files[index]
            with Image.open(path) as image:
                return image.convert("RGB"), label
        item = self.source[index]  # type: ignore[index]
        if not (isinstance(item, tuple | list) and len(item) >= 2):
            raise ValueError(
                f"`source[{index}]` must be (image, label), got {type(item).__name__}; pass a "
                "dataset without ToTensor()/Normalize() or (path, label) pairs"
            )
        try:
            return _pil(item[0]), int(item[1])
        except ValueError as err:
            raise ValueError(
                f"`source[{index}]`: {err}; pre_encode stores uint8 pixels, so pass the dataset "
                "without ToTensor()/Normalize()"
            ) from err

    def __call__(self, index: int) -> dict[str, Any]:
        from PIL import Image

        image, label = self.load(index)
        if self.max_side is not None and max(image.size) > self.max_side:
            scale = self.max_side / max(image.size)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        if self.format == "uint8":
            return {"index": index, "image": to_uint8_chw(image), "label": label}
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=self.quality)
        return {"index": index, "image": buffer.getvalue(), "label": label}


def _check(
    source: Any, output_dir: Path, max_side: int | None, fmt: str, quality: int, *, overwrite: bool
) -> int:
    if fmt not in _FORMATS:
        raise ValueError(f"`format` must be one of {_FORMATS}, got {fmt!r}")
    if max_side is not None and max_side < 8:
        raise ValueError(f"`max_side` must be >= 8 px or None (keep sizes), got {max_side}")
    if not 1 <= quality <= 95:
        raise ValueError(f"`quality` must be in 1..95, got {quality}")
    try:
        size = len(source)
    except TypeError:
        raise ValueError(
            f"`source` must have a length (a map-style dataset or (path, label) pairs), got "
            f"{type(source).__name__}"
        ) from None
    if size < 1:
        raise ValueError("`source` is empty: nothing to pre-encode")
    if not overwrite and output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(
            f"`output_dir` {str(output_dir)!r} is not empty; pass `overwrite=True` to replace "
            "its contents or choose another directory"
        )
    return size


def pre_encode(
    source: Any,
    output_dir: str | Path,
    *,
    max_side: int | None = 512,
    format: Format = "uint8",  # the word users know from FFCV and WebDataset
    quality: int = 90,
    num_workers: int | None = None,
    chunk_bytes: str = "64MB",
    overwrite: bool = False,
    start_method: str | None = None,
) -> PreEncodeResult:
    """Decode every sample of ``source`` once, resize it, and write it with ``litdata.optimize``.

    LitData shows a progress bar while its worker processes run.

    Args:
        source: ``(path, label)`` pairs, a dataset that lists them in ``samples``
            (``ImageFolder``: its files are read, its random transforms are not run), or a
            map-style dataset of ``(image, label)`` with PIL images, HWC uint8 arrays or uint8
            CHW tensors (no ``ToTensor``/``Normalize``).
        output_dir: Where the chunks go (a local directory; LitData also takes ``s3://...``).
        max_side: Longest side after resizing, keeping the aspect ratio; images are never
            enlarged. ``None`` keeps sizes. Keep it at or above the training crop's source size.
        format: ``"uint8"``: decoded pixels (no decode when reading; 3 bytes a pixel on disk);
            ``"jpeg"``: re-encoded at ``quality`` (smaller files, a cheaper decode when reading).
        quality: JPEG quality for ``format="jpeg"``.
        num_workers: Processes that encode (default: LitData's, one per CPU).
        chunk_bytes: Size of each chunk file.
        overwrite: Replace what ``output_dir`` holds.
        start_method: How LitData starts its processes (default: ``spawn``, which re-imports
            the calling script: keep its work under ``if __name__ == "__main__":``).

    Returns:
        What was written, with its size and the time taken.

    Raises:
        ValueError: For a bad argument, an empty source, a non-empty ``output_dir`` without
            ``overwrite``, or samples that are not images and labels.
        RuntimeError: When LitData wrote fewer samples than ``source`` holds (a worker
            failed; its traceback is printed above).
        ImportError: When LitData is not installed (the message says how to install it).
    """
    try:
        from litdata import optimize
    except ImportError as err:
        raise ImportError(
            'pre_encode needs LitData: pip install "lightning-maxtp[data]" (or litdata)'
        ) from err
    out = Path(output_dir)
    size = _check(source, out, max_side, format, quality, overwrite=overwrite)
    encode = _Encode(source, max_side, format, quality)
    encode(0)  # a bad sample fails here, with our message, before any process starts
    if overwrite and out.exists():  # only once the arguments and the first sample are good
        import shutil

        shutil.rmtree(out)
    started = time.perf_counter()
    # LitData sets the process-wide start method (force=True) and DATA_OPTIMIZER_* variables;
    # put the caller's back, or every DataLoader started afterwards would spawn its workers.
    previous = multiprocessing.get_start_method(allow_none=True)
    environ = {k: v for k, v in os.environ.items() if k.startswith("DATA_OPTIMIZER_")}
    children = _children()
    try:
        optimize(
            fn=encode,
            inputs=list(range(size)),
            output_dir=str(out),
            chunk_bytes=chunk_bytes,
            num_workers=num_workers,
            keep_data_ordered=True,
            reorder_files=False,
            start_method=start_method,
        )
    except BaseException:
        _stop_new_children(children)  # LitData leaves its other workers running on an error
        raise
    finally:
        multiprocessing.set_start_method(previous, force=True)
        for key in [k for k in os.environ if k.startswith("DATA_OPTIMIZER_")]:
            del os.environ[key]
        os.environ.update(environ)
    stored = _stored_samples(out)
    if stored != size:
        raise RuntimeError(
            f"LitData wrote {stored} of {size} samples into {str(out)!r}: a worker failed (its "
            "traceback is above); under the default `spawn` start method the calling script "
            'must keep its work under `if __name__ == "__main__":`'
        )
    written = sum(p.stat().st_size for p in out.glob("*.bin"))
    return PreEncodeResult(str(out), size, format, max_side, written, time.perf_counter() - started)


def _children() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def _stop_new_children(before: set[int]) -> None:
    """Terminate the processes started since ``before`` (multiprocessing's helpers excepted)."""
    import psutil

    new = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid not in before and "multiprocessing." not in " ".join(child.cmdline()):
                child.terminate()
                new.append(child)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(new, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _stored_samples(out: Path) -> int:
    """Samples listed in LitData's ``index.json`` (0 when it is missing or unreadable)."""
    import json

    try:
        chunks = json.loads((out / "index.json").read_text()).get("chunks", [])
    except (OSError, ValueError):
        return 0
    return sum(int(chunk.get("chunk_size", 0)) for chunk in chunks)


class _Pair:
    """StreamingDataset's ``transform``: the stored dict -> ``(transform(uint8 CHW), label)``."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        image = sample["image"]
        if not isinstance(image, torch.Tensor):  # JPEG bytes
            data = torch.frombuffer(bytearray(image), dtype=torch.uint8)
            image = decode_jpeg(data, mode=ImageReadMode.RGB)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(sample["label"])


def open_pre_encoded(
    output_dir: str | Path, transform: Any = None, *, shuffle: bool = False, **kwargs: Any
) -> StreamingDataset:
    """The data ``pre_encode`` wrote, as a ``litdata.StreamingDataset`` of ``(image, label)``.

    Each image is a ``uint8`` CHW tensor (JPEGs are decoded when read); ``transform`` runs on it
    in the loader's workers, e.g. ``torchvision.transforms.v2`` ``RandomResizedCrop`` and
    ``RandomHorizontalFlip``, which take uint8 tensors. End there to ship uint8 and let
    ``DeviceTransform`` normalize on the device, or add ``ToDtype``/``Normalize`` to do it here.

    Args:
        output_dir: ``pre_encode``'s ``output_dir``.
        transform: Applied to each image tensor after reading.
        shuffle: Shuffle chunks and samples each epoch (what training wants).
        **kwargs: Passed to ``litdata.StreamingDataset`` (``seed``, ``drop_last``...).
    """
    from litdata import StreamingDataset

    if not (Path(output_dir) / "index.json").is_file() and "://" not in str(output_dir):
        raise ValueError(
            f"`output_dir` {str(output_dir)!r} holds no LitData index.json; run pre_encode "
            "into it first"
        )
    return StreamingDataset(str(output_dir), shuffle=shuffle, transform=_Pair(transform), **kwargs)
