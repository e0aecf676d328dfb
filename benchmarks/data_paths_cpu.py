"""The data paths of ``lightning_maxtp.data`` on the JPEG workload, loader alone, ratios in one run.

Every configuration is the same data set with the same random crops and flips, measured as
``tune_dataloader`` measures a loader (``measure_candidate``: steady samples/s after warm-up,
the same workers and batch size), rounds interleaved (A, B, C, ... A, B, C ...):

- ``float32``: the usual CPU pipeline, ``RandomResizedCrop``, flip, ``ToTensor``, ``Normalize``.
- ``uint8``: the same ending in ``ToUint8()``; ``DeviceTransform`` normalizes after transfer.
- ``encoded``: ``EncodedImages`` + ``collate_encoded``; workers only read the files, the
  device decodes and crops (``DeviceTransform(decode=True)``).
- ``pre-encoded``: ``pre_encode`` once (uint8 pixels, sizes kept), then
  ``open_pre_encoded`` with the same crop and flip on the stored pixels: no decode.
- ``pre-encoded-small``: the same with the longest side cut to ``--max-side`` once.

The device half's work is measured apart, on this machine's CPU in the main process, per
sample: normalize (uint8 path) and decode + crop + normalize (encoded path). On a GPU it runs on
the device; here it would take the same cores, so the loader rates show what workers deliver and
the device rows what the device takes over. Run from the repository root::

    python -m benchmarks.data_paths_cpu            # ~2 min on 2 CPU cores
    python -m benchmarks.data_paths_cpu --smoke    # seconds: checks the plumbing
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from benchmarks.runner import describe_machine, emit, git_state
from benchmarks.workloads.jpeg import JpegFolderDataset, JpegSpec, generate_jpeg_dataset
from lightning_maxtp.data import EncodedImages, collate_encoded, open_pre_encoded, pre_encode
from lightning_maxtp.data.ops import decode_packed, normalize_uint8, random_resized_crops
from lightning_maxtp.loader.measure import measure_candidate
from lightning_maxtp.resources import inspect_resources

log = logging.getLogger(__name__)

SMOKE = {"images": 64, "image_size": 64, "crop": 32, "max_side": 48, "batch_size": 16,
         "workers": 1, "rounds": 1, "slice": 0.3}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_paths_cpu", description=__doc__)
    p.add_argument("--images", type=int, default=1024, help="JPEGs to generate (1024)")
    p.add_argument("--image-size", type=int, default=256, help="their side in px (256)")
    p.add_argument("--crop", type=int, default=128, help="RandomResizedCrop side (128)")
    p.add_argument("--max-side", type=int, default=160, help="pre-encoded-small side (160)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="loader workers for every config (2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--slice", type=float, default=3.0, help="timed seconds per measurement (3)")
    p.add_argument("--data-dir", type=Path, default=None, help="where the JPEGs go (a temp dir)")
    p.add_argument("--note", default="", help="free text stored with the result")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    p.add_argument("--table-out", type=Path, default=None, help="also write the text here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a run of seconds")
    return p  # fmt: skip


def _loaders(args: argparse.Namespace, root: Path, work: Path) -> tuple[dict[str, Any], dict]:
    """Every configuration's DataLoader, and the pre-encoding runs (one-off costs)."""
    crops = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True), v2.RandomHorizontalFlip()])
    jpeg = JpegFolderDataset(root, crop=args.crop)
    encoded = {}
    for name, side in (("pre-encoded", None), ("pre-encoded-small", args.max_side)):
        result = pre_encode(jpeg, work / name, max_side=side, num_workers=args.workers)
        encoded[name] = result.to_dict()
    kwargs = {"batch_size": args.batch_size, "num_workers": args.workers}
    loaders = {
        "float32": DataLoader(jpeg, shuffle=True, **kwargs),
        "uint8": DataLoader(JpegFolderDataset(root, crop=args.crop, uint8=True), shuffle=True,
                            **kwargs),
        "encoded": DataLoader(EncodedImages(jpeg), shuffle=True, collate_fn=collate_encoded,
                              **kwargs),
        "pre-encoded": DataLoader(open_pre_encoded(work / "pre-encoded", crops, shuffle=True),
                                  **kwargs),
        "pre-encoded-small": DataLoader(
            open_pre_encoded(work / "pre-encoded-small", crops, shuffle=True), **kwargs),
    }  # fmt: skip
    return loaders, encoded


