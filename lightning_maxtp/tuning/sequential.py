"""Deciding a trial as soon as the evidence allows, either way (pure, plain numbers).

Shortcuts beside ``judge``'s alternating windows:

- **A baseline beyond doubt ends early.** When every one of its first ``EARLY_STEPS`` (or
  more) steps waits for data at least ``DATA_WAIT_SHARE_STRONG`` of its time, the job is
  data-bound beyond what the rest of a window could change: the loop decides from there. On a
  job whose steps wait 0.1 s on reads, 15 more baseline steps at no workers are 1.5 s of a fit
  that more workers finish in a few seconds.

- **A losing trial stops early.** Once a few steps of a trial window are in, and every one of
  them is slower per sample than the reference window's median step while their median is
  slower by more than twice ``min_gain``, the window closes there and the trial is reverted.
  When the knob does nothing, each step is slower than the reference median with a chance of
  one half: all of ``EARLY_STEPS`` steps are with a chance of 1 in 16, and the median's margin
  on top makes a wrong early revert rarer still (and a wrong revert only forgoes a gain).
- **A predicted gain may be confirmed by a window's first steps.** When every one of the
  first ``EARLY_STEPS`` steps of a trial is faster per sample than the reference's median step
  by at least ``CONFIRM_GAIN`` and half the prediction, and so is their rate, the window closes
  there and is judged as the first window below (its mechanism must show too). A knob without
  effect passes each step's test with a chance of a half at most, all four with 1 in 16, and
  the margin on top makes it rarer still.
- **A predicted gain, confirmed, is kept at once.** A trial whose gain was predicted by a
  measurement of its own (the loader measured alone: by ``tune_dataloader``, or loading in the
  main process while the step waits, or the job model) is kept after its first window when
  that window gains at least ``CONFIRM_GAIN`` and half the prediction over the reference, and
  the mechanism shows: the data wait per sample the change was meant to remove fell to at most
  half, or the step itself got faster by half the prediction (fewer workers leaving it its
  cores). A knob without effect leaves both where they were, so the noise of the rates alone
  cannot keep it.

- **A fit that ends before a re-measure could decides on the first pair.** A trial whose first
  window looked like a gain is measured again, the reference then the trial; when fewer steps
  are left than those two windows need, the re-measure would only switch back and forth until
  the fit ends, and its trial end unfinished, and an undo may cost more than the last steps
  save. Any first pair not kept is then decided by which settings run the last steps
  (``decided_at_the_end``): the trial's when its window gained at least ``min_gain`` and half of
  what the model or a measurement predicted for it; else whichever finishes sooner by what was
  measured, the rest of the fit at the trial's rate or the undo (its worker starts) and the rest
  at the reference's. On a ResNet-18 fit of 80 steps from 4 workers, the trial to none gained
  4-12 % against a predicted 15-16 %: its re-measure, or its undo, started the 4 workers again
  for the last 35 steps, and the fit ended 1.12-1.15x the better hand setting.

Every tuning window (but one an epoch long) and every early read spans whole turns of the
loader's workers (``cycle_steps``): workers started together each load one batch in about the
same time, so their batches arrive in bursts of as many as there are workers. A window of a
whole number of bursts holds as many waits as it has bursts; any other length holds a fraction
of one more or less. Measured on a loader of 4 workers waiting 48 ms a batch behind a 0.05 ms
step: a baseline read after 5 steps said 2,090 samples/s where the fit ran at 1,240, and every
trial after it looked like a loss.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from lightning_maxtp.observe.thresholds import DATA_WAIT_SHARE_STRONG
from lightning_maxtp.observe.window import robust_rate

__all__ = [
    "CONFIRM_CAP",
    "CONFIRM_GAIN",
    "EARLY_STEPS",
    "baseline_decided",
    "confirmed_at_once",
    "confirming_gain",
    "cycle_steps",
    "decided_at_the_end",
    "early_steps",
    "losing_early",
    "wait_per_sample",
    "winning_early",
]

CONFIRM_CAP = 1.0
"""The most a confirming gain must be, whatever was predicted (``confirming_gain``)."""
EARLY_STEPS = 4
"""The fewest trial steps read before a trial may be stopped as losing."""
CONFIRM_GAIN = 0.25
"""The least gain of a first trial window that confirms a predicted gain without a second pair.
Beside the halved data wait it asks for, a knob without effect passes both in well under 1 % of
trials (both would have to move by chance, independently)."""


def cycle_steps(steps: int, workers: int) -> int:
    """The fewest steps, at least ``steps``, that are a whole number of the workers' turns.

    Args:
        steps: The least number of steps wanted.
        workers: The loader's workers (0 or 1: every step is a turn).

    Returns:
        ``steps`` rounded up to a multiple of ``workers``.
    """
    turn = max(workers, 1)
    return -(-steps // turn) * turn


def decided_at_the_end(
    gain: float,
    expected_gain: float | None,
    min_gain: float,
    *,
    rest_s: float = 0.0,
    undo_s: float = 0.0,
) -> Literal["kept", "reverted", "undecided"]:
    """A first pair's verdict when the fit ends before its re-measure could (the docstring above).

    Args:
        gain: The trial window's gain over the reference's (0.1: 10 % faster).
        expected_gain: The gain predicted for the trial (``None``: none, so nothing agrees).
        min_gain: The least gain a trial is kept for.
        rest_s: The rest of the fit at the reference's rate, seconds (``inf``: the second rule
            never keeps, as when a refused re-measure leaves a long fit to one pair).
        undo_s: What undoing the trial costs beyond its steps (its worker starts), seconds.

    Returns:
        ``"kept"`` when the gain reaches ``min_gain`` and half the prediction, or when the rest
        of the fit at the trial's measured rate ends sooner than the undo and the rest at the
        reference's; else ``"reverted"`` under ``min_gain``, ``"undecided"`` above it.
    """
    agrees = expected_gain is not None and expected_gain > 0
    if agrees and gain >= max(min_gain, (expected_gain or 0.0) / 2):
        return "kept"
    if gain > -1 and rest_s / (1 + gain) < rest_s + undo_s:
        return "kept"
    return "reverted" if gain < min_gain else "undecided"


def early_steps(window_steps: int, workers: int = 0) -> int:
    """How many steps of a window are read before the early check.

    A quarter of the window and at least ``EARLY_STEPS``, in whole turns of the workers
    (``cycle_steps``); the whole window when that is no shorter (no early check then).
    """
    return min(window_steps, cycle_steps(max(EARLY_STEPS, -(-window_steps // 4)), workers))


def wait_per_sample(data_wait_s: Sequence[float], samples: Sequence[int]) -> float:
    """A window's data wait per sample, seconds."""
    return sum(data_wait_s) / max(sum(samples), 1)


