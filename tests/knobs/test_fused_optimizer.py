"""``fused_optimizer`` on a stand-in Trainer: a revert leaves the optimizer's state as it was."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from lightning_maxtp.knobs.base import FitView
from lightning_maxtp.knobs.fused_optimizer import FusedOptimizer


@pytest.fixture
def float64_default() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _step(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    module(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.usefixtures("float64_default")
def test_a_revert_gives_back_the_step_counters_torch_made_for_a_float64_default() -> None:
    module = torch.nn.Linear(8, 2)
    optimizer = torch.optim.Adam(module.parameters())
    _step(module, optimizer)
    fit = FitView(SimpleNamespace(optimizers=[optimizer]))  # type: ignore[arg-type]
    steps = [s["step"] for s in optimizer.state.values()]
    assert {(s.dtype, s.device.type) for s in steps} == {(torch.float64, "cpu")}
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    knob = FusedOptimizer()

    knob.apply(fit, True)
    assert all(s["step"].dtype == torch.float32 for s in optimizer.state.values())  # fused: f32
    _step(module, optimizer)
    knob.apply(fit, False)
    assert {k: v for k, v in optimizer.param_groups[0].items() if k != "params"} == group
    assert [(s["step"].dtype, float(s["step"])) for s in optimizer.state.values()] == [
        (torch.float64, 2.0),
        (torch.float64, 2.0),
    ]
