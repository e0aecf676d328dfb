"""The closed loop's decisions as plain data: which knob to try next, what a trial measured.

Pure (no torch, no Lightning): ``next_change`` reads the diagnoses of the last measured window
and the loader's current settings and returns ONE auto-applicable change, or ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lightning_maxtp.knobs.registry import WORKERS, setting_class
from lightning_maxtp.observe.diagnosis import Diagnosis
from lightning_maxtp.tuning.admission import Admission
from lightning_maxtp.tuning.cost import TuningCost
from lightning_maxtp.tuning.guard_band import GuardCheck

__all__ = [
    "KnobTrial",
    "TuningSummary",
    "Verdict",
    "fmt_settings",
    "labelled_untried",
    "next_change",
    "remaining",
    "top_line",
]


Verdict = Literal["kept", "reverted", "undecided", "unfinished", "guarded"]
"""How a trial ended: ``undecided`` when it looked faster but no more than the noise (the
original settings stay), ``unfinished`` when the fit ended before it could be judged,
``guarded`` when the numerics guard reverted it and restored the state before it."""
_VERDICT_TEXT = {
    "undecided": "undecided: kept the original",
    "unfinished": "unfinished: the fit ended first",
    "guarded": "reverted by the numerics guard, state restored",
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
    guard: GuardCheck | None = None
    """The numerics guard's last check (math knobs that round differently), else ``None``."""
    expected_gain: float | None = None
    """The gain the job model predicted for it (``None``: no prediction)."""
    admitted: Admission | None = None
    """Which rule let it start (the budget, or a strong prediction past it)."""

    @property
    def gain(self) -> float:
        """Relative throughput change (0.25: 25 % faster)."""
        before, after = self.before_samples_per_s, self.after_samples_per_s
        return after / before - 1 if before > 0 and after is not None else 0.0

    def undo_reason(self, min_gain: float) -> str:
        """Why its settings were undone, for the knob change that undid them."""
        return {
            "reverted": f"reverted: {self.gain:+.1%}, under the {min_gain:.0%} a trial must "
            "gain to be measured again",
            "undecided": f"undecided: {self.gain:+.1%} on one pair, not measured again (the "
            "notes say why), the original kept"
            if self.windows == 2
            else f"undecided: {self.gain:+.1%} not beyond the noise "
            f"({self.noise or 0:.0%}) or under the gain its windows must show "
            f"({3 * min_gain:.0%} on two pairs, {2 * min_gain:.0%} on three), the original kept",
            "unfinished": "unfinished: the fit ended before the trial was judged",
            "guarded": f"reverted by the numerics guard: {self.guard}",
        }.get(self.verdict, self.verdict)

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
            "guard": None if self.guard is None else self.guard.to_dict(),
            "expected_gain": self.expected_gain,
            "admitted": None if self.admitted is None else self.admitted.to_dict(),
            "first_step": self.first_step,
            "steps": self.steps,
        }

    @property
    def change(self) -> str:
        """``knob old -> new``, then any other setting the trial moved as ``knob=new``."""
        return self._change(" ")

    def _change(self, after_knob: str) -> str:
        """``change`` with ``after_knob`` between the knob and its values (``__str__``: ": ").

        A trial of several settings holds them as ``fmt_settings`` strings, read back here.
        """
        old, new = self.old, self.new
        if not (isinstance(old, str) and isinstance(new, str) and "=" in old and "=" in new):
            return f"{self.knob}{after_knob}{old} -> {new}"
        before = dict(part.split("=", 1) for part in old.split(", "))
        after = dict(part.split("=", 1) for part in new.split(", "))
        moved = [k for k, v in after.items() if before.get(k) != v]
        if self.knob not in moved:
            return f"{self.knob}{after_knob}{old} -> {new}"
        also = [f"{k}={after[k]}" for k in moved if k != self.knob]
        head = f"{self.knob}{after_knob}{before.get(self.knob, '?')} -> {after[self.knob]}"
        return ", ".join([head, *also])

    def __str__(self) -> str:
        noise = "" if self.noise is None else f", noise {self.noise:.0%}"
        verdict = _VERDICT_TEXT.get(self.verdict, self.verdict)
        guard = "" if self.guard is None else f" [{self.guard}]"
        if self.expected_gain is not None:
            noise += f", predicted {self.expected_gain:+.0%}"
        if self.admitted is not None and self.admitted.rule == "predicted":
            guard += f" [started {self.admitted}]"
        change = self._change(": ")
        if self.after_samples_per_s is None:
            return f"{change}: not measured, {verdict}{guard}"
        return (
            f"{change}: {self.before_samples_per_s:.1f} -> "
            f"{self.after_samples_per_s:.1f} samples/s ({self.gain:+.1%}{noise}), {verdict}{guard}"
        )


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
        lines = [
            f"maxtp: tuning: {len(self.trials)} knob trial(s) in {self.tuning_s:.1f} s over "
            f"{self.tuning_steps} training steps (real steps: no sample skipped or repeated); "
            f"stopped: {self.stop_reason}"
        ]
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
            now = ", ".join(f"{k}={v}" for k, v in self.settings.items())
            lines.append(f"  settings now: {now}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def next_change(
    diagnoses: tuple[Diagnosis, ...] | list[Diagnosis],
    settings: dict[str, Any],
    tried: set[tuple[str, str]],
    *,
    device_type: str = "cpu",
    max_workers: int | None = None,
) -> tuple[str, Any, str] | None:
    """The first auto-applicable change (loader knobs, main threads) of the top diagnosis not tried.

    Args:
        diagnoses: Findings of the last window, most confident first.
        settings: The loader's current ``num_workers``/``prefetch_factor``/... values (none
            when the train loader cannot be switched: no loader knob is proposed then) and the
            main threads'.
        tried: ``(knob, repr(value))`` pairs already tried and reverted, and those a kept trial
            replaced (measured slower).
        device_type: ``pin_memory`` only helps copies to a CUDA device.
        max_workers: The user's worker cap (the recommendations already respect the probe's
            budget; only this cap is added).

    Returns:
        ``(knob, new value, reason)`` or ``None`` when nothing applicable is left.
    """
    if not diagnoses or diagnoses[0].kind.value == "healthy":
        return None
    for rec in diagnoses[0].recommendations:
        knob = setting_class(rec.knob)
        if not rec.auto_apply or knob is None:
            continue
        if knob.holder == "loader" and WORKERS not in settings:
            continue  # a train loader that cannot be switched: its settings are not in force
        if knob.devices is not None and device_type not in knob.devices:
            continue
        if knob.needs_workers and not settings[WORKERS]:
            continue
        if settings.get(rec.knob) == rec.proposed or (rec.knob, repr(rec.proposed)) in tried:
            continue
        grows = knob.counts_workers and int(rec.proposed) > settings[WORKERS]
        if grows and max_workers is not None:  # the user's cap limits growth, not fewer workers
            value = min(int(rec.proposed), max_workers)
            if value <= settings[WORKERS] or (rec.knob, repr(value)) in tried:
                continue
            return rec.knob, value, rec.reason
        return rec.knob, rec.proposed, rec.reason
    return None


