"""The GPU figures the project aims at: targets, not measurements of this repository.

The reference job is JPEG ResNet-50 training on one NVIDIA H200 with 16 CPUs. Its anchors were
measured by hand, outside this repository, when the project was set up (the project's notes):
Lightning's defaults, an expert's hand-tuned configuration, and about what the machine allows.
The GPU checks compare against these numbers and the documentation quotes them, both from
here, and always as targets: none of them is backed by a result file until a GPU run is
committed under ``benchmarks/results/gpu/`` (``benchmarks/GPU.md``).
"""

from __future__ import annotations

__all__ = ["CALLBACK", "DATA_PATH", "INFERENCE", "REFERENCE_JOB", "SOURCE"]

SOURCE = (
    "the project's stated targets, from the reference job's hand measurement on one H200 with "
    "16 CPUs as the project's notes give it"
)
"""Where every figure here comes from, in words the documentation quotes."""

REFERENCE_JOB: dict[str, float] = {"defaults": 201.0, "expert": 2493.0, "machine": 5000.0}
"""Training img/s of the reference job: Lightning's defaults, the expert's configuration, and
about the machine's limit (the GPU alone on resident batches)."""

CALLBACK: dict[str, float] = {"callback-all": 4500.0, "callback": 2000.0}
"""Steady img/s each callback run of ``gpu_check_callback`` should reach (``allow="all"`` and
``allow="safe"`` from Lightning's defaults); reported, not asserted."""

DATA_PATH = 4700.0
"""Training img/s the best data path of ``gpu_check_data`` should reach."""

INFERENCE: dict[str, float] = {"naive": 289.0, "expert": 5036.0}
"""Inference img/s of the reference job's loops (``gpu_check_inference``): a naive
one-image-at-a-time loop and the expert's DataLoader loop."""
