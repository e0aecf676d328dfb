"""The precision knob on a CPU: offered only where bf16 has kernels (or the user says so)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_maxtp.knobs import precision as precision_module
from lightning_maxtp.knobs.base import NotOffered, Offer
from lightning_maxtp.knobs.precision import CPU_BF16_ENV, Precision


def _fit() -> Any:
    from lightning.pytorch.plugins.precision import Precision as PlainPrecision

    strategy = SimpleNamespace(precision_plugin=PlainPrecision())
    trainer = SimpleNamespace(precision="32-true", strategy=strategy, accumulate_grad_batches=1,
                              optimizers=[], gradient_clip_val=None)  # fmt: skip
    return SimpleNamespace(trainer=trainer, device="cpu", sharded_by=lambda: None)


@pytest.mark.parametrize(
    ("kernels", "env", "offered"),
    [(False, None, False), (True, None, True), (None, None, True), (False, "1", True),
     (True, "0", False)],
)  # fmt: skip
def test_bf16_is_offered_on_a_cpu_only_with_its_kernels_or_when_told(
    monkeypatch: pytest.MonkeyPatch, kernels: bool | None, env: str | None, offered: bool
) -> None:
    # An AVX2-only AMD EPYC ran a conv net's step 13x slower under emulated bf16 autocast.
    monkeypatch.setattr(precision_module, "cpu_bf16_kernels", lambda: kernels)
    if env is None:
        monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    else:
        monkeypatch.setenv(CPU_BF16_ENV, env)
    offer = Precision().offer(_fit())
    if offered:
        assert isinstance(offer, Offer) and offer.proposed == "bf16-mixed", offer
    else:
        assert isinstance(offer, NotOffered) and "no bf16 kernels" in offer.reason, offer
        assert f"{CPU_BF16_ENV}=1" in offer.reason


def test_a_bad_value_of_the_variable_is_named_in_a_warning_and_torch_decides(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Read mid-fit: an error there would end the user's fit.
    monkeypatch.setattr(precision_module, "cpu_bf16_kernels", lambda: False)
    monkeypatch.setattr(precision_module, "_WARNED", set())
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with caplog.at_level(logging.WARNING, logger="lightning_maxtp.knobs.precision"):
        offers = [Precision().offer(_fit()) for _ in range(3)]  # asked at every decision
    assert all(isinstance(offer, NotOffered) for offer in offers)
    assert caplog.text.count(f"{CPU_BF16_ENV} must be '0' or '1', got 'yes': ignored") == 1
