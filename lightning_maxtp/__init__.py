"""lightning_maxtp: run PyTorch Lightning jobs at the machine's limit without hand-tuning.

The public API is imported lazily (PEP 562), so ``import lightning_maxtp`` and the ``maxtp`` CLI
stay fast: nothing here imports torch or lightning until a name that needs it is used. The one
side effect is registering ``Trainer(strategy="auto_maxtp")``, deferred until lightning itself
is imported (``lightning_maxtp/_register.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_maxtp import _register

__version__ = "0.1.0.dev0"

_LAZY = {
    "AutoMaxTP": "lightning_maxtp.strategy.auto_maxtp",
    "BatchInferencePool": "lightning_maxtp.inference",
    "BatchSizePlan": "lightning_maxtp.batch_size",
    "BottleneckKind": "lightning_maxtp.observe",
    "BottleneckMonitor": "lightning_maxtp.callbacks",
    "Diagnosis": "lightning_maxtp.observe",
    "JobContext": "lightning_maxtp.observe",
    "JobSpec": "lightning_maxtp.pack",
    "KernelCapture": "lightning_maxtp.observe",
    "KnobTrial": "lightning_maxtp.tuning",
    "LoaderPlan": "lightning_maxtp.loader",
    "MaxThroughputCallback": "lightning_maxtp.callbacks",
    "ModelSize": "lightning_maxtp.strategy",
    "PackResult": "lightning_maxtp.pack",
    "Recommendation": "lightning_maxtp.observe",
    "Resources": "lightning_maxtp.resources",
    "StepClock": "lightning_maxtp.callbacks",
    "StrategyPlan": "lightning_maxtp.strategy",
    "ThroughputReport": "lightning_maxtp.observe",
    "TuningConfig": "lightning_maxtp.tuning",
    "TuningSummary": "lightning_maxtp.tuning",
    "Window": "lightning_maxtp.observe",
    "apply_loader_plan": "lightning_maxtp.loader",
    "diagnose": "lightning_maxtp.knobs.advisor",
    "find_batch_size": "lightning_maxtp.batch_size",
    "inspect_resources": "lightning_maxtp.resources",
    "load_jobs": "lightning_maxtp.pack",
    "plan_pack": "lightning_maxtp.pack",
    "plan_strategy": "lightning_maxtp.strategy",
    "run_jobs": "lightning_maxtp.pack",
    "tune_dataloader": "lightning_maxtp.loader",
}

__all__ = [
    "AutoMaxTP",
    "BatchInferencePool",
    "BatchSizePlan",
    "BottleneckKind",
    "BottleneckMonitor",
    "Diagnosis",
    "JobContext",
    "JobSpec",
    "KernelCapture",
    "KnobTrial",
    "LoaderPlan",
    "MaxThroughputCallback",
    "ModelSize",
    "PackResult",
    "Recommendation",
    "Resources",
    "StepClock",
    "StrategyPlan",
    "ThroughputReport",
    "TuningConfig",
    "TuningSummary",
    "Window",
    "__version__",
    "apply_loader_plan",
    "diagnose",
    "find_batch_size",
    "inspect_resources",
    "load_jobs",
    "plan_pack",
    "plan_strategy",
    "run_jobs",
    "tune_dataloader",
]

if TYPE_CHECKING:
    from lightning_maxtp.batch_size import BatchSizePlan, find_batch_size
    from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback, StepClock
    from lightning_maxtp.inference import BatchInferencePool
    from lightning_maxtp.knobs.advisor import diagnose
    from lightning_maxtp.loader import LoaderPlan, apply_loader_plan, tune_dataloader
    from lightning_maxtp.observe import (
        BottleneckKind,
        Diagnosis,
        JobContext,
        KernelCapture,
        Recommendation,
        ThroughputReport,
        Window,
    )
    from lightning_maxtp.pack import JobSpec, PackResult, load_jobs, plan_pack, run_jobs
    from lightning_maxtp.resources import Resources, inspect_resources
    from lightning_maxtp.strategy import ModelSize, StrategyPlan, plan_strategy
    from lightning_maxtp.strategy.auto_maxtp import AutoMaxTP
    from lightning_maxtp.tuning import KnobTrial, TuningConfig, TuningSummary


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_maxtp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


_register.install()
