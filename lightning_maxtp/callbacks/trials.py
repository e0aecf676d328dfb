"""The closed loop's decisions as plain data: which knob to try next, what a trial measured.

Pure (no torch, no Lightning): ``next_change`` reads the diagnoses of the last measured window
and the loader's current settings and returns ONE auto-applicable change, or ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp.callbacks.cost import TuningCost
from lightning_maxtp.callbacks.knobs import THREADS
from lightning_maxtp.loader.candidate import LOADER_KNOBS
from lightning_maxtp.observe.diagnosis import Diagnosis

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.tuning_loop import TuningLoop
    from lightning_maxtp.observe.report import ThroughputReport
    from lightning_maxtp.observe.window import Window

__all__ = [
    "KnobTrial",
    "TuningSummary",
    "Verdict",
    "fmt_settings",
    "in_force",
    "judge",
    "next_change",
    "remaining",
    "top_line",
]

_NEED_WORKERS = ("prefetch_factor", "persistent_workers")


Verdict = Literal["kept", "reverted", "undecided", "unfinished"]
"""How a trial ended: ``undecided`` when it looked faster but no more than the noise (the
original settings stay), ``unfinished`` when the fit ended before it could be judged."""
_VERDICT_TEXT = {
    "undecided": "undecided: kept the original",
    "unfinished": "unfinished: the fit ended first",
}


@dataclass(frozen=True)
class KnobTrial:
    """One knob change tried on the running job: measured against the reference, judged."""

    knob: str
    """A loader knob, or ``"loader plan"`` for the settings ``tune_dataloader`` chose."""
    old: Any
    new: Any
    reason: str
    before_samples_per_s: float
    """The reference settings' rate: the mean of their windows in this trial."""
    after_samples_per_s: float | None
    """The trial settings' rate: the mean of their windows (``None``: none was measured)."""
    kept: bool
    first_step: int
    """Training step at which the change was requested."""
    steps: int
    """Steps measured with the trial settings."""
    verdict: Verdict = "kept"
    noise: float | None = None
    """How much two windows of the same settings differed (0.1: 10 %), once re-measured."""
    windows: int = 2
    """Windows the judgement read: reference and trial, then each re-measured when it looked
    like a gain (4), and a third pair when two left a large gain undecided (6)."""
    lost_s: float = 0.0
    """Seconds its windows at the slower settings cost (what the judgement itself cost)."""

    @property
    def gain(self) -> float:
        """Relative throughput change (0.25: 25 % faster)."""
        before, after = self.before_samples_per_s, self.after_samples_per_s
        return after / before - 1 if before > 0 and after is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "knob": self.knob,
            "old": self.old,
            "new": self.new,
            "reason": self.reason,
            "before_samples_per_s": self.before_samples_per_s,
            "after_samples_per_s": self.after_samples_per_s,
            "gain": self.gain,
            "kept": self.kept,
            "verdict": self.verdict,
            "noise": self.noise,
            "windows": self.windows,
            "lost_s": self.lost_s,
            "first_step": self.first_step,
            "steps": self.steps,
        }

    def __str__(self) -> str:
        noise = "" if self.noise is None else f", noise {self.noise:.0%}"
        verdict = _VERDICT_TEXT.get(self.verdict, self.verdict)
        if self.after_samples_per_s is None:
            return f"{self.knob}: {self.old} -> {self.new}: not measured, {verdict}"
        return (
            f"{self.knob}: {self.old} -> {self.new}: {self.before_samples_per_s:.1f} -> "
            f"{self.after_samples_per_s:.1f} samples/s ({self.gain:+.1%}{noise}), {verdict}"
        )


NOISE_FACTOR = 2.0
"""A kept gain exceeds this many times the noise: the difference of two windows of the same
settings, taken from just two pairs, is itself a rough estimate of how much a window varies."""


THIRD_PAIR_GAIN = 2.0
"""Two pairs that gain at least this many times ``min_gain`` but not beyond the noise earn a
third pair before the verdict."""


