"""How a trial's windows decide: measure again, keep, revert (pure, plain numbers).

``judge`` reads a trial's window rates (reference and trial settings in turn) and says whether
to measure another window or what the verdict is; ``judged`` gives the numbers the report shows
for a finished trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp.tuning.cost import lost_s

if TYPE_CHECKING:
    from lightning_maxtp.observe.window import Window

__all__ = ["NOISE_FACTOR", "THIRD_PAIR_GAIN", "TWO_PAIR_GAIN", "Outcome", "judge", "judged"]


NOISE_FACTOR = 2.0
"""A kept gain exceeds this many times the noise: the difference of two windows of the same
settings, taken from just two pairs, is itself a rough estimate of how much a window varies."""


THIRD_PAIR_GAIN = 2.0
"""Two pairs that gain at least this many times ``min_gain`` but not beyond the noise earn a
third pair before the verdict; three pairs keep a change whose median gain is as large."""
TWO_PAIR_GAIN = 3.0
"""Two pairs alone keep a change only when it gains at least this many times ``min_gain``
(besides beating the noise): with a smaller gain the spread of two pairs is too rough a noise
estimate, and a knob without effect would be kept more often than 1 in 20."""


Outcome = Literal["old", "new", "kept", "reverted", "undecided"]
"""``judge``'s answer: measure again with the ``old`` or ``new`` settings, or a verdict."""


def judge(rates: list[float], min_gain: float) -> tuple[Outcome, float | None]:
    """What to do after a trial's windows: measure again, or the verdict, and the noise.

    ``rates`` alternate reference and trial settings, the reference first (``R1, T1``, then
    ``R1, T1, R2`` and ``R1, T1, R2, T2``). One window against one window is not evidence on a
    shared machine (a stall or another job's burst moves a window by tens of percent), so a
    trial that looks like a gain is re-measured: the reference again (``R2``, which also
    brackets ``T1`` against drift), then the trial again (``T2``, ending on the trial settings,
    so keeping costs no further switch). It is kept only when the trial's mean beats the
    reference's mean by ``TWO_PAIR_GAIN`` times ``min_gain`` and by more than ``NOISE_FACTOR``
    times the noise (how much two windows of the same settings differed), and both trial
    windows beat both reference windows. A trial that does not even look like a gain is
    reverted at once.

    On a noisy machine two pairs can leave a large gain undecided (one slow window makes the
    noise as large as the gain). When the two pairs' gain is at least twice ``min_gain`` and
    both trial windows beat both reference windows, a third pair is measured (``R3, T3``) and
    decides by ranks: kept when every trial window beats every reference window (a chance of 1
    in 20 when the knob does nothing) and the median trial window beats the median reference
    window by ``THIRD_PAIR_GAIN`` times ``min_gain``; medians, so that one stalled window cannot
    make the gain.

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
    ranked = min(t1, t2) > max(r1, r2)
    if gain > NOISE_FACTOR * noise and gain >= TWO_PAIR_GAIN * min_gain and ranked:
        return "kept", noise
    if gain >= THIRD_PAIR_GAIN * min_gain and ranked:
        # Only when a third pair can still decide: its rank test needs every trial window
        # above every reference window, already true of the first two pairs.
        return "old", None
    return "undecided", noise


def _third_pair(rates: list[float], min_gain: float) -> tuple[Outcome, float | None]:
    """The verdict from three pairs: ranks and medians (see ``judge``)."""
    refs, trials = sorted(rates[0::2]), sorted(rates[1::2])
    ref, trial = refs[1], trials[1]
    if ref <= 0 or trial <= 0:
        return "reverted", 1.0
    noise = max((refs[-1] - refs[0]) / ref, (trials[-1] - trials[0]) / trial)
    gain = trial / ref - 1
    if gain < min_gain:
        return "reverted", noise
    if trials[0] > refs[-1] and gain >= THIRD_PAIR_GAIN * min_gain:
        return "kept", noise
    return "undecided", noise


def judged(
    windows: list[tuple[Window, Any]], kept: bool, min_gain: float
) -> tuple[float, float | None, float | None, float]:
    """A finished trial's numbers: ``(before, after, noise, lost_s)``.

    ``before``/``after`` are the means of the reference's and the trial's windows (the medians
    when three pairs decided), ``noise`` the spread between windows of the same settings once
    re-measured, and ``lost_s`` what the slower side's windows cost beyond the faster rate.
    """
    olds, news = windows[0::2], windows[1::2]
    rates = [w.fit_samples_per_s for w, _ in windows]
    before = sum(rates[0::2]) / len(olds)
    after = sum(rates[1::2]) / len(news) if news else None
    if len(rates) >= 6:  # three pairs are judged on medians: report what decided
        before, after = sorted(rates[0::2])[1], sorted(rates[1::2])[1]
    noise = judge(rates, min_gain)[1] if len(rates) >= 4 else None
    # The reference's first window runs anyway (it is the settings before the trial); what
    # the judgement costs is the slower side's other windows.
    if kept and after is not None:
        lost = lost_s([w for w, _ in olds[1:]], after)
    else:
        lost = lost_s([w for w, _ in news], before)
    return before, after, noise, lost
