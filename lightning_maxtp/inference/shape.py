"""Where a CPU pool runs its batches, decided from measurements (pure: numbers in, verdicts out).

A CPU pool on ``"auto"`` starts in the calling process: the model is built there and the
first batches run there at once, on the caller's torch threads, with ``load``/``preprocess`` on
I/O threads; that is a plain batched loop with loading overlapped, and it has no start-up to pay
back. Worker processes (one single-threaded model copy per core, or fewer with more threads)
can beat it: no intra-op barrier, Python-level ``load`` in parallel. But each one imports torch
and builds the model (seconds), and while they start they take cores from the caller.

So the pool measures the inline rate first and tries processes only when the rest of the input,
at that rate, is long enough that the trial's worst case (start-up stolen from the inline loop
plus a measuring window at a lower rate) costs at most ``1 / TRIAL_PAYBACK`` of it: a short job
never pays for a trial. The trial keeps processes only if their measured rate beats the inline
rate by ``KEEP_MARGIN``; otherwise the workers stop and the rest runs inline.
"""

from __future__ import annotations

from dataclasses import dataclass

SPAWN_CPU_S = 3.0
"""CPU seconds one worker spends importing torch before it can build the model (measured on the
2-core development VM; faster machines take less, which only makes the estimate cautious)."""
WINDOW_S = 0.5
"""Shortest measuring window of a process trial, after every worker has returned a batch (a
shorter one counts when the input ends first)."""
WINDOW_BATCHES = 3
"""And at least this many batches per worker in it (the first includes the worker's warm-up)."""
TRIAL_PAYBACK = 10.0
"""A trial needs at least this many times its worst-case cost left to do inline."""
KEEP_MARGIN = 0.10
"""Processes are kept only when at least this much faster than the inline rate."""
PROBE_S = 0.5
"""The inline rate is measured over at least this long (and at least two batches)."""


@dataclass(frozen=True)
class Verdict:
    """One decision of the measured plan: what runs next, and why (a line for ``pool.plan``)."""

    mode: str
    """``inline`` (this run stays in the calling process), ``trial`` (start processes),
    ``wait`` (not yet), ``processes`` (kept: the pool uses them from now on) or ``reverted``
    (the pool runs inline from now on)."""
    why: str


def trial_cost_s(workers: int, cores: int, build_s: float) -> float:
    """Worst-case wall seconds a process trial takes from an inline loop.

    The workers' start-up CPU is taken from the caller's cores, and the measuring window might
    run at no better than the inline rate's complement.
    """
    assert workers >= 1 and cores >= 1
    stolen = workers * (SPAWN_CPU_S + build_s) / cores
    return stolen + WINDOW_S


def decide_shape(
    *,
    inline_rate: float,
    done: int,
    remaining: int | None,
    inline_s: float,
    workers: int,
    cores: int,
    build_s: float,
) -> Verdict:
    """After the inline probe (and after each later inline batch while ``wait``): what next.

    Args:
        inline_rate: Items/s of the inline loop, measured after its first batch.
        done: Items finished so far.
        remaining: Items left when the input's length is known, else ``None``.
        inline_s: Seconds the inline loop has run so far.
        workers: Worker processes the trial would start.
        cores: Usable CPUs.
        build_s: Seconds the model took to build in the caller (each worker pays it again).
    """
    cost = trial_cost_s(workers, cores, build_s)
    need = TRIAL_PAYBACK * cost
    if cores == 1 or workers == 1:
        return Verdict(
            "inline",
            f"inline: {cores} usable core(s); one worker process would run what the caller "
            "runs, after a start-up",
        )
    if inline_rate <= 0:
        return Verdict("wait", "inline rate not measured yet")
    if remaining == 0:
        return Verdict(
            "inline",
            f"inline: the whole input ({done} items so far) was pulled "
            "while the inline rate was measured",
        )
    if remaining is not None:
        left_s = remaining / inline_rate
        if left_s < need:
            return Verdict(
                "inline",
                f"inline: the other {remaining} items take ~{left_s:.1f} s here at "
                f"{inline_rate:,.1f} items/s, under {TRIAL_PAYBACK:.0f}x the ~{cost:.1f} s a "
                f"trial of {workers} worker processes could cost",
            )
        return Verdict(
            "trial",
            f"trial: the other {remaining} items take ~{left_s:.1f} s inline at "
            f"{inline_rate:,.1f} items/s, enough to try {workers} worker processes (~{cost:.1f} s)",
        )
    if inline_s < need:
        return Verdict("wait", "input of unknown length: inline until a trial can pay back")
    return Verdict(
        "trial",
        f"trial: {done} items of an input of unknown length ran inline for {inline_s:.1f} s at "
        f"{inline_rate:,.1f} items/s; trying {workers} worker processes (~{cost:.1f} s)",
    )


def judge_trial(process_rate: float, inline_rate: float, workers: int) -> Verdict:
    """Keep the worker processes only if they measurably beat the inline loop."""
    ratio = process_rate / inline_rate if inline_rate > 0 else float("inf")
    detail = (
        f"{workers} worker processes ran {process_rate:,.1f} items/s vs {inline_rate:,.1f} inline "
        f"({ratio:.2f}x)"
    )
    if ratio >= 1.0 + KEEP_MARGIN:
        return Verdict("processes", f"processes kept: {detail}")
    return Verdict(
        "reverted",
        f"processes reverted: {detail}, under the {1 + KEEP_MARGIN:.2f}x needed; the rest "
        "ran inline",
    )
