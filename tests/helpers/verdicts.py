"""The verdict the judge's rule gives a finished trial, from the rates of the windows it read.

A real fit on a shared machine cannot plant whether a knob pays, so a test whose trial may end
either way checks that the verdict follows the rule for what was measured: ``record_judged``
keeps every trial's window rates as the loop finishes it (the reference first, as
``judge.judge`` reads them), ``check_verdict`` asserts that the trial's record agrees with those
rates and that its verdict is the one ``judge.judge`` gives for them.

On fits without a tuning budget (``cost_share=None``: every re-measure is paid, so none ends
a trial undecided for want of budget). A trial with a predicted gain of ``CONFIRM_GAIN`` or
more ends after one pair only when kept (its first window confirmed the prediction,
``sequential.confirmed_at_once``, or the rule kept it): a miss is measured again first.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from lightning_maxtp.tuning.judge import judge
from lightning_maxtp.tuning.sequential import CONFIRM_GAIN
from lightning_maxtp.tuning.tuning_loop import TuningLoop, window_rate

__all__ = ["Judged", "check_verdict", "record_judged", "rule_verdict"]


@dataclass(frozen=True)
class Judged:
    """What a finished trial's verdict rests on."""

    knob: str
    rates: tuple[float, ...]
    """Its windows' rates in the order measured: reference, trial, reference, trial, ..."""
    cut_short: bool
    """Its first trial window closed early, every step of it slower (``TuningLoop.losing``)."""
    guard_failed: bool
    """The numerics guard failed one of its windows."""
    expected_gain: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (a script's process reports it to the test)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Judged:
        """Read back ``to_dict``."""
        return cls(**{**data, "rates": tuple(data["rates"])})


def record_judged(setattr_: Callable[[Any, str, Any], None] = setattr) -> list[Judged]:
    """Wrap ``TuningLoop._finish`` to record every trial finished from now on, in order.

    Args:
        setattr_: ``monkeypatch.setattr`` in a test (undone after it); a script in its own
            process passes nothing.

    Returns:
        The list the records are appended to (one per trial, as ``loop.trials``).
    """
    seen: list[Judged] = []
    finish = TuningLoop._finish

    def recording(self: TuningLoop, verdict: Any) -> Any:
        t = self._trial
        assert t is not None
        failed = t.guard is not None and not t.guard.passed
        rates = tuple(window_rate(w) for w, _ in t.windows)
        seen.append(Judged(t.knob, rates, t.cut_short, failed, t.expected_gain))
        return finish(self, verdict)

    setattr_(TuningLoop, "_finish", recording)
    return seen


def rule_verdict(judged: Judged, min_gain: float) -> str:
    """The verdict the rule gives ``judged``'s windows (see the module for which trials).

    ``guarded`` when the guard failed; ``reverted`` when its first window was cut short as
    losing; ``kept`` after one pair with a predicted gain of ``CONFIRM_GAIN`` or more; else
    ``judge.judge`` on the rates: kept beyond the noise and the gain two (or three) pairs must
    show, reverted under ``min_gain``, undecided between.
    """
    if judged.guard_failed:
        return "guarded"
    if judged.cut_short:
        assert len(judged.rates) == 2, judged
        return "reverted"
    if (judged.expected_gain or 0.0) >= CONFIRM_GAIN and len(judged.rates) == 2:
        return "kept"
    outcome, _ = judge(list(judged.rates), min_gain)
    assert outcome in ("kept", "reverted", "undecided"), (
        f"the rule wanted another window ({outcome!r}): the trial ended before it was judged, "
        f"{judged}"
    )
    return outcome


def check_verdict(trial: Mapping[str, Any], judged: Judged, min_gain: float) -> None:
    """``trial`` (``KnobTrial.to_dict()``) agrees with its windows and has the rule's verdict.

    Its windows, rates before and after (the means, the medians over three pairs) and noise are
    those of ``judged``'s rates; its verdict is ``rule_verdict``'s.
    """
    rates = judged.rates
    why = (trial, judged)
    assert trial["knob"] == judged.knob and trial["windows"] == len(rates), why
    refs, news = rates[0::2], rates[1::2]
    average = statistics.median if len(rates) >= 6 else statistics.fmean
    assert trial["before_samples_per_s"] == pytest.approx(average(refs)), why
    assert trial["after_samples_per_s"] == pytest.approx(average(news)), why
    if len(rates) >= 4:
        assert trial["noise"] == pytest.approx(judge(list(rates), min_gain)[1]), why
    else:
        assert trial["noise"] is None, why
    assert trial["verdict"] == rule_verdict(judged, min_gain), why
    assert trial["kept"] == (trial["verdict"] == "kept"), why
