"""Batched multi-device inference in spawned worker processes: ``BatchInferencePool``."""

from lightning_maxtp.inference._types import (
    InferenceError,
    InferencePlan,
    InferenceStats,
    ItemError,
    WorkerSpec,
    WorkerStats,
)
from lightning_maxtp.inference.pool import BatchInferencePool

__all__ = [
    "BatchInferencePool",
    "InferenceError",
    "InferencePlan",
    "InferenceStats",
    "ItemError",
    "WorkerSpec",
    "WorkerStats",
]
