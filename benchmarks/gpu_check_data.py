"""GPU check for ``lightning_maxtp.data``: which data path feeds the GPU past the CPUs' limit?

The JPEG ResNet-50 reference job (288 px JPEGs, RandomResizedCrop 224, flip; bf16-mixed,
channels_last, batch 256: the batch ``find_batch_size`` picks there is measured by
``gpu_check_batch_size``, this check keeps 256 to fit its slot), real ``Trainer.fit`` runs, one
after another:

(a) ``expert``: the expert's CPU pipeline (ToTensor, Normalize in workers), CPUs - 1 workers,
    prefetch 4, pinned, persistent;
(b) ``uint8``: the same ending in ``ToUint8()``, ``DeviceTransform()`` normalizes on the GPU;
(c) ``gpu-decode``: ``EncodedImages`` + ``collate_encoded``, decoded and cropped on the GPU
    (``DeviceTransform(decode=True, crop=224, flip=True)``, nvJPEG);
(d) ``pre-encoded``: ``pre_encode`` once (uint8, sizes kept), ``open_pre_encoded`` with the
    crop and flip after reading (skipped when LitData is not installed).

Target: the best path >= 4,700 img/s (the GPU alone does ~5,000; the expert 2,493). Prints a
table, then one JSON line. ``--smoke`` (or no GPU) runs tiny sizes on the CPU, the GPU target
reported as skipped, so the script itself is tested on a CPU.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_data.py [--smoke | --quick] [--out FILE]``
(``--quick``: 1,024 images, the run inside ``gpu_check_all``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from benchmarks.checks import check, finish  # noqa: E402
from benchmarks.runner import time_fit  # noqa: E402
from benchmarks.targets import DATA_PATH  # noqa: E402
from benchmarks.workloads.jpeg import (  # noqa: E402
    ImageClassifier,
    JpegFolderDataset,
    JpegSpec,
    default_data_dir,
    generate_jpeg_dataset,
)
from lightning_maxtp.data import (  # noqa: E402
    DeviceTransform,
    EncodedImages,
    collate_encoded,
    open_pre_encoded,
    pre_encode,
)
from lightning_maxtp.resources import inspect_resources  # noqa: E402

FULL = {"images": 2048, "image_size": 288, "crop": 224, "batch": 256, "model": "resnet50",
        "warmup": 5, "steps": 25}  # fmt: skip
QUICK = {**FULL, "images": 1024, "steps": 15}
SMOKE = {"images": 48, "image_size": 48, "crop": 32, "batch": 8, "model": "resnet18",
         "warmup": 1, "steps": 2}  # fmt: skip
TARGET = DATA_PATH


def check_decoded_pixels(rows: list[dict[str, Any]], root: Path, gpu: bool, rounds: int) -> None:
    """Check nvJPEG's pixels against the CPU's, decoded while the step's stream has work queued.

    The hazard ``decode_packed`` guards against: each round queues work, then reads of tensors
    of ones, frees those tensors while the reads are still queued, then decodes. A decoder
    that writes into a freed block before the queued reads ran changes their sums. Decoders
    differ by a grey level or two (IDCT), a corrupted image by far more.
    """
    from torchvision.io import read_file

    from lightning_maxtp.data.ops import decode_packed, pack_encoded

    files = sorted(root.rglob("*.jpg"))[:32]
    if not files:
        check(rows, "nvJPEG pixels vs CPU", False, f"no JPEG under {root}")
        return
    packed = pack_encoded([read_file(str(f)) for f in files])
    want = [image.float() for image in decode_packed(packed, "cpu")]
    device = "cuda" if gpu else "cpu"
    side = 1024 if gpu else 64
    worst, wrong_sums = 0.0, 0
    for _ in range(rounds):
        busy = torch.randn(side, side, device=device)
        for _ in range(50):  # work queued ahead of the reads
            busy = busy @ busy / side
        ones = [torch.ones(side, side, device=device) for _ in range(16)]
        sums = [t.sum() for t in ones]
        del ones  # freed while their reads are still queued
        images = decode_packed(packed, device)
        wrong_sums += sum(float(total) != side * side for total in sums)
        pairs = zip(images, want, strict=True)
        worst = max(worst, *(float((a.cpu().float() - b).abs().mean()) for a, b in pairs))
    ok = worst < 2.0 and wrong_sums == 0
    detail = (
        f"{len(files)} images x {rounds} rounds with work queued: worst mean difference "
        f"{worst:.2f} grey levels, {wrong_sums} corrupted sums" + ("" if gpu else "; no GPU")
    )
    # On the CPU both sides are libjpeg: anything but equal is the check's own bug.
    check(rows, "nvJPEG pixels vs CPU", ok if gpu else (None if ok else False), detail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--quick", action="store_true", help="a shorter GPU run (gpu_check_all)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: the shared sets")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*(many workers|LeafSpec|not writable|deprec)")
    gpu = torch.cuda.is_available() and not args.smoke
    size = (QUICK if args.quick else FULL) if gpu else SMOKE
    rows: list[dict[str, Any]] = []
    res = inspect_resources()
    workers = max(res.cpu.effective - 1, 1)
    started = time.perf_counter()
    spec = JpegSpec(size["images"], size["image_size"], classes=10)
    root = generate_jpeg_dataset(
        (args.data_dir / spec.slug()) if args.data_dir else default_data_dir(spec), spec
    )
    check(
        rows,
        "JPEG data set",
        True,
        f"{spec.images} images in {time.perf_counter() - started:.0f} s",
    )
    check_decoded_pixels(rows, root, gpu, rounds=20 if gpu else 2)
    steps = size["warmup"] + size["steps"]
    kwargs = {"batch_size": size["batch"], "num_workers": workers, "prefetch_factor": 4,
              "pin_memory": gpu, "persistent_workers": True, "drop_last": True}  # fmt: skip

    def enough(dataset: Any) -> Any:
        # Every path draws the same number of full batches: the data set repeated as needed.
        repeats = -(-steps * size["batch"] // len(dataset)) + 1
        return torch.utils.data.ConcatDataset([dataset] * repeats)

    crop = size["crop"]
    paths: dict[str, tuple[Any, list[Any]]] = {
        "expert": (DataLoader(enough(JpegFolderDataset(root, crop=crop)), shuffle=True, **kwargs),
                   []),
        "uint8": (DataLoader(enough(JpegFolderDataset(root, crop=crop, uint8=True)), shuffle=True,
                             **kwargs), [DeviceTransform()]),
        "gpu-decode": (DataLoader(enough(EncodedImages(JpegFolderDataset(root, crop=crop))),
                                  shuffle=True, collate_fn=collate_encoded, **kwargs),
                       [DeviceTransform(decode=True, crop=crop, flip=True)]),
    }  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="maxtp-gpu-check-data-")
    if importlib.util.find_spec("litdata") is not None:
        t0 = time.perf_counter()
        # A CPU run forks LitData's workers: spawned, each re-imports torch and Lightning,
        # which took most of the smoke run's time for its 48 images.
        written = pre_encode(JpegFolderDataset(root, crop=crop), Path(tmp.name) / "enc",
                             max_side=None, num_workers=workers,
                             start_method=None if gpu else "fork")  # fmt: skip
        check(rows, "pre_encode", True, f"{written} ({time.perf_counter() - t0:.0f} s)")
        crops = v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()])
        stream = open_pre_encoded(Path(tmp.name) / "enc", crops, shuffle=True)
        per_epoch = len(stream) // (size["batch"] * workers) * workers
        if per_epoch >= steps:
            paths["pre-encoded"] = (DataLoader(stream, **kwargs), [DeviceTransform()])
        else:
            check(rows, "pre-encoded", None, f"skipped: {per_epoch} batches per epoch < {steps}")
    else:
        check(rows, "pre-encoded", None, "skipped: LitData is not installed ([data] extra)")
    rates: dict[str, float] = {}
    for name, (loader, callbacks) in paths.items():
        model = ImageClassifier(size["model"], 10, channels_last=gpu)
        try:
            m = time_fit(model, loader, warmup_steps=size["warmup"], steps=size["steps"],
                         accelerator="cuda" if gpu else "cpu",
                         precision="bf16-mixed" if gpu else "32-true",
                         trainer_kwargs={"callbacks": callbacks})  # fmt: skip
        except Exception as err:  # one path failing must not hide the others
            check(rows, f"path {name}", False, f"{type(err).__name__}: {err}"[:300])
            continue
        rates[name] = m.samples_per_s
        check(rows, f"path {name}", True, f"{m.samples_per_s:,.0f} img/s")
    tmp.cleanup()
    best = max(rates, key=lambda n: rates[n], default=None)
    detail = ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
    if best is None:
        check(rows, f"best path >= {TARGET:,.0f} img/s", False, "no path ran")
    else:
        text = f"{best} {rates[best]:,.0f} img/s ({detail})" + ("" if gpu else "; no GPU")
        check(rows, f"best path >= {TARGET:,.0f} img/s", rates[best] >= TARGET if gpu else None,
              text)  # fmt: skip
    if "expert" in rates and best is not None:
        check(rows, "best path vs the expert's pipeline", None,
              f"{rates[best] / rates['expert']:.2f}x")  # fmt: skip
    return finish("gpu_check_data", rows, args.out, name_width=34, rates=rates,
                  workers=workers, sizes=size)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
