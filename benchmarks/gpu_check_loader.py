"""GPU check for ``tune_dataloader``: does the plan feed a GPU as well as an expert?

What it checks, on the JPEG ResNet workload (file read, PIL decode, RandomResizedCrop 224, flip,
normalize; ResNet-50, bf16, channels_last, batch 256), in a few minutes on one H200:

1. The device's consumption rate: training steps on one batch already on the GPU.
2. ``tune_dataloader`` on Lightning's defaults loader with that rate: pinned memory chosen,
   the CPU budget from the probe, tuned within its time budget (15 s).
3. Real ``Trainer.fit`` runs, A/B: Lightning defaults (0 workers), hand-tuned (the reference
   job's anchor: CPUs - 1 workers, prefetch 4, pinned, persistent) and the plan. The plan must be
   within 10 % of hand-tuned and at least 2x the defaults.
4. The GPU-marked loader tests (``tests/loader/test_tune.py -k gpu``).

Prints a table, then one JSON line. ``--smoke`` (or no GPU) runs tiny sizes on the CPU with the
GPU items reported as skipped, so the script itself is tested on a CPU.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_loader.py [--smoke | --quick] [--out FILE]``
(``--quick``: 1,024 images and one round, the run inside ``gpu_check_all``.)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.checks import check, finish, run_gpu_tests  # noqa: E402
from benchmarks.loader_jpeg import plan_settings, step_rate  # noqa: E402
from benchmarks.runner import Config, run_ab, time_fit  # noqa: E402
from benchmarks.workloads.jpeg import (  # noqa: E402
    ImageClassifier,
    JpegFolderDataset,
    JpegSpec,
    LoaderSettings,
    default_data_dir,
    generate_jpeg_dataset,
    make_loader,
)
from lightning_maxtp.loader import tune_dataloader  # noqa: E402
from lightning_maxtp.resources import inspect_resources  # noqa: E402

FULL = {"images": 2048, "image_size": 288, "crop": 224, "batch": 256, "model": "resnet50",
        "warmup": 5, "steps": 30, "rounds": 2, "budget": 15.0}  # fmt: skip
QUICK = {**FULL, "images": 1024, "steps": 20, "rounds": 1, "budget": 10.0}
"""The GPU run inside ``gpu_check_all`` (its 8-minute slot): half the images, one round."""
SMOKE = {"images": 64, "image_size": 48, "crop": 32, "batch": 16, "model": "resnet18",
         "warmup": 1, "steps": 2, "rounds": 1, "budget": 3.0}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--quick", action="store_true", help="a shorter GPU run (gpu_check_all)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: the shared sets")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*(does not have many workers|LeafSpec)")
    gpu = torch.cuda.is_available() and not args.smoke
    size = (QUICK if args.quick else FULL) if gpu else SMOKE
    device = torch.device("cuda" if gpu else "cpu")
    rows: list[dict[str, Any]] = []
    res = inspect_resources()

    start = time.perf_counter()
    spec = JpegSpec(size["images"], size["image_size"], classes=10)
    root = generate_jpeg_dataset(
        (args.data_dir / spec.slug()) if args.data_dir else default_data_dir(spec), spec
    )
    dataset = JpegFolderDataset(root, crop=size["crop"])
    check(
        rows, "JPEG data set", True, f"{len(dataset)} images in {time.perf_counter() - start:.0f} s"
    )

    def model() -> ImageClassifier:
        return ImageClassifier(size["model"], 10, channels_last=gpu)

    batch = next(iter(make_loader(dataset, LoaderSettings(batch_size=size["batch"]))))
    rate = step_rate(model(), batch, device=device, steps=10 if gpu else 2, bf16=gpu)
    check(
        rows, "consumption rate", True, f"{rate:,.0f} samples/s ({size['model']}, data on device)"
    )

    defaults = LoaderSettings(batch_size=size["batch"])
    plan = tune_dataloader(make_loader(dataset, defaults), consumption_rate=rate,
                           time_budget_s=size["budget"])  # fmt: skip
    print(plan, "\n")
    check(rows, "tuned within budget", plan.elapsed_s <= size["budget"] + 3,
          f"{plan.elapsed_s:.1f} s of {size['budget']:g} s")  # fmt: skip
    check(rows, "pin_memory on a GPU", plan.pin_memory if gpu else None,
          str(plan.pin_memory) if gpu else "skipped: no GPU")  # fmt: skip
    budget = res.advice.cpu_workers_per_process
    check(rows, "CPU budget from the probe", plan.budget.cpu_workers == budget,
          f"{plan.budget.cpu_workers} workers ({plan.budget.cpu_source})")  # fmt: skip

    workers = max(res.cpu.effective - 1, 0)
    hand = LoaderSettings(size["batch"], workers, 4 if workers else None, gpu, workers > 0)
    configs = {"lightning-defaults": defaults, "hand-tuned": hand,
               "plan": plan_settings(plan, size["batch"])}  # fmt: skip

    def run(settings: LoaderSettings) -> Any:
        steps = size["warmup"] + size["steps"] + settings.queue_depth  # loading to the end
        loader = make_loader(dataset, settings, steps=steps)
        return time_fit(model(), loader, warmup_steps=size["warmup"], steps=size["steps"],
                        accelerator=device.type,
                        precision="bf16-mixed" if gpu else "32-true")  # fmt: skip

    result = run_ab("gpu_check_loader",
                    [Config(n, lambda s=s: run(s), s.to_dict()) for n, s in configs.items()],
                    rounds=size["rounds"], machine=res.to_dict())  # fmt: skip
    med = result.medians()
    vs_hand = med["plan"] / med["hand-tuned"]
    vs_defaults = med["plan"] / med["lightning-defaults"]
    detail = ", ".join(f"{k} {v:,.0f}/s" for k, v in med.items())
    check(rows, "plan >= 0.9x hand-tuned", vs_hand >= 0.9 if gpu else None,
          f"{vs_hand:.2f}x ({detail})")  # fmt: skip
    check(rows, "plan >= 2x Lightning defaults", vs_defaults >= 2 if gpu else None,
          f"{vs_defaults:.2f}x")  # fmt: skip
    if gpu:
        run_gpu_tests(rows, "tests/loader/test_tune.py", "gpu")
    else:
        check(rows, "GPU checks", None, "skipped: no GPU visible (or --smoke)")
    return finish("gpu_check_loader", rows, args.out, name_width=32, consumption_rate=rate,
                  plan=plan.to_dict(), fits=result.to_dict())  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
