"""``MathKnobs`` on a stand-in Trainer: each knob set, read back and undone without a fit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from lightning_maxtp.callbacks.math_knobs import MathKnobs
from tests.helpers.models import ConvModel


def _knobs(device: str = "cpu", optimizer: Any = None) -> tuple[MathKnobs, Any]:
    module = ConvModel()
    optimizer = optimizer or torch.optim.Adam(module.parameters(), lr=1e-3)
    trainer = SimpleNamespace(
        lightning_module=module, optimizers=[optimizer], precision="32-true",
        strategy=SimpleNamespace(root_device=torch.device(device)),
    )  # fmt: skip
    knobs = MathKnobs(("fused_optimizer", "tf32", "cudnn_benchmark", "channels_last"))
    knobs.bind(trainer)  # type: ignore[arg-type]
    return knobs, trainer


def _step(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    torch.nn.functional.cross_entropy(module.net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_fused_adam_steps_and_is_undone_with_its_step_counters() -> None:
    knobs, trainer = _knobs()
    module, optimizer = trainer.lightning_module, trainer.optimizers[0]
    _step(module, optimizer)  # state exists before the switch, as mid-fit
    old, new, why = knobs.offer("fused_optimizer")  # type: ignore[misc]
    assert (old, new) == (False, True) and "fused" in why

    knobs.set("fused_optimizer", True)
    assert all(g["fused"] and not g["foreach"] for g in optimizer.param_groups)
    assert knobs.current("fused_optimizer") and knobs.in_force == {"fused_optimizer": True}
    _step(module, optimizer)
    assert knobs.offer("fused_optimizer") == "already on"

    knobs.set("fused_optimizer", False)
    assert all(not g["fused"] and g["foreach"] is None for g in optimizer.param_groups)
    assert knobs.in_force == {}
    _step(module, optimizer)
    assert all(s["step"].device.type == "cpu" for s in optimizer.state.values())


def test_an_optimizer_without_a_fused_step_is_not_offered() -> None:
    module = ConvModel()
    knobs, _ = _knobs(optimizer=torch.optim.RMSprop(module.parameters()))
    assert knobs.offer("fused_optimizer") == (
        "no optimizer with a fused step (Adam, AdamW, SGD, Adagrad on the device)"
    )


def test_cuda_flags_are_not_offered_on_a_cpu_and_are_put_back_at_the_fit_end() -> None:
    knobs, _ = _knobs()
    assert knobs.offer("tf32") == "CUDA only" and knobs.offer("cudnn_benchmark") == "CUDA only"
    matmul, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    try:
        knobs.set("tf32", True)
        knobs.set("cudnn_benchmark", True)
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark
        knobs.restore()
        assert torch.get_float32_matmul_precision() == matmul
        assert torch.backends.cudnn.benchmark == benchmark
        # What was in force stays in the report after the fit put it back.
        assert knobs.in_force == {"tf32": True, "cudnn_benchmark": True}
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.benchmark = benchmark


def test_channels_last_converts_weights_and_batches_and_back() -> None:
    knobs, trainer = _knobs()
    module = trainer.lightning_module
    knobs.set("channels_last", True)
    assert knobs.current("channels_last")
    batch = module.on_after_batch_transfer((torch.randn(2, 3, 8, 8), torch.arange(2)), 0)
    assert batch[0].is_contiguous(memory_format=torch.channels_last)
    assert not batch[0].is_contiguous() and torch.equal(batch[1], torch.arange(2))
    knobs.set("channels_last", False)
    assert not knobs.current("channels_last") and "on_after_batch_transfer" not in vars(module)
