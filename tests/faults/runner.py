"""Whole fits with ``MaxThroughputCallback()`` that a planted fault interrupts, one process each.

``python -m tests.faults.runner OUT.json CASE [CASE ...]`` imports torch and Lightning once, then
forks one child per case: the child runs a whole fit with the callback at its defaults (a
data-bound loader, so that the loop measures a baseline and tries workers), plants the case's
fault, and records what the fault left behind: the exception that came out of ``fit`` (type
and message), child processes still alive after a grace period, the process-wide settings the
callback may change against their values before the fit, and the report folder's files and
notes. The NVML cases watch one fake GPU on this CPU fit (``_watch_a_fake_gpu``). The
parent writes ``{case: record}`` to ``OUT.json``. A fork per case keeps the cases apart (a
leaked worker or setting of one cannot hide in the next) without paying the imports per case.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_maxtp import MaxThroughputCallback
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, NVMLError

STEP_WAIT_S = 0.003
"""Each sample's read waits this long: the loop's baseline is data-bound and workers pay."""
GRACE_S = 2.0
"""A process the fit started must be gone this long after ``fit`` returned or raised."""


class Reads(Dataset[torch.Tensor]):
    """Samples that wait like storage reads; fails with ``KeyError`` once ``flag`` exists."""

    def __init__(self, n: int, flag: Path, fail_at: int | None = None) -> None:
        self.n, self.flag, self.fail_at = n, flag, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(STEP_WAIT_S)
        if index == self.fail_at or self.flag.exists():  # a file: workers see it too
            raise KeyError(f"planted: sample {index} is missing")
        return torch.full((16,), float(index))


class Model(pl.LightningModule):
    """A tiny regression whose ``training_step`` raises once ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.fail = False

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.fail:
            raise ValueError(f"planted: the step failed at batch {batch_idx}")
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


QUIET = ("should_stop", "report_unwritable", "disk_full", "nvml_start", "nvml_mid_fit")
"""Cases whose fit ends normally: stopped soon after the loop's first verdict."""


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self) -> str:
        return "GPU is lost"


class DriverGone(FakeNvml):
    """One GPU whose utilization reads until ``gone`` is set, then raises as a lost GPU does."""

    def __init__(self) -> None:
        super().__init__([FakeGpu(util=40)])
        self.gone = False
        self.reads = 0
        """Utilization readings that worked (the sampler's, before the driver went)."""
        self.raised = False
        """Whether a reading found the GPU lost (the fit ends only after one did)."""

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        if self.gone:
            self.raised = True
            raise NVMLError_GpuIsLost()
        self.reads += 1
        return super().nvmlDeviceGetUtilizationRates(h)


def _watch_a_fake_gpu(nvml: FakeNvml) -> None:
    """Start an NVML source on this CPU fit, as the clock does on CUDA, from a fake ``pynvml``.

    The clock starts NVML only for a CUDA device, in ``StepClock.on_train_start``; here that
    hook is followed by its CUDA branch's NVML start, on GPU 0 of ``nvml``, placed in
    ``sys.modules`` as ``pynvml`` only then (the probe in ``setup`` still sees no GPU, so the
    loop plans the same fit as the other cases).
    """
    from lightning_maxtp.callbacks.step_clock import StepClock
    from lightning_maxtp.observe import sampler

    start = StepClock.on_train_start

    def on_train_start(self: StepClock, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        start(self, trainer, module)
        sys.modules["pynvml"] = nvml  # type: ignore[assignment]
        source = sampler.try_source(lambda: sampler.NvmlSource(0), "NVML", self.missing_sources)
        if source is not None and self.sampler is not None:
            self.sampler.sources.append(source)

    StepClock.on_train_start = on_train_start  # type: ignore[method-assign,assignment]


class Fault(pl.Callback):
    """Plants the case's fault once the loop is in its first trial; ends quiet cases after it."""

    def __init__(
        self, case: str, maxtp: MaxThroughputCallback, flag: Path, nvml: FakeNvml | None = None
    ) -> None:
        self.case, self.maxtp, self.flag, self.nvml = case, maxtp, flag, nvml
        self.planted_at: int | None = None

    def _in_trial(self) -> bool:
        changes = self.maxtp.knob_changes
        return bool(changes) and changes[-1].reason.startswith("trying")

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *_: Any) -> None:
        if self.planted_at is None and self._in_trial():
            self.planted_at = trainer.global_step
            self._plant(trainer, module)
        elif self.maxtp.trials and self.case in QUIET and self._struck():
            trainer.should_stop = True  # a normal end soon after the first verdict

    def _struck(self) -> bool:
        """Whether the planted fault has happened (a lost GPU: once the sampler read it)."""
        return not isinstance(self.nvml, DriverGone) or self.nvml.raised

    def _plant(self, trainer: pl.Trainer, module: Any) -> None:
        if self.case == "dataset_trial":
            self.flag.touch()
        elif self.case == "step_trial":
            module.fail = True
        elif self.case == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        elif self.case == "should_stop":
            trainer.should_stop = True
        elif self.case == "worker_killed":
            workers = psutil.Process().children(recursive=True)
            assert workers, "a worker trial runs with workers"
            os.kill(workers[0].pid, signal.SIGKILL)
        elif self.case == "nvml_mid_fit":
            assert isinstance(self.nvml, DriverGone)
            self.nvml.gone = True  # the sampler's next reading finds the GPU lost

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        if self.case == "disk_full":  # the report is written after this hook: files stop at 1 KB
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))


