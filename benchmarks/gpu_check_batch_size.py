"""GPU check for the batch-size search: real ceiling, knee, Lightning's finder.

What it checks, with ResNet-50 (random init, bf16-mixed, 224 px synthetic images, SGD), from a
real Trainer's ``on_fit_start``, in a few minutes on an H200:

1. ``find_batch_size`` with the default 20 s budget: a real ``torch.OutOfMemoryError`` bounds
   the search (the ceiling), the throughput table, the knee, the time taken; afterwards the
   device's allocated memory equals its value before (exactly) and the weights are bit-for-bit
   the same.
2. The same under ``torch.cuda.set_per_process_memory_fraction(--fraction)``: a lower ceiling,
   and the plan's batch then trains ``--train-steps`` steps under that cap without running out.
3. Lightning's BatchSizeFinder (``Tuner.scale_batch_size``, power mode; ``--binsearch`` adds
   binsearch) on the same model: its pick and its time, and the throughput at its pick measured
   with the same timed step as ours.
4. The GPU-marked tests of ``tests/batch_size/test_find.py``.

Prints a table, then one JSON line. ``--smoke`` (or no GPU) runs the same plumbing on the CPU
with resnet18 at 32 px and a cap of 16, and reports the GPU items as skipped.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_batch_size.py [--binsearch] [--out FILE]``
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.checks import check, finish, run_gpu_tests  # noqa: E402
from benchmarks.workloads.jpeg import ImageClassifier  # noqa: E402
from lightning_maxtp.batch_size import BatchSizePlan, find_batch_size  # noqa: E402

_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """The same uint8 image every time (4x less to collate than float32), many labels."""

    def __init__(self, length: int, size: int, classes: int) -> None:
        self.length, self.classes = length, classes
        self.image = torch.randint(0, 256, (3, size, size), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.image, i % self.classes


class Model(ImageClassifier):
    """``ImageClassifier`` with the ``batch_size`` both finders resize, normalizing on device."""

    def __init__(self, args: argparse.Namespace, batch_size: int = 32) -> None:
        super().__init__(args.model, num_classes=1000, optimizer="sgd", lr=0.1)
        self.batch_size, self.args = batch_size, args

    def train_dataloader(self) -> DataLoader[Any]:
        data = SyntheticImages(4 * self.args.cap, self.args.size, 1000)
        return DataLoader(data, batch_size=self.batch_size, shuffle=False, drop_last=True)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return (x.float() - _MEAN.to(x.device)) / _STD.to(x.device), y


class Search(pl.Callback):
    """Search in ``on_fit_start`` with memory and weights checked around it; then stop."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.plan = kwargs, None
        self.memory: tuple[int, int] = (0, 0)
        self.weights_equal = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = trainer.strategy.root_device
        cuda = device.type == "cuda"
        if cuda:
            # cuBLAS keeps a workspace from its first call: take it before the baseline.
            size = pl_module.args.size
            x = torch.randn(2, 3, size, size, device=device)
            with trainer.precision_plugin.forward_context():
                loss = pl_module(x).float().sum()
            loss.backward()
            pl_module.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
        weights = [t.detach().cpu().clone() for t in pl_module.state_dict().values()]
        before = torch.cuda.memory_allocated() if cuda else 0
        self.plan = find_batch_size(pl_module, trainer=trainer, **self.kwargs)
        after = torch.cuda.memory_allocated() if cuda else 0
        self.memory = (before, after)
        now = [t.detach().cpu() for t in pl_module.state_dict().values()]
        self.weights_equal = all(torch.equal(a, b) for a, b in zip(weights, now, strict=True))
        trainer.should_stop = True


def trainer_for(args: argparse.Namespace, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator=args.accelerator, devices=1, precision=args.precision, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(args.work_dir), **kwargs,
    )  # fmt: skip


def run_search(args: argparse.Namespace, **kwargs: Any) -> tuple[Search, float]:
    callback = Search(**{"max_batch_size": args.cap, "time_budget_s": args.budget, **kwargs})
    start = time.perf_counter()
    trainer_for(args, max_steps=1, callbacks=[callback]).fit(Model(args))
    seconds = time.perf_counter() - start
    _release()
    return callback, seconds


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rate_at(args: argparse.Namespace, batch: int) -> float | None:
    """Throughput at one batch, timed by the same trial as the search (no data loading)."""
    callback, _ = run_search(args, init_batch_size=batch, max_batch_size=batch, margin=0.0)
    plan = callback.plan
    return None if plan is None else plan.samples_per_s(batch)


def budget_kept(plan: BatchSizePlan, budget: float, fit_s: float, gpu: bool) -> tuple[bool, str]:
    """Whether the search kept its time budget, and the times that say so.

    The search's rule is that no trial starts once the trials before it spent the budget; a
    trial that started in time may still end past it. On the GPU (a machine to ourselves) the
    whole search must also end within 1.25x the budget. In ``--smoke`` mode the CPU is shared
    with whatever else runs (CI runs three checks beside its test workers), so the wall time is
    printed but only the rule is checked.
    """
    spent, late = 0.0, []
    for trial in plan.trials:
        if spent >= budget:
            late.append(trial.batch_size)
        spent += trial.seconds
    ok = not late and (not gpu or plan.seconds <= 1.25 * budget)
    detail = (
        f"{plan.seconds:.1f} s search of {budget:g} s, {fit_s:.1f} s fit call, "
        f"{len(plan.trials)} trials"
    )
    return ok, detail + (f"; started after the budget: {late}" if late else "")