def _per_sample_s(work: Callable[[], Any], samples: int, repeats: int = 5) -> float:
    """Median seconds per sample of ``work`` (one batch), after one untimed call."""
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / samples


def device_half(args: argparse.Namespace, loaders: dict[str, Any]) -> dict[str, float]:
    """Seconds per sample of the device-side steps, on this CPU (a GPU does them on the device)."""
    images, _ = next(iter(DataLoader(loaders["uint8"].dataset, batch_size=args.batch_size)))
    packed, _ = next(iter(DataLoader(loaders["encoded"].dataset, batch_size=args.batch_size,
                                     collate_fn=collate_encoded)))  # fmt: skip
    n = args.batch_size

    def decode() -> torch.Tensor:
        return normalize_uint8(random_resized_crops(decode_packed(packed, "cpu"), args.crop))

    return {
        "uint8": _per_sample_s(lambda: normalize_uint8(images), n),
        "encoded": _per_sample_s(decode, n),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    logging.getLogger("litdata").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*(not writable|deprecated since torchvision)")
    spec = JpegSpec(images=args.images, image_size=args.image_size)
    with tempfile.TemporaryDirectory(prefix="maxtp-data-paths-") as tmp:
        work = Path(tmp)
        root = generate_jpeg_dataset(args.data_dir or work / "jpeg", spec)
        loaders, encoded = _loaders(args, root, work)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
        for r in range(args.rounds):
            for name, loader in loaders.items():
                c = measure_candidate(
                    loader, num_workers=args.workers, prefetch_factor=2, pin_memory=False,
                    threads=1, slice_s=args.slice, deadline=time.perf_counter() + 10 * args.slice,
                )  # fmt: skip
                rounds[name].append(c.to_dict())
                log.info("round %d %s: %.0f samples/s", r + 1, name, c.samples_per_s)
        device = device_half(args, loaders)
    medians = {n: statistics.median(m["samples_per_s"] for m in ms) for n, ms in rounds.items()}
    first = medians["float32"]
    ratios = {n: m / first for n, m in medians.items()}
    shipped = {n: ms[0]["sample_bytes"] for n, ms in rounds.items()}
    machine = inspect_resources().to_dict()
    commit, dirty = git_state()
    lines = [
        f"benchmark: data_paths_cpu ({args.rounds} rounds, {args.workers} workers, batch "
        f"{args.batch_size}; {args.images} JPEGs of {args.image_size} px, crop {args.crop})",
        describe_machine(machine),
        "",
        f"{'config':<18} {'median/s':>9} {'vs float32':>10} {'KiB/sample':>10}  per round",
    ]
    for name in loaders:
        per = " ".join(f"{m['samples_per_s']:.0f}" for m in rounds[name])
        lines.append(f"{name:<18} {medians[name]:>9.0f} {ratios[name]:>9.2f}x "
                     f"{shipped[name] / 1024:>10.1f}  {per}")  # fmt: skip
    lines += [
        "",
        "device half on this CPU, main process (a GPU does it on the device):",
        f"  uint8 normalize: {device['uint8'] * 1e6:.1f} us/sample; encoded decode + crop + "
        f"normalize: {device['encoded'] * 1e6:.1f} us/sample",
        "pre-encoding, once: "
        + "; ".join(
            f"{n}: {e['seconds']:.1f} s, {e['bytes'] / 2**20:.1f} MiB" for n, e in encoded.items()
        ),
        f"pre-encoded vs the uint8 JPEG pipeline: {medians['pre-encoded'] / medians['uint8']:.2f}x"
        f" (small: {medians['pre-encoded-small'] / medians['uint8']:.2f}x)",
    ]
    record = {
        "benchmark": "data_paths_cpu", "params": {k: str(v) for k, v in vars(args).items()},
        "rounds": rounds, "medians": medians, "ratios": ratios, "sample_bytes": shipped,
        "device_half_s_per_sample": device, "pre_encode": encoded, "machine": machine,
        "git_commit": commit, "git_dirty": dirty, "note": args.note,
    }  # fmt: skip
    emit("\n".join(lines), record, json_out=args.out, table_out=args.table_out)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