def _per_sample(step_s: Sequence[float], samples: Sequence[int]) -> list[float]:
    return [s / max(n, 1) for s, n in zip(step_s, samples, strict=True)]


def baseline_decided(step_s: Sequence[float], wait_s: Sequence[float]) -> bool:
    """Whether a baseline's first steps already show the job data-bound beyond doubt.

    At least ``EARLY_STEPS`` steps, each waiting for data at least ``DATA_WAIT_SHARE_STRONG``
    of its time (see the module).
    """
    if len(step_s) < EARLY_STEPS:
        return False
    return all(
        w >= DATA_WAIT_SHARE_STRONG * s for s, w in zip(step_s, wait_s, strict=True) if s > 0
    )


def losing_early(
    ref_step_s: Sequence[float],
    ref_samples: Sequence[int],
    step_s: Sequence[float],
    samples: Sequence[int],
    min_gain: float,
    *,
    workers: tuple[int, int] = (0, 0),
) -> bool:
    """Whether a trial window's first steps already show it slower than the reference.

    Args:
        ref_step_s: The reference window's step times, seconds.
        ref_samples: Its samples per step.
        step_s: The trial window's step times so far.
        samples: Their samples per step.
        min_gain: The loop's ``min_gain``.
        workers: The loader workers of the reference and of the trial (``robust_rate``).

    Returns:
        ``True`` when at least ``EARLY_STEPS`` steps are in, every one is slower per sample
        than the reference's median step, their median is slower by more than
        ``2 * min_gain``, and so is their rate (``robust_rate``, as the judge reads windows).
    """
    if len(step_s) < EARLY_STEPS or not ref_step_s:
        return False
    ref = statistics.median(_per_sample(ref_step_s, ref_samples))
    trial = _per_sample(step_s, samples)
    if not (min(trial) > ref and statistics.median(trial) > ref * (1 + 2 * min_gain)):
        return False
    # The rate as the judge reads it must lose too: a loader that delivers in bursts (quick
    # steps, then a wait) has a median step far from its rate.
    slower = robust_rate(tuple(step_s), tuple(samples), workers=workers[1]) * (1 + 2 * min_gain)
    return slower < robust_rate(tuple(ref_step_s), tuple(ref_samples), workers=workers[0])


