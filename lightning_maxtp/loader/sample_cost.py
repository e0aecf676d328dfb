"""What one sample costs the loader: the whole ``dataset[i]``, and its file's decode if it has one.

The data path a pipeline short of CPUs should take depends on where a sample's time goes: when
the JPEG decode is most of it, only decoding elsewhere (the GPU) or once (pre-encoding) helps;
when it is a small part, shipping uint8 and normalizing on the device removes the rest. A few
samples are timed in this process, which is enough to tell the two apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["SampleCosts", "SampleError", "batch_facts", "file_samples", "measure_sample_costs"]


class SampleError(RuntimeError):
    """A sample raised while its cost was timed (the dataset's own error is its cause)."""


@dataclass(frozen=True)
class SampleCosts:
    """Seconds per sample, measured in this process on a few samples.

    Attributes:
        samples: How many samples were timed.
        per_sample_s: Median seconds of ``dataset[i]`` (read, decode, transform).
        decode_s: Median seconds to read and decode the same samples' files to RGB pixels, when
            the dataset lists its files (``None``: not measurable, or longer than a whole
            sample: the samples do not decode their files).
        files: ``"jpeg"``, ``"png"``... the files' format when they were read, else ``None``.
    """

    samples: int
    per_sample_s: float
    decode_s: float | None = None
    files: str | None = None

    @property
    def decode_share(self) -> float | None:
        """Decode's share of a sample's time (capped at 1), when measured."""
        if self.decode_s is None or self.per_sample_s <= 0:
            return None
        return min(1.0, self.decode_s / self.per_sample_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {**asdict(self), "decode_share": self.decode_share}


def file_samples(dataset: Any) -> list[tuple[Path, int]] | None:
    """``(path, label)`` pairs of a dataset that lists its files, else ``None``.

    Accepts torchvision's ``ImageFolder``/``DatasetFolder`` (and anything with a ``samples``
    list of ``(path, label)``) or such a sequence itself.
    """
    pairs = getattr(dataset, "samples", dataset)
    if not isinstance(pairs, Sequence) or isinstance(pairs, str | bytes) or not pairs:
        return None
    first = pairs[0]
    if not (isinstance(first, Sequence) and len(first) == 2 and isinstance(first[0], str | Path)):
        return None
    return [(Path(path), int(label)) for path, label in pairs]


def batch_facts(batch: Any) -> tuple[int, int, str | None]:
    """``(samples, tensor bytes, dtype of its largest 4-D tensor or None)`` of a batch.

    Samples come from the first tensor's first dimension.
    """
    import torch

    tensors: list[torch.Tensor] = []
    stack = [batch]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    samples = int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else 1
    images = [t for t in tensors if t.dim() == 4]
    largest = max(images, key=lambda t: t.numel() * t.element_size(), default=None)
    dtype = None if largest is None else str(largest.dtype).removeprefix("torch.")
    return samples, sum(t.numel() * t.element_size() for t in tensors), dtype


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _decode_s(path: Path) -> float:
    from PIL import Image

    started = time.perf_counter()
    with Image.open(path) as image:
        image.convert("RGB").load()
    return time.perf_counter() - started


def measure_sample_costs(dataset: Any, count: int = 8, budget_s: float = 1.0) -> SampleCosts | None:
    """Time ``count`` samples of a map-style dataset (``None`` when they cannot be indexed).

    The samples are spread over the data set. The first is always timed; no later one starts
    when the slowest so far says it would end past ``budget_s``, so the samples take at most
    about ``budget_s`` (a caller in a fit's first step waits for them), plus the first one
    when it alone is slower. The random state the dataset's transforms use is not restored:
    call it under ``order.preserved_rng``.
    """
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    try:
        size = len(dataset)
    except TypeError:
        return None
    if size < 1:
        return None
    indices = sorted({i * size // min(count, size) for i in range(min(count, size))})
    spent: list[float] = []
    for position, index in enumerate(indices):
        if spent and sum(spent) + max(spent) > budget_s:  # the ones timed so far tell enough
            indices = indices[:position]
            break
        started = time.perf_counter()
        try:
            dataset[index]
        except Exception as err:  # the dataset's own error, whatever its type
            raise SampleError(f"dataset[{index}] raised {type(err).__name__}: {err}") from err
        spent.append(time.perf_counter() - started)
    files = file_samples(dataset)
    if files is None or len(files) != size:
        return SampleCosts(len(indices), _median(spent))
    try:
        decode = [_decode_s(files[i][0]) for i in indices]
    except (ImportError, OSError, ValueError):  # not images PIL reads: decode stays unknown
        return SampleCosts(len(indices), _median(spent))
    suffix = files[indices[0]][0].suffix.lower().lstrip(".")
    per_sample, decode_s = _median(spent), _median(decode)
    # A sample faster than decoding its file does not decode it (it returns the file's bytes,
    # or a cache): decode is then no part of the loader's time. Decided on the fastest of each,
    # as other processes' load only adds time: on a loaded machine the medians of a sample that
    # reads 0.08 ms of bytes and a decode of 0.23 ms came out 0.83 and 0.74 ms.
    decodes = min(decode) <= min(spent)
    return SampleCosts(
        len(indices),
        per_sample,
        decode_s if decodes else None,
        "jpeg" if suffix == "jpg" else suffix,
    )