def _measure_alone_fails(flag: Path) -> list[bool]:
    """Make the loader measured alone read failing samples; the list says it ran."""
    from lightning_maxtp.callbacks import tuner

    reached: list[bool] = []
    measure = tuner.measure_loader

    def failing(*args: Any, **kwargs: Any) -> Any:
        reached.append(True)
        flag.touch()
        return measure(*args, **kwargs)

    tuner.measure_loader = failing  # type: ignore[assignment]
    return reached


def process_state() -> dict[str, Any]:
    """The process-wide settings a fit with the callback may change."""
    return {
        "threads": torch.get_num_threads(),
        "gc_enabled": gc.isenabled(),
        "gc_threshold": list(gc.get_threshold()),
        "gc_frozen": gc.get_freeze_count(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def _left_behind(before: set[int]) -> list[str]:
    """Processes this one started that are still alive after ``GRACE_S``."""
    deadline = time.monotonic() + GRACE_S
    while True:
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        alive = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return [f"{p.pid} {' '.join(p.cmdline()[:3])}" for p in alive]
        time.sleep(0.05)


def _report(folder: Path) -> dict[str, Any]:
    """The report folder's files, whether the JSON one parses, and the notes of both."""
    if not folder.is_dir():
        return {"exists": False, "files": [], "json_ok": None}
    files = sorted(p.name for p in folder.iterdir())
    json_ok, notes, md_notes = None, None, None
    if "report.json" in files:
        try:
            notes = json.loads((folder / "report.json").read_text()).get("notes")
            json_ok = True
        except ValueError:
            json_ok = False
    if "report.md" in files:
        md_notes = (folder / "report.md").read_text().partition("## Notes")[2]
    return {"exists": True, "files": files, "json_ok": json_ok, "notes": notes, "md": md_notes}


def run_case(case: str, tmp: Path) -> dict[str, Any]:
    """One whole fit with the case's fault; what it left behind."""
    flag = tmp / f"{case}.fail"
    report_dir = tmp / f"{case}-report"
    if case == "report_unwritable":
        report_dir.write_text("a file where the report folder should be")
    reached = _measure_alone_fails(flag) if case == "dataset_alone" else None
    pl.seed_everything(0, verbose=False)
    maxtp = MaxThroughputCallback(report_dir=report_dir, verbose=False)
    if case == "dataset_alone":
        # The loop measures the loader alone only when the job model cannot predict the workers'
        # gain: workers from the start and no sampler to read their CPU. The measurement costs
        # seconds a short fit's budget lacks.
        maxtp = MaxThroughputCallback(
            report_dir=report_dir, verbose=False, cost_share=None, sampler_interval_s=None
        )
    nvml: FakeNvml | None = None
    if case == "nvml_start":
        nvml = FakeNvml([FakeGpu()], init_error=NVMLError_DriverNotLoaded())
    elif case == "nvml_mid_fit":
        nvml = DriverGone()
    if nvml is not None:
        _watch_a_fake_gpu(nvml)
    fault = Fault(case, maxtp, flag, nvml)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=600, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[fault, maxtp],
    )  # fmt: skip
    # The baseline window runs from step 5 (after the warm-up) on: step 6 fails there.
    data = Reads(600 * 8, flag, fail_at=8 * 6 if case == "dataset_baseline" else None)
    # A loader that starts with a worker: the job model has no in-process loading to predict
    # from, so the loop measures the loader alone first.
    workers = 1 if case == "dataset_alone" else 0
    before_pids = {p.pid for p in psutil.Process().children(recursive=True)}
    before = process_state()
    error: dict[str, str] | None = None
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            trainer.fit(Model(), DataLoader(data, batch_size=8, num_workers=workers))
        except BaseException as err:  # SystemExit after SIGINT included
            error = {"type": type(err).__name__, "message": str(err)[:2000]}
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    return {
        "error": error,
        "planted_at": fault.planted_at,
        "reached_measure_alone": None if reached is None else bool(reached),
        "left": _left_behind(before_pids),
        "state_before": before,
        "state_after": process_state(),
        "report": _report(report_dir),
        "trials": [t.verdict for t in maxtp.trials],
        "nvml_reads": nvml.reads if isinstance(nvml, DriverGone) else None,
        "interrupted": trainer.interrupted,
        "warnings": [str(w.message) for w in warned if str(w.message).startswith("maxtp")],
    }


def main(argv: list[str]) -> int:
    out, cases = Path(argv[0]), argv[1:]
    tmp = out.parent
    results: dict[str, Any] = {}
    for case in cases:
        record = tmp / f"{case}.json"
        pid = os.fork()
        if pid == 0:  # the child: one fit, its record, and out without the parent's cleanup
            # Ctrl-C raises KeyboardInterrupt, as in a terminal: a process started in the
            # background of a shell (CI) inherits SIGINT ignored, and Python keeps it so.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = 0
            try:
                record.write_text(json.dumps(run_case(case, tmp)))
            except BaseException as err:  # the parent reports it
                record.write_text(json.dumps({"crashed": f"{type(err).__name__}: {err}"}))
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        try:
            results[case] = json.loads(record.read_text())
        except (OSError, ValueError) as err:
            results[case] = {"crashed": f"no record ({err}), wait status {status}"}
        results[case]["exit"] = os.waitstatus_to_exitcode(status)
    out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