def judge(rates: list[float], min_gain: float) -> tuple[str, float | None]:
    """What to do after a trial's windows: measure again, or the verdict, and the noise.

    ``rates`` alternate reference and trial settings, the reference first (``R1, T1``, then
    ``R1, T1, R2`` and ``R1, T1, R2, T2``). One window against one window is not evidence on a
    shared machine (a stall or another job's burst moves a window by tens of percent), so a
    trial that looks like a gain is re-measured: the reference again (``R2``, which also
    brackets ``T1`` against drift), then the trial again (``T2``, ending on the trial settings,
    so keeping costs no further switch). It is kept only when the trial's mean beats the
    reference's mean by ``min_gain`` and by more than ``NOISE_FACTOR`` times the noise (how much
    two windows of the same settings differed), and both trial windows beat both reference
    windows. A trial that does not even look like a gain is reverted at once.

    On a noisy machine two pairs can leave a large gain undecided (one slow window makes the
    noise as large as the gain). When the two pairs' gain is at least twice ``min_gain`` and
    both trial windows beat both reference windows, a third pair is measured (``R3, T3``) and
    decides by ranks: kept when every trial window beats every reference window (a chance of 1
    in 20 when the knob does nothing) and the median trial window beats the median reference
    window by ``min_gain``; medians, so that one stalled window cannot make the gain.

    Returns:
        ``("old", None)`` or ``("new", None)``: measure the next window with those settings;
        else ``(verdict, noise)`` with the verdict ``kept``, ``reverted`` or ``undecided``.
    """
    if len(rates) == 2:
        r1, t1 = rates
        return ("old", None) if r1 > 0 and t1 >= r1 * (1 + min_gain) else ("reverted", None)
    if len(rates) in (3, 5):
        return "new", None
    if len(rates) >= 6:
        return _third_pair(rates[:6], min_gain)
    r1, t1, r2, t2 = rates[:4]
    ref, trial = (r1 + r2) / 2, (t1 + t2) / 2
    noise = max(abs(r1 - r2) / ref, abs(t1 - t2) / trial) if ref > 0 and trial > 0 else 1.0
    gain = trial / ref - 1 if ref > 0 else 0.0
    if gain < min_gain:
        return "reverted", noise
    if gain > NOISE_FACTOR * noise and min(t1, t2) > max(r1, r2):
        return "kept", noise
    if gain >= THIRD_PAIR_GAIN * min_gain and min(t1, t2) > max(r1, r2):
        # Only when a third pair can still decide: its rank test needs every trial window
        # above every reference window, already true of the first two pairs.
        return "old", None
    return "undecided", noise


def _third_pair(rates: list[float], min_gain: float) -> tuple[str, float | None]:
    """The verdict from three pairs: ranks and medians (see ``judge``)."""
    refs, trials = sorted(rates[0::2]), sorted(rates[1::2])
    ref, trial = refs[1], trials[1]
    if ref <= 0 or trial <= 0:
        return "reverted", 1.0
    noise = max((refs[-1] - refs[0]) / ref, (trials[-1] - trials[0]) / trial)
    gain = trial / ref - 1
    if gain < min_gain:
        return "reverted", noise
    if trials[0] > refs[-1]:
        return "kept", noise
    return "undecided", noise


