"""``allow``: which knobs beyond the loader's a fit may try, in which order; the guard's rule."""

from __future__ import annotations

import math

import pytest

from lightning_maxtp.knobs.registry import GUARDED, KNOBS, MATH_KNOBS, NOT_DETERMINISTIC
from lightning_maxtp.tuning.allow import math_knobs_for, resolve_allow
from lightning_maxtp.tuning.guard_band import loss_band


def test_presets_and_names_resolve_in_one_order() -> None:
    # Properties of the registry, not its members: a new knob changes the sets, not this test.
    safe = tuple(k.name for k in KNOBS if k.preset == "safe")
    assert resolve_allow("safe") == safe and "precision" not in safe
    assert resolve_allow("all") == MATH_KNOBS
    assert resolve_allow(["compile", "precision"]) == ("precision", "compile")  # registry order
    with_batch = resolve_allow("safe", batch_size=True)
    assert with_batch == (*safe, "batch_size") or ("batch_size" in safe and with_batch == safe)
    # A deterministic Trainer keeps what picks kernels by timing or rounds differently off,
    # even when named (the same math, judged on real steps like the loader's knobs, stays).
    off = GUARDED | NOT_DETERMINISTIC
    assert resolve_allow("all", deterministic=True) == tuple(k for k in MATH_KNOBS if k not in off)


@pytest.mark.parametrize(
    ("allow", "match"),
    [
        ("fast", r"`allow` must be 'safe', 'all' or a tuple of knob names from \('precision'"),
        (("precision", "bf16"), r"unknown knob\(s\) \['bf16'\]; the valid names are"),
        (3, r"`allow` must be"),
    ],
)
def test_bad_allow_names_the_argument_and_the_valid_names(allow: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_allow(allow)


def test_the_callback_refuses_a_bad_allow_before_the_fit() -> None:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['tensorcores'\]"):
        MaxThroughputCallback(allow=("tensorcores",))  # type: ignore[arg-type]
    callback = MaxThroughputCallback(allow=["precision"])  # type: ignore[arg-type]
    assert callback.config.allow == ("precision",)
    assert callback.config.to_dict()["allow"] == ["precision"]


def test_lightning_cli_validates_allow_when_it_parses() -> None:
    from lightning.pytorch.cli import LightningArgumentParser

    from lightning_maxtp.callbacks import MaxThroughputCallback

    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_class_arguments(MaxThroughputCallback, "cb")
    assert parser.parse_args(["--cb.allow", "all"]).cb.allow == "all"
    parsed = parser.parse_args(["--cb.allow", "[precision, compile]"]).cb.allow
    assert tuple(parsed) == ("precision", "compile")
    with pytest.raises(Exception, match="allow"):
        parser.parse_args(["--cb.allow", "fast"])


def test_the_diagnosis_orders_the_math_knobs() -> None:
    everything = MATH_KNOBS
    assert math_knobs_for("compute", everything)[:3] == ("precision", "channels_last", "tf32")
    assert math_knobs_for("kernel_launch", everything)[0] == "compile"
    assert math_knobs_for("vram", everything) == ("precision",)
    # The device waits on the loader: faster math cannot show in the throughput.
    assert math_knobs_for("data_pipeline", everything) == ()
    assert math_knobs_for("storage", everything) == ()
    assert math_knobs_for("compute", ("compile",)) == ("compile",)


def test_the_guard_fails_non_finite_losses_and_a_loss_out_of_the_band() -> None:
    reference = [2.30, 2.32, 2.28, 2.31, 2.29, 2.33, 2.30, 2.27]
    nan = loss_band(reference, [2.3, math.nan, 2.2])
    assert not nan.passed and nan.non_finite == 1 and "1 of 3 losses not finite" in nan.reason
    assert not loss_band(reference, [2.3], params_finite=False).passed
    ok = loss_band(reference, [2.25, 2.27, 2.26])  # training goes on: the loss falls
    assert ok.passed and ok.limit is not None and ok.reference_loss == pytest.approx(2.30, abs=0.01)
    # The band is the larger of 4 spreads and 10 % of the median: 2.30 + 0.23.
    assert ok.limit == pytest.approx(2.30 + 0.1 * 2.30, abs=0.01)
    risen = loss_band(reference, [2.9, 3.1, 3.0])
    assert not risen.passed and "rose out of the band" in risen.reason
    assert "median loss 3 vs 2.3" in str(risen)
    # Without a reference only finiteness is checked.
    assert loss_band([], [9.0, 9.5]).passed


def test_a_compile_skipped_for_budget_is_no_longer_noted_once_it_is_tried() -> None:
    from types import SimpleNamespace

    from lightning_maxtp.callbacks.math_trial import MathTrials

    note = "compile not tried: less tuning budget left than it needs (30 s)"
    notes = [note, "other"]
    log = SimpleNamespace(
        drop_notes=lambda prefix: notes.__setitem__(
            slice(None), [n for n in notes if not n.startswith(prefix)]
        )
    )
    monitor = SimpleNamespace(clock=SimpleNamespace(step_log=[1, 2]))
    trials = MathTrials(None, None, monitor, None, SimpleNamespace(enabled=False), log)  # type: ignore[arg-type]
    trials.start(None, "compile")  # type: ignore[arg-type]
    assert notes == ["other"]


def test_an_overrun_budget_holds_back_only_the_knobs_that_need_one() -> None:
    from types import SimpleNamespace

    from lightning_maxtp.callbacks.math_trial import MathTrials
    from lightning_maxtp.knobs import Offer
    from lightning_maxtp.tuning.decisions import Try

    offers = {
        "precision": Offer("32-true", "bf16-mixed", "half"),
        "compile": Offer(False, True, "x"),
    }
    math = SimpleNamespace(allowed=("precision", "compile"), offer=offers.__getitem__)
    notes: list[str] = []
    trials = MathTrials(
        SimpleNamespace(allow="all"),  # type: ignore[arg-type]
        SimpleNamespace(tried=set()),  # type: ignore[arg-type]
        SimpleNamespace(context=SimpleNamespace(device_type="cpu")),  # type: ignore[arg-type]
        SimpleNamespace(math=math),  # type: ignore[arg-type]
        SimpleNamespace(enabled=True),  # type: ignore[arg-type]
        SimpleNamespace(note=notes.append),  # type: ignore[arg-type]
    )
    # Measuring the loader alone may overrun the budget: a knob that needs none is still tried.
    assert trials.change("compute", -1.0) == Try(
        "precision", {"precision": "bf16-mixed"}, "compute bottleneck: half"
    )
    math.allowed = ("compile",)  # compile needs 30 s of budget
    assert trials.change("compute", 10.0) is None
    assert notes == ["compile not tried: less tuning budget left than it needs (30 s)"]
