"""Tensor-only workloads: in-memory random data and models from tiny to compute-heavy.

Without files or decoding, what these time is model compute plus the framework's per-step
overhead. A tiny MLP is nearly all overhead (the step loop, hooks, the optimizer call), a large
MLP or a transformer encoder nearly all compute; between them they show whether a setting helps
the framework or the math. The data are random, so no accuracy is meant, only throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.workloads.common import ClassifierModule

__all__ = [
    "PRESETS",
    "MLPClassifier",
    "TensorWorkload",
    "TransformerClassifier",
    "build_tensor_workload",
    "make_tensor_dataset",
]

Inputs = Literal["vectors", "tokens", "sequences"]


def make_tensor_dataset(
    samples: int,
    *,
    inputs: Inputs = "vectors",
    features: int = 32,
    seq_len: int = 16,
    vocab: int = 1000,
    classes: int = 10,
    seed: int = 0,
) -> TensorDataset:
    """Random in-memory samples with random integer labels.

    Args:
        samples: Number of samples.
        inputs: ``"vectors"``: float ``[features]``; ``"sequences"``: float
            ``[seq_len, features]``; ``"tokens"``: int64 token ids ``[seq_len]`` below ``vocab``.
        features: Feature size of vectors and sequence elements.
        seq_len: Sequence length for ``"tokens"`` and ``"sequences"``.
        vocab: Vocabulary size for ``"tokens"``.
        classes: Labels are drawn from ``range(classes)``.
        seed: Seed of the generator.

    Returns:
        ``TensorDataset(inputs, labels)``.
    """
    gen = torch.Generator().manual_seed(seed)
    if inputs == "vectors":
        x = torch.randn(samples, features, generator=gen)
    elif inputs == "sequences":
        x = torch.randn(samples, seq_len, features, generator=gen)
    elif inputs == "tokens":
        x = torch.randint(0, vocab, (samples, seq_len), generator=gen)
    else:
        raise ValueError(f"inputs must be 'vectors', 'sequences' or 'tokens', got {inputs!r}")
    y = torch.randint(0, classes, (samples,), generator=gen)
    return TensorDataset(x, y)


class MLPClassifier(ClassifierModule):
    """A ReLU MLP: ``in_features -> hidden x depth -> classes``.

    Args:
        in_features: Input size.
        hidden: Width of the hidden layers.
        depth: Number of hidden layers (at least 1).
        classes: Output size.
        optimizer: ``"sgd"``, ``"adamw"`` or ``"adam"``.
        lr: Learning rate.
    """

    def __init__(
        self,
        in_features: int = 32,
        hidden: int = 64,
        depth: int = 1,
        classes: int = 10,
        *,
        optimizer: str = "sgd",
        lr: float = 0.01,
    ) -> None:
        super().__init__(optimizer=optimizer, lr=lr)
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, classes))
        self.model = nn.Sequential(*layers)


class TransformerClassifier(ClassifierModule):
    """A transformer encoder over token ids or float vectors, mean-pooled, then a linear head.

    Args:
        seq_len: Sequence length (for the learned position embedding).
        vocab: Token vocabulary size; when ``None`` the inputs are float vectors of size
            ``in_features`` and are projected to ``d_model``.
        in_features: Feature size of float inputs (used only when ``vocab`` is ``None``).
        d_model: Model width.
        heads: Attention heads.
        layers: Encoder layers.
        classes: Output size.
        optimizer: ``"sgd"``, ``"adamw"`` or ``"adam"``.
        lr: Learning rate.
    """

    def __init__(
        self,
        seq_len: int = 16,
        *,
        vocab: int | None = 1000,
        in_features: int = 32,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        classes: int = 10,
        optimizer: str = "adamw",
        lr: float = 1e-3,
    ) -> None:
        super().__init__(optimizer=optimizer, lr=lr)
        self.embed: nn.Module = (
            nn.Embedding(vocab, d_model) if vocab is not None else nn.Linear(in_features, d_model)
        )
        self.position = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(x) + self.position[:, : x.shape[1]])
        return self.head(hidden.mean(dim=1))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TensorWorkload:
    """A model and a data set that fit each other."""

    name: str
    module: ClassifierModule
    dataset: TensorDataset
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (name and sizes, not the tensors)."""
        return {"name": self.name, "samples": len(self.dataset), **self.params}


PRESETS: dict[str, dict[str, Any]] = {
    "tiny-mlp": {"inputs": "vectors", "features": 32, "hidden": 64, "depth": 1},
    "large-mlp": {"inputs": "vectors", "features": 1024, "hidden": 4096, "depth": 4},
    "transformer-tokens": {
        "inputs": "tokens",
        "seq_len": 64,
        "vocab": 8000,
        "d_model": 256,
        "heads": 4,
        "layers": 4,
    },
    "transformer-vectors": {
        "inputs": "sequences",
        "seq_len": 64,
        "features": 64,
        "d_model": 256,
        "heads": 4,
        "layers": 4,
    },
}
"""Named sizes; ``build_tensor_workload`` overrides can change any of them."""


def build_tensor_workload(
    name: str, samples: int = 4096, *, classes: int = 10, seed: int = 0, **overrides: Any
) -> TensorWorkload:
    """A preset's model and a matching random data set.

    Args:
        name: A key of ``PRESETS``.
        samples: Data set size.
        classes: Number of classes.
        seed: Seed of the data (the model uses torch's global RNG).
        **overrides: Preset keys to change (``hidden=128``, ``layers=1``, ...), plus
            ``optimizer`` and ``lr``.

    Returns:
        The workload.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown tensor workload {name!r}; known: {sorted(PRESETS)}")
    p = {**PRESETS[name], **overrides}
    opt = {k: p[k] for k in ("optimizer", "lr") if k in p}
    if p["inputs"] == "vectors":
        module: ClassifierModule = MLPClassifier(
            p["features"], p["hidden"], p["depth"], classes, **opt
        )
    else:
        tokens = p["inputs"] == "tokens"
        module = TransformerClassifier(
            p["seq_len"],
            vocab=p["vocab"] if tokens else None,
            in_features=p.get("features", 32),
            d_model=p["d_model"],
            heads=p["heads"],
            layers=p["layers"],
            classes=classes,
            **opt,
        )
    data_keys = ("features", "seq_len", "vocab")
    dataset = make_tensor_dataset(
        samples,
        inputs=p["inputs"],
        classes=classes,
        seed=seed,
        **{k: p[k] for k in data_keys if k in p},
    )
    return TensorWorkload(name, module, dataset, {"classes": classes, "seed": seed, **p})