def remaining(
    diagnoses: tuple[Diagnosis, ...],
    tried: set[tuple[str, str]],
    settings: dict[str, Any] | None = None,
) -> tuple[Diagnosis, ...]:
    """The diagnoses without the recommendations that no longer apply.

    Those are the knobs tried and reverted, and the worker-only knobs (prefetch, persistence)
    when ``settings`` leave the loader without workers and no ``num_workers`` change is offered
    (settings without the loader's: a loader the loop does not switch, whose diagnosis read its
    own workers).
    """

    def keep(d: Diagnosis) -> tuple[Any, ...]:
        recs = [r for r in d.recommendations if (r.knob, repr(r.proposed)) not in tried]
        no_workers = settings is not None and not settings.get(WORKERS, 1)
        if no_workers and not any(r.knob == WORKERS for r in recs):
            recs = [r for r in recs if not _needs_workers(r.knob)]
        return tuple(recs)

    return tuple(replace(d, recommendations=keep(d)) for d in diagnoses)


def labelled_untried(
    diagnoses: tuple[Diagnosis, ...], why: str, *, loader_why: str | None = None
) -> tuple[Diagnosis, ...]:
    """The diagnoses with each auto-applicable recommendation saying why the loop did not try it.

    The end-of-fit report reads the same diagnosis rules as the loop, on later windows; an
    automatic change it names there was not tried, and says why (``why``: the stop reason,
    or that the fit ended first; ``loader_why``, for the loader's knobs, why the train loader
    cannot be switched), so that the report and the loop never seem to disagree.
    """

    def label(d: Diagnosis) -> Diagnosis:
        recs = tuple(
            replace(r, reason=f"{r.reason}; not tried: {_untried(r.knob, why, loader_why)}")
            if r.auto_apply
            else r
            for r in d.recommendations
        )
        return replace(d, recommendations=recs)

    return tuple(label(d) for d in diagnoses)


def _needs_workers(name: str) -> bool:
    knob = setting_class(name)
    return knob is not None and knob.needs_workers


def _untried(name: str, why: str, loader_why: str | None) -> str:
    knob = setting_class(name)
    held_by_loader = knob is not None and knob.holder == "loader"
    return loader_why if loader_why is not None and held_by_loader else why


def fmt_settings(settings: Any) -> str:
    """``"num_workers=2, prefetch_factor=4"`` for a settings dict, else ``str``."""
    if isinstance(settings, dict):
        return ", ".join(f"{k}={v}" for k, v in settings.items())
    return str(settings)


def top_line(found: tuple[Diagnosis, ...] | list[Diagnosis]) -> str:
    """The top diagnosis in one line."""
    return f"bottleneck {found[0].kind.value}: {found[0].summary}" if found else "no diagnosis"
