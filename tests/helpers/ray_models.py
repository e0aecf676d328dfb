"""Picklable factories for the Ray backend tests (Ray's worker processes import this module).

Kept free of lightning, pytest and ray imports, like ``inference_models``.
"""

from __future__ import annotations

import torch


def broken_model() -> torch.nn.Module:
    """A factory that cannot build its model: the actor's ``__init__`` fails."""
    raise RuntimeError("no weights here")