@dataclass(frozen=True)
class TuningSummary:
    """What the loop did: trials, time and steps spent, why it stopped."""

    trials: tuple[KnobTrial, ...]
    baseline_samples_per_s: float | None
    tuned_samples_per_s: float | None
    tuning_s: float
    tuning_steps: int
    stop_reason: str
    settings: dict[str, Any] = field(default_factory=dict)
    """Loader settings in force after tuning."""
    notes: tuple[str, ...] = ()
    finished: bool = False
    """Whether tuning ended before the fit did (``False``: the fit ended mid-tuning, or the
    summary was read while tuning)."""
    cost: TuningCost | None = None
    """What tuning cost against its budget, and the fit's net wall-clock."""

    @property
    def speedup(self) -> float | None:
        """Tuned over baseline throughput."""
        if not self.baseline_samples_per_s or self.tuned_samples_per_s is None:
            return None
        return self.tuned_samples_per_s / self.baseline_samples_per_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "trials": [t.to_dict() for t in self.trials],
            "baseline_samples_per_s": self.baseline_samples_per_s,
            "tuned_samples_per_s": self.tuned_samples_per_s,
            "speedup": self.speedup,
            "tuning_s": self.tuning_s,
            "tuning_steps": self.tuning_steps,
            "stop_reason": self.stop_reason,
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "finished": self.finished,
            "cost": None if self.cost is None else self.cost.to_dict(),
        }

    def __str__(self) -> str:
        lines = [f"maxtp: tuning: {len(self.trials)} knob trial(s) in {self.tuning_s:.1f} s over "
                 f"{self.tuning_steps} training steps (real steps: no sample skipped or repeated); "
                 f"stopped: {self.stop_reason}"]  # fmt: skip
        if self.baseline_samples_per_s is not None and self.tuned_samples_per_s is not None:
            lines.append(
                f"  throughput: {self.baseline_samples_per_s:.1f} samples/s (baseline window) -> "
                f"{self.tuned_samples_per_s:.1f} under the settings in force "
                f"({self.speedup or 0:.2f}x)"
            )
        lines += [f"  {t}" for t in self.trials]
        if self.cost is not None and self.baseline_samples_per_s is not None:
            lines.append(f"  {self.cost}")
        if self.settings:
            lines.append("  loader now: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def next_change(
    diagnoses: tuple[Diagnosis, ...] | list[Diagnosis],
    settings: dict[str, Any],
    tried: set[tuple[str, str]],
    *,
    device_type: str = "cpu",
) -> tuple[str, Any, str] | None:
    """The first auto-applicable change (loader knobs, main threads) of the top diagnosis not tried.

    Args:
        diagnoses: Findings of the last window, most confident first.
        settings: The loader's current ``num_workers``/``prefetch_factor``/... values.
        tried: ``(knob, repr(value))`` pairs already tried and reverted.
        device_type: ``pin_memory`` only helps copies to a CUDA device.

    Returns:
        ``(knob, new value, reason)`` or ``None`` when nothing applicable is left.
    """
    if not diagnoses or diagnoses[0].kind.value == "healthy":
        return None
    for rec in diagnoses[0].recommendations:
        if not rec.auto_apply or rec.knob not in (*LOADER_KNOBS, THREADS):
            continue
        if rec.knob == "pin_memory" and device_type != "cuda":
            continue
        if rec.knob in _NEED_WORKERS and not settings["num_workers"]:
            continue
        if settings.get(rec.knob) == rec.proposed or (rec.knob, repr(rec.proposed)) in tried:
            continue
        return rec.knob, rec.proposed, rec.reason
    return None


def remaining(
    diagnoses: tuple[Diagnosis, ...],
    tried: set[tuple[str, str]],
    settings: dict[str, Any] | None = None,
) -> tuple[Diagnosis, ...]:
    """The diagnoses without the recommendations that no longer apply.

    Those are the knobs tried and reverted, and the worker-only knobs (prefetch, persistence)
    when ``settings`` leave the loader without workers and no ``num_workers`` change is offered.
    """

    def keep(d: Diagnosis) -> tuple[Any, ...]:
        recs = [r for r in d.recommendations if (r.knob, repr(r.proposed)) not in tried]
        no_workers = settings is not None and not settings.get("num_workers")
        if no_workers and not any(r.knob == "num_workers" for r in recs):
            recs = [r for r in recs if r.knob not in _NEED_WORKERS]
        return tuple(recs)

    return tuple(replace(d, recommendations=keep(d)) for d in diagnoses)


def fmt_settings(settings: Any) -> str:
    """``"num_workers=2, prefetch_factor=4"`` for a settings dict, else ``str``."""
    if isinstance(settings, dict):
        return ", ".join(f"{k}={v}" for k, v in settings.items())
    return str(settings)


def top_line(found: tuple[Diagnosis, ...] | list[Diagnosis]) -> str:
    """The top diagnosis in one line."""
    return f"bottleneck {found[0].kind.value}: {found[0].summary}" if found else "no diagnosis"


def in_force(
    loop: TuningLoop,
    final: list[tuple[Window, tuple[Diagnosis, ...]]],
    report: ThroughputReport | None = None,
) -> tuple[list[Window], tuple[Diagnosis, ...]]:
    """The windows measured under the settings in force, and the diagnoses describing them.

    Args:
        loop: The fit's loop (its reference window and whether tuning ended).
        final: Windows closed under the settings in force after tuning ended, with their
            diagnoses (the reference window they were judged by is added).
        report: The monitor's report: its last diagnoses are the latest (re-read with a
            profiler capture, if one ran), and its windows are all there is when nothing
            was tuned.

    Returns:
        When tuning did not end, the reference window (never a reverted or unfinished
        trial's); with no reference at all, every window of ``report``.
    """
    if final:
        windows, found = [w for w, _ in final], final[-1][1]
        last = report.windows[-1] if report is not None and report.windows else None
        if report is not None and last is not None and last.first_step == windows[-1].first_step:
            found = report.diagnoses
        if loop.ref is not None and loop.finished:
            windows.insert(0, loop.ref)
        return windows, found
    if loop.ref is not None:
        return [loop.ref], loop.ref_found
    if report is None:
        return [], ()
    return list(report.windows), report.diagnoses
