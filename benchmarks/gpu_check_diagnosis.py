"""GPU check of the diagnosis: does ``BottleneckMonitor`` name each planted GPU bottleneck right?

Each case is a real ``Trainer.fit`` on one GPU whose limit is known by construction:

| case | planted | expected |
|---|---|---|
| many-tiny-kernels | 60-layer MLP, width 64, batch 8 | kernel_launch |
| item-and-pageable | 30 ``.item()`` syncs per step, pageable batches | host_overhead |
| vram-nearly-full | a blocker tensor fills the GPU to ~95 % | vram |
| big-model-cached | 4 x 8192 MLP, batch 1024, data already on the GPU | compute |
| jpeg-0-workers | resnet18 on JPEGs decoded by PIL in the main process | data_pipeline |

The monitor runs with ``capture="auto"``, so the ambiguous cases get a profiler capture, during
which the device syncs are counted by line (the item-and-pageable case must name the ``.item()``
line of ``Mlp``). Each row also prints the distance to the limit (MFU against the measured peak,
or the loader's share) and the energy per sample where NVML has the counter. Then
the monitor's overhead is measured A/B/A/B on the compute case. Prints a table (expected vs
named, confidence, the first recommendation, the capture) and one JSON line.

On a machine without a GPU (or with ``--smoke``) the GPU cases are reported as skipped and one
CPU case (heavy transform, 0 workers -> data_pipeline) checks the plumbing.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_diagnosis.py [--smoke] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from benchmarks.checks import emit  # noqa: E402
from lightning_maxtp.callbacks import BottleneckMonitor  # noqa: E402


class Mlp(pl.LightningModule):
    """MLP classifier; ``syncs`` adds that many ``.item()`` calls per step."""

    def __init__(self, features: int, hidden: int, depth: int, syncs: int = 0) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(hidden, 10))
        self.syncs = syncs

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        for _ in range(self.syncs):  # the classic: logging a Python float every step
            _ = (loss * 1.0).item()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Ready batches (on ``device``): fetching costs an index."""

    def __init__(self, n: int, batch: int, features: int, device: str = "cpu") -> None:
        self.x = torch.randn(n, batch, features, device=device)
        self.y = torch.randint(0, 10, (n, batch), device=device)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class HeavyTransform(Dataset[tuple[torch.Tensor, int]]):
    """Pure-Python CPU work per sample (stands in for decoding)."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        acc = sum(k * k % 7 for k in range(20_000))
        return torch.full((32,), float(acc % 3)), i % 2


Fitted = tuple[BottleneckMonitor | None, float]


def fit(module: pl.LightningModule, loader: DataLoader[Any], steps: int, window: int,
        accelerator: str = "cuda", monitor: bool = True) -> Fitted:  # fmt: skip
    mon = BottleneckMonitor(window_steps=window, verbose=False) if monitor else None
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[mon] if mon else [],
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, loader)
    return mon, time.perf_counter() - start


def case_kernel_launch() -> BottleneckMonitor | None:
    return fit(Mlp(64, 64, 60), DataLoader(Batches(64, 8, 64), batch_size=None), 300, 60)[0]


def case_host_overhead() -> BottleneckMonitor | None:
    # 30 .item() per step; 2 MB pageable batches (small, so the copy - which Lightning does
    # before on_train_batch_start - stays a small part of the measured data wait)
    data = Batches(16, 512, 1024)
    return fit(Mlp(1024, 512, 2, syncs=30), DataLoader(data, batch_size=None), 150, 40)[0]


def case_vram() -> BottleneckMonitor | None:
    free, total = torch.cuda.mem_get_info()
    blocker = torch.empty(int(free - 0.05 * total), dtype=torch.uint8, device="cuda")
    try:
        return fit(Mlp(512, 1024, 2), DataLoader(Batches(16, 256, 512), batch_size=None),
                   120, 40)[0]  # fmt: skip
    finally:
        del blocker
        torch.cuda.empty_cache()


def case_compute() -> BottleneckMonitor | None:
    data = Batches(8, 1024, 8192, device="cuda")
    return fit(Mlp(8192, 8192, 4), DataLoader(data, batch_size=None), 120, 40)[0]


def case_data_pipeline() -> BottleneckMonitor | None:
    from benchmarks.workloads import jpeg

    root = Path(tempfile.gettempdir()) / "maxtp-gpu-check-jpeg"
    jpeg.generate_jpeg_dataset(root, jpeg.JpegSpec(images=512, image_size=256, classes=10))
    loader = DataLoader(jpeg.JpegFolderDataset(root, crop=224), batch_size=64, num_workers=0,
                        shuffle=True)  # fmt: skip
    return fit(jpeg.ImageClassifier("resnet18", num_classes=10), loader, 40, 15)[0]


def case_cpu_smoke() -> BottleneckMonitor | None:
    return fit(Mlp(32, 64, 1), DataLoader(HeavyTransform(), batch_size=16), 30, 12, "cpu")[0]


CASES: list[tuple[str, str, Callable[[], BottleneckMonitor | None], bool]] = [
    ("many-tiny-kernels", "kernel_launch", case_kernel_launch, True),
    ("item-and-pageable", "host_overhead", case_host_overhead, True),
    ("vram-nearly-full", "vram", case_vram, True),
    ("big-model-cached", "compute", case_compute, True),
    ("jpeg-0-workers", "data_pipeline", case_data_pipeline, True),
    ("cpu-heavy-transform", "data_pipeline", case_cpu_smoke, False),
]


def overhead(rounds: int) -> dict[str, Any]:
    """Wall time of the compute case with/without the monitor, alternating (A/B/A/B)."""
    ratios = []
    for _ in range(rounds):
        times = {}
        for on in (False, True):
            data = Batches(8, 1024, 8192, device="cuda")
            torch.cuda.synchronize()
            times[on] = fit(Mlp(8192, 8192, 4), DataLoader(data, batch_size=None), 200, 50,
                            monitor=on)[1]  # fmt: skip
        ratios.append(times[True] / times[False])
    return {"per_round_time_ratio": ratios, "median_overhead": statistics.median(ratios) - 1}


def run_case(
    name: str, expected: str, fn: Callable[[], BottleneckMonitor | None]
) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        mon = fn()
    except Exception as err:  # report and go on: one broken case must not hide the others
        return {"case": name, "expected": expected, "named": None, "ok": False,
                "detail": f"{type(err).__name__}: {err}"}  # fmt: skip
    assert mon is not None
    top = mon.report.diagnoses[0] if mon.report.diagnoses else None
    syncs = next((w.syncs for w in reversed(mon.windows) if w.syncs is not None), None)
    ok = top is not None and top.kind.value == expected
    if name == "item-and-pageable":  # the sync counter must find the .item() line of Mlp
        ok = ok and syncs is not None and any(Path(__file__).name in line
                                              for line, _ in syncs.sources)  # fmt: skip
    limit = mon.report.limit
    return {
        "case": name, "expected": expected, "named": top.kind.value if top else None,
        "ok": ok,
        "syncs": None if syncs is None else str(syncs),
        "limit": None if limit is None else str(limit),
        "joules_per_sample": mon.report.joules_per_sample,
        "confidence": None if top is None else round(top.confidence, 2),
        "first_knob": str(top.recommendations[0]) if top and top.recommendations else None,
        "evidence": None if top is None else top.evidence,
        "capture": str(mon.captures[0]) if mon.captures else None,
        "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="skip the GPU cases")
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    gpu = torch.cuda.is_available() and not args.smoke
    rows = []
    if args.overhead_rounds < 0:
        parser.error(
            f"--overhead-rounds must be >= 0 (0: not measured), got {args.overhead_rounds}"
        )
    for name, expected, fn, needs_gpu in CASES:
        if needs_gpu and not gpu:
            rows.append({"case": name, "expected": expected, "named": None, "ok": None,
                         "detail": "skipped: no GPU"})  # fmt: skip
        else:
            rows.append(run_case(name, expected, fn))
            rows[-1].setdefault("detail", f"expected {expected}, named {rows[-1]['named']}")
        emit(rows[-1])
    over = (
        {"skipped": "no GPU"} if not gpu
        else {"skipped": "--overhead-rounds 0"} if args.overhead_rounds == 0
        else overhead(args.overhead_rounds)
    )  # fmt: skip
    print()
    print(f"{'case':<22} {'expected':<14} {'named':<14} {'ok':<5} conf  first knob / detail")
    for r in rows:
        ok = {True: "yes", False: "NO", None: "skip"}[r["ok"]]
        detail = r.get("first_knob") or r.get("detail") or ""
        print(f"{r['case']:<22} {r['expected']:<14} {r['named'] or '-':<14} {ok:<5} "
              f"{r.get('confidence') or '-':<5} {detail}")  # fmt: skip
        for key in ("capture", "syncs", "limit", "joules_per_sample"):
            if r.get(key) is not None:
                print(f"{'':<22} {key}: {r[key]}")
    print(f"\nmonitor overhead: {over}")
    from lightning_maxtp.resources import inspect_resources

    line = json.dumps({"check": "gpu_check_diagnosis", "rows": rows, "overhead": over,
                       "machine": inspect_resources().to_dict()}, default=str)  # fmt: skip
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
