"""One bf16 rule: the diagnosis's recommendation and the ``precision`` knob's proposal agree."""

from __future__ import annotations

import pytest
import torch

from lightning_maxtp.knobs.advice import precision
from lightning_maxtp.knobs.precision import Precision, bf16_native
from lightning_maxtp.observe.window import JobContext


@pytest.mark.parametrize(
    ("capability", "native"),
    [((8, 0), True), ((8, 6), True), ((9, 0), True), ((7, 5), False), ((6, 1), False)],
)
def test_the_diagnosis_and_the_knob_read_the_same_rule(
    capability: tuple[int, int], native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = f"{capability[0]}.{capability[1]}"
    assert bf16_native(text) is native
    ctx = JobContext(device_type="cuda", precision="32-true", compute_capability=text)
    rec = precision(ctx, "compute-bound")
    assert rec is not None and rec.proposed == ("bf16-mixed" if native else "16-mixed")
    # The knob on a CUDA device of that capability proposes the same.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    assert Precision._proposal("cuda") == rec.proposed
    assert Precision._proposal("cpu") == "bf16-mixed"  # bf16 autocast on a CPU too


def test_an_unknown_or_unreadable_capability_is_not_native_bf16() -> None:
    assert [bf16_native(c) for c in (None, "", "x.y", "8")] == [False] * 4