def search_checks(
    rows: list[dict[str, Any]], args: argparse.Namespace, gpu: bool
) -> dict[str, Any]:
    found, seconds = run_search(args)
    plan: BatchSizePlan | None = found.plan
    assert plan is not None
    print(plan, flush=True)
    out: dict[str, Any] = {"plan": plan.to_dict(), "fit_call_s": round(seconds, 2)}
    fastest, best = plan.samples_per_s(plan.fastest_batch_size), None
    if plan.best_batch_size is not None:
        best = plan.samples_per_s(plan.best_batch_size)
    detail = (f"fastest {plan.fastest_batch_size} ({fastest or 0:,.0f}/s) vs best "
              f"{plan.best_batch_size} ({best or 0:,.0f}/s)")  # fmt: skip
    ok = bool(fastest and best and fastest >= (1 - plan.tolerance) * best)
    check(rows, "knee: smallest batch near the best", ok and
          plan.fastest_batch_size <= plan.safe_max_batch_size, detail)  # fmt: skip
    check(rows, "search time (budget)", *budget_kept(plan, args.budget, seconds, gpu))
    check(rows, "weights bit-for-bit after search", found.weights_equal, "state_dict compared")
    if not gpu:
        check(rows, "GPU checks", None, "skipped: no GPU (ceiling, memory baseline, fraction)")
        return out
    exact = plan.first_oom == (plan.ceiling or 0) + 1
    check(rows, "real OOM bounds the search", plan.ceiling is not None and plan.bound == "memory",
          f"ceiling {plan.ceiling}, first OOM {plan.first_oom} (exact: {exact})")  # fmt: skip
    before, after = found.memory
    check(rows, "allocated memory back to baseline", before == after, f"{before} -> {after} bytes")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(args.fraction)
    try:
        capped, _ = run_search(args)
        cplan = capped.plan
        assert cplan is not None
        out["fraction_plan"] = cplan.to_dict()
        ratio = (cplan.ceiling or 0) / max(1, plan.ceiling or 1)
        check(rows, f"fraction {args.fraction:g}: lower ceiling", bool(cplan.ceiling) and
              ratio < 1.0, f"ceiling {cplan.ceiling} vs {plan.ceiling} ({ratio:.2f}x) of "
              f"{total / 2**30:.0f} GiB")  # fmt: skip
        # The largest batch the plan allows (the margin's edge), trained for real under the cap.
        largest = cplan.safe_max_batch_size
        try:
            trainer_for(args, max_steps=args.train_steps).fit(Model(args, batch_size=largest))
            trained, why = True, f"{args.train_steps} steps at {largest}"
        except torch.OutOfMemoryError as exc:
            trained, why = False, f"at {largest}: " + str(exc).splitlines()[0][:80]
        check(rows, "safe maximum trains under the cap", trained, why)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        _release()
    return out


def lightning_checks(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from lightning.pytorch.tuner import Tuner

    out: dict[str, Any] = {}
    for mode in ("power", "binsearch") if args.binsearch else ("power",):
        model = Model(args)
        start = time.perf_counter()
        picked = Tuner(trainer_for(args)).scale_batch_size(model, mode=mode, max_val=args.cap)
        seconds = time.perf_counter() - start
        _release()
        rate = rate_at(args, int(picked)) if picked else None
        out[mode] = {"pick": picked, "seconds": round(seconds, 2), "samples_per_s": rate}
        check(rows, f"lightning {mode}", None, f"picks {picked} in {seconds:.1f} s, "
              f"{rate or 0:,.0f} samples/s at it")  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing run, tiny sizes")
    parser.add_argument("--binsearch", action="store_true", help="also Lightning's binsearch")
    parser.add_argument(
        "--quick", action="store_true",
        help="8 s searches, no Lightning comparison, no pytest (gpu_check_all's compact run)",
    )  # fmt: skip
    parser.add_argument("--fraction", type=float, default=0.25, help="memory fraction cap")
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/maxtp_gpu_check"))
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.smoke
    args.model, args.size, args.cap = ("resnet50", 224, 8192) if gpu else ("resnet18", 32, 16)
    args.precision = "bf16-mixed" if gpu else "32-true"
    args.accelerator, args.budget = ("gpu", 8.0 if args.quick else 20.0) if gpu else ("cpu", 10.0)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    pl.seed_everything(0, verbose=False)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    ours = search_checks(rows, args, gpu)
    if args.quick and gpu:
        theirs: dict[str, Any] = {}
        check(rows, "lightning power", None, "skipped: --quick")
    else:
        theirs = lightning_checks(rows, args)
    if gpu and not args.quick:
        run_gpu_tests(rows, "tests/batch_size/test_find.py", "cuda")
    print()
    return finish(
        "gpu_check_batch_size", rows, args.out, name_width=40, none_label="info",
        device=torch.cuda.get_device_name(0) if gpu else "cpu", model=args.model,
        precision=args.precision, seconds=round(time.perf_counter() - start, 1), ours=ours,
        lightning=theirs, versions={"torch": torch.__version__, "lightning": pl.__version__},
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
