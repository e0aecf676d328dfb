"""``channels_last`` on a stand-in Trainer: each 4-D tensor moves, and comes back as it was."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_maxtp.knobs.base import FitView, Offer
from lightning_maxtp.knobs.channels_last import ChannelsLast


class _Mixed(pl.LightningModule):
    """Two 3x3 convolutions, the second in NHWC by hand, and a 4-D buffer (a fixed kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3)
        self.b.to(memory_format=torch.channels_last)
        self.register_buffer("kernel", torch.randn(4, 4, 1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _Video(pl.LightningModule):
    """A 3-D convolution, then a 2-D one over its depth-averaged features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv3d, self.conv2d = torch.nn.Conv3d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2d(self.conv3d(x).mean(dim=2))


def _fit(module: torch.nn.Module, x: torch.Tensor) -> tuple[FitView, torch.optim.Optimizer]:
    """``module`` after one Adam step on ``x`` (moments and gradients exist, as mid-fit)."""
    optimizer = torch.optim.Adam(module.parameters())
    module(x).sum().backward()
    optimizer.step()
    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    trainer = SimpleNamespace(lightning_module=module, optimizers=[optimizer], strategy=strategy)
    return FitView(trainer), optimizer  # type: ignore[arg-type]


def _strides(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Per parameter: its strides, its gradient's and its moments'."""
    return {
        name: (p.stride(), None if p.grad is None else p.grad.stride(),
               *(v.stride() for v in optimizer.state[p].values() if v.dim()))
        for name, p in module.named_parameters()
    }  # fmt: skip


def test_a_revert_puts_each_tensor_back_to_its_own_layout_not_all_to_nchw() -> None:
    module = _Mixed()
    fit, optimizer = _fit(module, torch.randn(2, 3, 8, 8))
    knob = ChannelsLast()
    before, kernel = _strides(module, optimizer), module.kernel.stride()
    assert knob.offer(fit) == Offer(False, True, knob.reason)  # not all NHWC: on is a change

    knob.apply(fit, True)
    assert module.a.weight.is_contiguous(memory_format=torch.channels_last)
    assert _strides(module, optimizer) != before
    knob.apply(fit, False)
    assert _strides(module, optimizer) == before and module.kernel.stride() == kernel
    assert module.b.weight.is_contiguous(memory_format=torch.channels_last)
    assert not module.b.weight.is_contiguous()


def test_switching_back_to_nhwc_set_by_hand_adds_no_batch_step() -> None:
    module = _Mixed()
    module.to(memory_format=torch.channels_last)
    fit, optimizer = _fit(module, torch.randn(2, 3, 8, 8))
    knob = ChannelsLast()
    before = _strides(module, optimizer)
    assert knob.current(fit) is True

    knob.apply(fit, False)  # the downward trial of a layout set by hand
    assert module.a.weight.is_contiguous() and module.b.weight.is_contiguous()
    knob.apply(fit, True)  # reverted: the user's own layout, and no batch conversion of ours
    assert _strides(module, optimizer) == before
    assert "on_after_batch_transfer" not in vars(module)


def test_5d_weights_are_left_alone_instead_of_failing_the_switch() -> None:
    with pytest.raises(RuntimeError, match="required rank 4 tensor"):
        _Video().to(memory_format=torch.channels_last)  # what the knob once called
    module = _Video()
    fit, optimizer = _fit(module, torch.randn(2, 3, 6, 10, 10))
    before = _strides(module, optimizer)
    knob = ChannelsLast()

    knob.apply(fit, True)
    assert module.conv2d.weight.is_contiguous(memory_format=torch.channels_last)
    assert module.conv3d.weight.is_contiguous() and knob.current(fit) is True
    knob.apply(fit, False)
    assert _strides(module, optimizer) == before
