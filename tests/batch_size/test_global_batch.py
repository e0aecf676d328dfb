"""Global batch arithmetic: accumulation for "keep", LR scaling for "grow", clear errors."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lightning_maxtp.batch_size.global_batch import (
    DEFAULT_WARMUP_STEPS,
    GlobalBatchDecision,
    decide_global_batch,
    lr_rule_for,
)

SGD = ["SGD", "Optimizer", "object"]
ADAMW = ["AdamW", "Optimizer", "object"]


def decide(**kwargs: Any) -> GlobalBatchDecision:
    args: dict[str, Any] = dict(
        mode="keep", fastest=64, safe_max=200, previous_batch_size=256, previous_accumulation=1,
        devices=1, target_global_batch_size=None, optimizer_names=[SGD], lr_scaling="auto",
        lr_warmup_steps=None,
    )  # fmt: skip
    args.update(kwargs)
    return decide_global_batch(**args)


def test_keep_uses_accumulation_when_the_fastest_micro_batch_is_smaller() -> None:
    d = decide(fastest=96)  # divisors of 256 between 96 and 200: 128
    assert (d.batch_size, d.accumulate_grad_batches, d.global_batch_size) == (128, 2, 256)
    assert d.lr_scales == (1.0,) and d.lr_rules == ("none",) and d.lr_warmup_steps == 0
    assert d.notes == ()


def test_keep_with_devices_and_a_requested_global_batch() -> None:
    d = decide(fastest=32, devices=4, previous_batch_size=16, target_global_batch_size=512)
    assert (d.batch_size, d.accumulate_grad_batches, d.global_batch_size) == (32, 4, 512)
    assert d.previous_global_batch_size == 64
    assert d.notes == ("global batch 64 -> 512 as requested; the learning rate is left as it is",)


def test_keep_never_grows_the_global_batch_and_says_how_to() -> None:
    d = decide(fastest=512, safe_max=2000, previous_batch_size=32)
    assert (d.batch_size, d.accumulate_grad_batches, d.global_batch_size) == (32, 1, 32)
    assert "pass global_batch='grow'" in d.notes[0]


def test_keep_with_a_prime_batch_falls_back_to_the_largest_divisor_below() -> None:
    d = decide(fastest=10, safe_max=50, previous_batch_size=97)
    assert (d.batch_size, d.accumulate_grad_batches) == (1, 97)
    assert "no divisor between the fastest micro-batch 10 and the safe maximum 50" in d.notes[0]


def test_grow_scales_sgd_linearly_with_warmup() -> None:
    d = decide(mode="grow", fastest=512, safe_max=2000, previous_batch_size=32)
    assert (d.batch_size, d.accumulate_grad_batches, d.global_batch_size) == (512, 1, 512)
    assert d.lr_rules == ("linear",) and d.lr_scales == (16.0,)
    assert d.lr_warmup_steps == DEFAULT_WARMUP_STEPS


def test_grow_scales_adam_by_the_square_root() -> None:
    d = decide(mode="grow", fastest=512, safe_max=2000, previous_batch_size=32, lr_warmup_steps=7,
               optimizer_names=[ADAMW])  # fmt: skip
    assert d.lr_rules == ("sqrt",) and d.lr_scales == (4.0,) and d.lr_warmup_steps == 7


def test_grow_never_shrinks_the_global_batch() -> None:
    # fastest 96 < 256: accumulate ceil(256 / 96) = 3 -> 288 >= 256; the rate grows by 288 / 256.
    d = decide(mode="grow", fastest=96, previous_batch_size=256, optimizer_names=[SGD, ADAMW])
    assert (d.batch_size, d.accumulate_grad_batches, d.global_batch_size) == (96, 3, 288)
    assert d.lr_scales == (1.125, pytest.approx(math.sqrt(1.125)))
    assert d.lr_rules == ("linear", "sqrt")


def test_grow_keeps_previous_accumulation_in_the_ratio() -> None:
    d = decide(mode="grow", fastest=64, previous_batch_size=16, previous_accumulation=2, devices=2)
    # Previous global 16 x 2 devices x 2 = 64, 32 per device: one micro-batch of 64 covers it.
    assert (d.previous_global_batch_size, d.global_batch_size) == (64, 128)
    assert d.accumulate_grad_batches == 1 and d.lr_scales == (2.0,)


def test_grow_without_lr_scaling_reports_it() -> None:
    d = decide(mode="grow", fastest=64, previous_batch_size=8, lr_scaling="none")
    assert d.lr_scales == (1.0,) and d.lr_warmup_steps == 0
    assert d.notes == ("global batch 8 -> 64 without learning-rate scaling (lr_scaling='none')",)


def test_lr_rules_by_optimizer_family() -> None:
    assert lr_rule_for(["SGD", "Optimizer"], "auto") == "linear"
    assert lr_rule_for(["FusedAdam", "Optimizer"], "auto") == "sqrt"
    assert lr_rule_for(["MyAdamVariant", "AdamW", "Optimizer"], "auto") == "sqrt"
    assert lr_rule_for(["LBFGS", "Optimizer"], "sqrt") == "sqrt"
    with pytest.raises(ValueError, match=r"cannot tell how to scale the learning rate of 'LBFGS'"):
        lr_rule_for(["LBFGS", "Optimizer", "object"], "auto")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_global_batch_size": 1, "devices": 2},
         r"at least one sample per device, got 1 for 2 devices; pass a value >= 2"),
        ({"target_global_batch_size": 10, "devices": 4},
         r"divisible by the number of devices, got 10 for 4 devices; pass 8 or 12"),
        ({"mode": "double"}, r"`global_batch` must be 'keep' or 'grow', got 'double'"),
        ({"lr_scaling": "cubic"}, r"`lr_scaling` must be one of"),
        ({"lr_warmup_steps": -1}, r"`lr_warmup_steps` must be >= 0 or None, got -1"),
        ({"mode": "grow", "optimizer_names": [["LBFGS", "Optimizer"]]},
         r"pass lr_scaling='linear', 'sqrt' or 'none'"),
    ],
)  # fmt: skip
def test_impossible_requests_are_clear(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decide(**kwargs)