def winning_early(
    ref_step_s: Sequence[float],
    ref_samples: Sequence[int],
    step_s: Sequence[float],
    samples: Sequence[int],
    expected_gain: float | None,
    *,
    workers: tuple[int, int] = (0, 0),
) -> bool:
    """Whether a trial window's first steps already confirm its predicted gain (see the module).

    Args:
        ref_step_s: The reference window's step times, seconds.
        ref_samples: Its samples per step.
        step_s: The trial window's step times so far.
        samples: Their samples per step.
        expected_gain: The gain predicted for the trial (``None``: none, never early).
        workers: The loader workers of the reference and of the trial (``robust_rate``).
    """
    if expected_gain is None or expected_gain < CONFIRM_GAIN or len(step_s) < EARLY_STEPS:
        return False
    if not ref_step_s:
        return False
    margin = 1 + confirming_gain(expected_gain)
    ref = statistics.median(_per_sample(ref_step_s, ref_samples))
    if max(_per_sample(step_s, samples)) * margin > ref:
        return False
    rate = robust_rate(tuple(step_s), tuple(samples), workers=workers[1])
    return rate >= margin * robust_rate(tuple(ref_step_s), tuple(ref_samples), workers=workers[0])


def confirmed_at_once(
    ref_rate: float,
    trial_rate: float,
    ref_wait_per_sample: float,
    trial_wait_per_sample: float,
    expected_gain: float | None,
    *,
    ref_step_per_sample: float | None = None,
    trial_step_per_sample: float | None = None,
    ref_epoch_s: float | None = None,
    trial_epoch_s: float | None = None,
) -> bool:
    """Whether a first trial window confirms a predicted gain beyond doubt (see the module).

    The mechanism must show: the data wait per sample halved (the loading the change was
    meant to hide), or, given the step's own time per sample (step time less data wait), the
    step faster by at least half the predicted gain (fewer workers taking its cores), or,
    given what an epoch boundary cost in each window, that cost halved (workers that no longer
    restart).

    Args:
        ref_rate: The reference window's samples/s.
        trial_rate: The first trial window's samples/s.
        ref_wait_per_sample: The reference window's data wait per sample, seconds.
        trial_wait_per_sample: The trial window's.
        expected_gain: The gain the trial's own measurement predicted (``None``: none).
        ref_step_per_sample: The reference window's step time less its data wait, per sample.
        trial_step_per_sample: The trial window's.
        ref_epoch_s: What an epoch boundary cost in the reference window (``None``: none).
        trial_epoch_s: In the trial window.
    """
    if expected_gain is None or expected_gain < CONFIRM_GAIN or ref_rate <= 0:
        return False
    gain = trial_rate / ref_rate - 1
    mechanism = trial_wait_per_sample <= ref_wait_per_sample / 2
    if ref_step_per_sample is not None and trial_step_per_sample is not None:
        faster = trial_step_per_sample * (1 + expected_gain / 2) <= ref_step_per_sample
        mechanism = mechanism or faster
    if ref_epoch_s is not None and trial_epoch_s is not None:
        mechanism = mechanism or trial_epoch_s <= ref_epoch_s / 2
    return mechanism and gain >= confirming_gain(expected_gain)


def confirming_gain(expected_gain: float) -> float:
    """The least gain that confirms a prediction.

    ``CONFIRM_GAIN``, or half the prediction, at most ``CONFIRM_CAP``: a window twice as fast,
    its mechanism shown, is beyond the noise however much more was predicted.
    """
    return max(CONFIRM_GAIN, min(expected_gain / 2, CONFIRM_CAP))
