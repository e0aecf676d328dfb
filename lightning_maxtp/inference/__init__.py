"""Batched inference on every device: ``BatchInferencePool`` (local processes, inline, or Ray).

``RayDataPredictor`` runs the same model copy inside ``ray.data.Dataset.map_batches``.
"""

from lightning_maxtp.inference.pool import BatchInferencePool
from lightning_maxtp.inference.ray_plan import RayDataPredictor
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
    "RayDataPredictor",
    "WorkerSpec",
    "WorkerStats",
]
