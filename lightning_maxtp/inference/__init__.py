"""Batched multi-device inference in spawned worker processes: ``BatchInferencePool``."""

from lightning_maxtp.inference.pool import BatchInferencePool
from lightning_maxtp.inference.records import (
    InferenceError,
    InferencePlan,
    InferenceStats,
    ItemError,
    WorkerSpec,
    WorkerStats,
)

__all__ = [
    "BatchInferencePool",
    "InferenceError",
    "InferencePlan",
    "InferenceStats",
    "ItemError",
    "WorkerSpec",
    "WorkerStats",
]
