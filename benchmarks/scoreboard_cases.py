"""The scoreboard's cases: each times whole fits by hand and with the callback, and emits rows.

One function per case, named as in ``scoreboard.CASES``, taking the ``Profile`` and the
``emit`` callable. Hand settings and the callback run in turn within each round, the order
reversed every other round (``_in_turn``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from benchmarks.own_time import OwnTime, counting_sampler
from benchmarks.runner import tuning_account
from benchmarks.scoreboard import Row, ratio_row
from benchmarks.timing import StepTimer
from benchmarks.workloads.loop_jobs import (
    Job,
    SmallConv,
    ValidatedClassifier,
    conv_images,
    jpeg_dataset,
    latency_dataset,
    tiny_mlp,
)

if TYPE_CHECKING:
    from benchmarks.scoreboard import Emit, Profile

__all__ = [
    "allow_all",
    "batch_knee",
    "both_directions",
    "demo",
    "jpeg_defaults",
    "monitor_cost",
    "never_slower",
    "short_epochs",
    "waiting_loader",
]


class FirstStep(pl.Callback):
    """When the first training step ended (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_train_batch_end(self, *args: Any) -> None:
        """Record the first step's end."""
        if self.at is None:
            self.at = time.perf_counter()


def callback(**kwargs: Any) -> Any:
    """``MaxThroughputCallback`` with these arguments, quiet."""
    from lightning_maxtp import MaxThroughputCallback

    return MaxThroughputCallback(verbose=False, **kwargs)


def _summary(cb: Any) -> str:
    """What the callback did, in one short line for a row's detail."""
    tuning = cb.tuning
    kept = [t.change for t in tuning.trials if t.kept]
    tried = len(tuning.trials)
    settings = tuning.settings
    workers = settings.get("num_workers")
    persistent = settings.get("persistent_workers")
    return (
        f"{tried} trial(s), kept {', '.join(kept) or 'nothing'}; ends at {workers} workers"
        f"{' persistent' if persistent else ''}; stop: {tuning.stop_reason[:60]}"
    )


def _rounds(notes: list[str]) -> str:
    """The last round's summary; when the rounds did different things, what each one did.

    A row's median can rest on a round where the callback kept something else (a trial
    undecided in a noisy window): the detail then shows it, round by round.
    """
    did = [note.split("; ")[0] for note in notes]
    if len(set(did)) <= 1:
        return notes[-1]
    return f"rounds differ: {' | '.join(did)}; last: {notes[-1]}"


def _in_turn(round_: int, fits: Sequence[Callable[[], object]]) -> None:
    """One round's fits, in reverse order every other round.

    One fit here can land 30 % off the next, and a machine that slows down across a round
    would otherwise always charge the side that runs last (the callback's, in most cases).
    """
    for fit in fits if round_ % 2 == 0 else reversed(fits):
        fit()


def _sweep(job: Job, settings: list[tuple[int, bool]], tail: int) -> dict[tuple[int, bool], Any]:
    """One fit per hand setting: ``{(workers, persistent): (seconds, tail samples/s)}``."""
    out = {}
    for workers, persistent in settings:
        timer = StepTimer(max(1, (job.steps or 0) - tail), tail) if job.steps else None
        seconds = job.fit(workers, persistent=persistent, callbacks=[timer] if timer else [])
        out[(workers, persistent)] = (seconds, _rate(timer) if timer else None)
    return out


def _name(setting: tuple[int, bool]) -> str:
    workers, persistent = setting
    return f"{workers} workers{' persistent' if persistent and workers else ''}"


def _against(times: dict[tuple[int, bool], float], best: tuple[int, bool], note: str) -> str:
    """A row's detail: the best hand setting, the sweep's times and what the callback did."""
    shown = ", ".join(f"{_name(s)} {t:.1f} s" for s, t in times.items())
    return f"best hand {_name(best)}; sweep {shown}; {note}"


def _rate(timer: StepTimer) -> float | None:
    """Samples per second over a ``StepTimer``'s timed steps (``None``: they never ended)."""
    if timer.start is None or timer.stop is None:
        return None
    return timer.samples / (timer.stop - timer.start)


def jpeg_defaults(p: Profile, emit: Emit) -> None:
    """320 px JPEGs cropped to 64 feeding a small conv net, from Lightning's defaults."""
    steps = p.steps(280, 24)
    job = Job("jpeg_defaults", SmallConv, jpeg_dataset(320, 64), steps=steps)
    tail = max(4, steps // 3)
    grid = [(0, False), (2, True)] if p.smoke else [(w, w > 0) for w in (0, 1, 2, 3, 4)]
    # The hand sweep runs in every round, beside the callback, and the best hand setting is
    # the one with the shortest median: one fit a setting crowned a slow one here (a sweep
    # once timed 4 workers at 29.8 s, the slowest, where the run before took 12.5 s).
    hand: dict[tuple[int, bool], list[float]] = {s: [] for s in grid}
    tails: dict[tuple[int, bool], list[float]] = {s: [] for s in grid}
    ours, rates, notes = [], [], []

    def by_hand(setting: tuple[int, bool]) -> None:
        timer = StepTimer(steps - tail, tail)
        hand[setting].append(job.fit(setting[0], persistent=setting[1], callbacks=[timer]))
        if (rate := _rate(timer)) is not None:
            tails[setting].append(rate)

    def tuned() -> None:
        cb, timer = callback(), StepTimer(steps - tail, tail)
        ours.append(job.fit(0, persistent=False, callbacks=[cb, timer]))
        if (rate := _rate(timer)) is not None:
            rates.append(rate)
        notes.append(_summary(cb))

    for r in range(p.rounds):
        _in_turn(r, [*(partial(by_hand, s) for s in grid), tuned])
    medians = {s: statistics.median(hand[s]) for s in grid}
    best = min(grid, key=medians.__getitem__)
    best_rate = max(statistics.median(t) for t in tails.values() if t)
    emit(
        ratio_row(
            "jpeg_defaults", "whole fit vs best hand", ours, hand[best], most=1.10, smoke=p.smoke,
            detail=_against(medians, best, f"medians of {p.rounds} round(s); {_rounds(notes)}"),
        )
    )  # fmt: skip
    steady = statistics.median(rates) / best_rate if rates else float("nan")
    emit(
        Row(
            "jpeg_defaults", "steady rate vs sweep's best", ">= 0.95x", steady,
            f"{steady:.2f}x ({statistics.median(rates) if rates else 0:.0f}/s)",
            None if p.smoke else steady >= 0.95,
            f"last {tail} steps; the sweep's best median {best_rate:.0f}/s",
        )
    )  # fmt: skip


def waiting_loader(p: Profile, emit: Emit) -> None:
    """Items that wait 3 ms on reads and a tiny MLP: 400 steps of 32 from no workers."""
    steps = p.steps(400, 30)
    job = Job("waiting_loader", tiny_mlp, latency_dataset(32 * steps, 0.003), steps=steps)
    # The hand settings a user tries on 2 cores: up to 8 workers per core. 32 (16 per core)
    # is timed once beside them, and shown, not judged against.
    grid = [(4, True)] if p.smoke else [(4, True), (8, True), (16, True)]
    sweep = _sweep(job, grid, 4)
    best = min(sweep, key=lambda s: sweep[s][0])
    if not p.smoke:
        sweep |= {(32, True): (job.fit(32, persistent=True), None)}
    hand, ours, costs, notes = [], [], [], []

    def tuned() -> None:
        cb = callback()
        ours.append(job.fit(0, persistent=False, callbacks=[cb]))
        costs.append(tuning_account(cb.tuning))
        notes.append(_summary(cb))

    for r in range(p.rounds):
        _in_turn(r, [lambda: hand.append(job.fit(best[0], persistent=True)), tuned])
    emit(
        ratio_row(
            "waiting_loader", "whole fit vs best hand", ours, hand, most=1.4, smoke=p.smoke,
            detail=_against({s: v[0] for s, v in sweep.items()}, best, _rounds(notes)),
        )
    )  # fmt: skip
    emit(_budget_row(p, costs))


def _budget_row(p: Profile, accounts: list[dict[str, Any]]) -> Row:
    """Tuning's cost against its budget (at most 1.1x + 0.3 s, or the rule that allowed more)."""
    over, texts, met = [], [], True
    for account in accounts:
        cost = account.get("cost") or {}
        spent, budget = cost.get("cost_s") or 0.0, cost.get("budget_s")
        earned = cost.get("earned_s") or 0.0
        allowed = 1.1 * ((budget or 0.0) + earned) + 0.3
        predicted = any("started past the budget" in t for t in account.get("trials", []))
        over.append(spent - allowed)
        ok = budget is None or spent <= allowed or predicted
        met = met and ok
        texts.append(
            f"{spent:.2f} s of {budget or 0:.2f} + {earned:.2f} earned"
            + (" (a trial started on a strong prediction)" if predicted else "")
        )
    worst = max(over) if over else 0.0
    return Row(
        "waiting_loader", "tuning cost vs budget", "<= 1.1x + 0.3 s, or a named rule",
        worst, f"{abs(worst):.2f} s {'past' if worst > 0 else 'under'} the limit",
        None if p.smoke else met, "; ".join(texts),
    )  # fmt: skip


def short_epochs(p: Profile, emit: Emit) -> None:
    """12-step epochs, each followed by 2 validation batches; from 0 and from 4 workers."""
    epochs = 2 if p.smoke else max(4, round(8 * p.scale))
    data = jpeg_dataset(256, 128)
    job = Job(
        "short_epochs", partial(ValidatedClassifier, "mobilenet_v3_small"), data, epochs=epochs,
        epoch_batches=4 if p.smoke else 12, val=data, val_batches=2,
    )  # fmt: skip
    # The hand settings with persistent workers: the same workers restarted every epoch can
    # only be slower (4 workers: 37.8 s against 30.1 s persistent, 8 epochs).
    grid = [(0, False)] if p.smoke else [(0, False), (2, True), (4, True)]
    sweep = _sweep(job, grid, 0)
    best = min(sweep, key=lambda s: sweep[s][0])
    hand, from0, from4, notes0, notes4 = [], [], [], [], []

    def tuned(workers: int, out: list[float], notes: list[str]) -> None:
        cb = callback()
        out.append(job.fit(workers, persistent=False, callbacks=[cb]))
        notes.append(_summary(cb))

    for r in range(p.rounds_of("short_epochs")):
        _in_turn(r, [
            lambda: hand.append(job.fit(best[0], persistent=best[1])),
            partial(tuned, 0, from0, notes0), partial(tuned, 4, from4, notes4),
        ])  # fmt: skip
    for name, ours, notes in (("from 0 workers", from0, notes0), ("from 4 workers", from4, notes4)):
        emit(
            ratio_row(
                "short_epochs", f"{name} vs best hand", ours, hand, most=1.10, smoke=p.smoke,
                detail=_against({s: v[0] for s, v in sweep.items()}, best, _rounds(notes)),
            )
        )  # fmt: skip


def both_directions(p: Profile, emit: Emit) -> None:
    """A compute-bound ResNet-18 on 64 px crops, long epochs, from 4 and from 0 workers."""
    from benchmarks.workloads.jpeg import ImageClassifier

    steps = p.steps(80, 8)
    job = Job(
        "both_directions", partial(ImageClassifier, "resnet18"),
        jpeg_dataset(256, 64, repeat=4), steps=steps,
    )  # fmt: skip
    none, four, from0, from4 = [], [], [], []
    notes0: list[str] = []
    notes4: list[str] = []

    def tuned(workers: int, out: list[float], notes: list[str]) -> None:
        cb = callback()
        out.append(job.fit(workers, persistent=workers > 0, callbacks=[cb]))
        notes.append(_summary(cb))

    for r in range(p.rounds):
        _in_turn(r, [
            lambda: none.append(job.fit(0, persistent=False)),
            lambda: four.append(job.fit(4, persistent=True)),
            partial(tuned, 0, from0, notes0), partial(tuned, 4, from4, notes4),
        ])  # fmt: skip
    # The better setting over the rounds, not each round's faster fit: the two are within a
    # few percent of each other here and one fit lands up to 30 % off the next, so the faster
    # of two fits is a lucky draw the callback's one fit would be held to (the rows read
    # 1.11-1.22x against it while trying nothing; 0.97-0.99x against 4 workers alone).
    better = none if statistics.median(none) <= statistics.median(four) else four
    hand = f"hand: 0 workers {statistics.median(none):.1f} s, 4 {statistics.median(four):.1f} s"
    emit(ratio_row("both_directions", "from 0 vs better hand", from0, better, most=1.10,
                   smoke=p.smoke, detail=f"{hand}; {_rounds(notes0)}"))  # fmt: skip
    emit(ratio_row("both_directions", "from 4 vs better hand", from4, better, most=1.10,
                   smoke=p.smoke, detail=f"{hand}; {_rounds(notes4)}"))  # fmt: skip


def never_slower(p: Profile, emit: Emit) -> None:
    """Jobs with nothing to gain: the callback may cost at most 5 % (+0.5 s under 5 s)."""
    jobs = [
        Job("tiny_steps_50", tiny_mlp, latency_dataset(16 * 50, 0.0), batch_size=16, steps=50),
        Job("short_data_bound", tiny_mlp, latency_dataset(16 * 60, 0.003), batch_size=16,
            steps=p.steps(60, 20)),
        Job("compute_bound_conv", _conv_net, conv_images(64 * 40, 32), batch_size=64,
            steps=p.steps(150, 12)),
    ]  # fmt: skip
    workers = {"tiny_steps_50": 0, "short_data_bound": 0, "compute_bound_conv": 0}
    if not p.smoke and p.name == "full":
        jobs += [
            Job("tiny_steps_2000", tiny_mlp, latency_dataset(16 * 2000, 0.0), batch_size=16,
                steps=2000),
            Job("already_tuned", tiny_mlp, latency_dataset(16 * 800, 0.003), batch_size=16,
                steps=800),
        ]  # fmt: skip
        workers |= {"tiny_steps_2000": 0, "already_tuned": 4}
    # These fits try nothing, so the ratio is the callback's cost against the machine's noise:
    # three rounds (``scoreboard.ROUNDS``), and the cost itself timed inside the callback's
    # fits (``OwnTime``), the row's reason if it misses.
    for job in jobs:
        sides = _Sides(job, workers[job.name])
        for r in range(p.rounds_of("never_slower")):
            _in_turn(r, [partial(sides.fit, False), partial(sides.fit, True)])
        own_share = statistics.median(sides.own_shares)
        emit(ratio_row("never_slower", job.name, sides.fits[True], sides.fits[False], most=1.05,
                       smoke=p.smoke, slack_s=0.5, detail=f"own time {own_share:.1%} of the fit "
                       f"(hooks + sampler CPU); {_rounds(sides.notes)}"))  # fmt: skip
        if job.name == "compute_bound_conv":
            ours, plain = sides.firsts[True], sides.firsts[False]
            extra = statistics.median(a - b for a, b in zip(ours, plain, strict=True))
            emit(
                Row(
                    "never_slower", "fixed cost before the first step", "<= 0.20 s", extra,
                    f"{extra:+.2f} s", None if p.smoke else extra <= 0.2,
                    f"first step ends {statistics.median(ours):.2f} s vs "
                    f"{statistics.median(plain):.2f} s after fit()",
                )
            )  # fmt: skip


@dataclass
class _Sides:
    """One job's fits without (``False``) and with (``True``) the callback, round by round."""

    job: Job
    workers: int
    fits: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    """Whole-fit seconds."""
    firsts: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    """Seconds from ``fit`` to the end of the first step."""
    notes: list[str] = field(default_factory=list)
    own_shares: list[float] = field(default_factory=list)
    """The callback's own time (``OwnTime``) as a share of each of its fits."""

    def fit(self, with_callback: bool) -> None:
        """One fit of the job, on one side."""
        cb = callback() if with_callback else None
        own = OwnTime(cb) if cb is not None else None
        first = FirstStep()
        started = time.perf_counter()
        with counting_sampler(own) if own is not None else nullcontext():
            fit_s = self.job.fit(self.workers, callbacks=[first] if cb is None else [cb, first])
        self.fits[with_callback].append(fit_s)
        self.firsts[with_callback].append((first.at or started) - started)
        if cb is not None and own is not None:
            self.notes.append(_summary(cb))
            self.own_shares.append(own.share(fit_s))


def _conv_net() -> pl.LightningModule:
    """``benchmarks.allow_cpu``'s conv net: three 3x3 convolutions, Adam.

    On in-memory 32 px images the step sets the pace, so only the math knobs can pay.
    """
    from benchmarks.allow_cpu import _module

    module: pl.LightningModule = _module()
    return module


def allow_all(p: Profile, emit: Emit) -> None:
    """``allow="all"`` on a conv net over in-memory images: never below 0.97x of defaults."""
    for name, steps in (("short", p.steps(40, 10)), ("long", p.steps(300, 20))):
        job = Job(f"allow_all_{name}", _conv_net, conv_images(64 * 40, 32), batch_size=64,
                  steps=steps)  # fmt: skip
        emit(_allow_all_row(p, job, f"{name} fit ({steps} steps)"))


def _allow_all_row(p: Profile, job: Job, check: str) -> Row:
    """One ``allow_all`` job: defaults and ``allow="all"`` in turn."""
    plain, ours, notes = [], [], []

    def tuned() -> None:
        cb = callback(allow="all")
        ours.append(job.fit(0, callbacks=[cb]))
        notes.append(_summary(cb))

    for r in range(p.rounds):
        _in_turn(r, [lambda: plain.append(job.fit(0)), tuned])
    return ratio_row("allow_all", check, ours, plain, most=1 / 0.97, smoke=p.smoke, slack_s=0.5,
                     detail=_rounds(notes))  # fmt: skip


def batch_knee(p: Profile, emit: Emit) -> None:
    """``find_batch_size``'s knee against Lightning's power search, trained at both picks."""
    from benchmarks import batch_size as bench

    argv = ["--smoke"] if p.smoke else ["--search-rounds", "1", "--rounds", str(p.rounds)]
    args = bench.build_parser().parse_args(argv)
    if p.smoke:
        for key, value in bench.SMOKE.items():
            setattr(args, key, value)
        args.samples, args.samples_per_config = 512, 256
    plan, ours_s = bench.search_ours(args)
    theirs, theirs_s = bench.search_lightning(args)
    ours_rate, theirs_rate = [], []
    for r in range(p.rounds):
        _in_turn(r, [
            lambda: ours_rate.append(bench.train_at(args, plan.fastest_batch_size).samples_per_s),
            lambda: theirs_rate.append(bench.train_at(args, theirs).samples_per_s),
        ])  # fmt: skip
    ratio = statistics.median(ours_rate) / statistics.median(theirs_rate)
    detail = f"search {ours_s:.1f} s vs {theirs_s:.1f} s"
    if plan.fastest_batch_size == theirs:
        # The same batch trained twice: their ratio is the machine's noise (0.82x in one run
        # here), not the pick's. Shown, and the row holds by construction.
        detail += f"; the same batch, its two fits' ratio {ratio:.2f}x is noise"
        ratio = 1.0
    emit(
        Row(
            "batch_knee", "knee's rate vs Lightning's pick", ">= 0.90x", ratio,
            f"{ratio:.2f}x (batch {plan.fastest_batch_size} vs {theirs})",
            None if p.smoke else ratio >= 0.9, detail,
        )
    )  # fmt: skip


def monitor_cost(p: Profile, emit: Emit) -> None:
    """The monitor's hooks per step against a tiny step's time."""
    from benchmarks.monitor_overhead import direct_cost

    direct = direct_cost(64, steps=500 if p.smoke else 5000)
    job = Job("monitor_cost", tiny_mlp, latency_dataset(64 * 200, 0.0), batch_size=64, steps=200)
    timer = StepTimer(50, 150)
    job.fit(0, callbacks=[timer])
    assert timer.start is not None and timer.stop is not None
    step_s = (timer.stop - timer.start) / 150
    share = direct["hook_us_per_step"] / 1e6 / step_s
    emit(
        Row(
            "monitor_cost", "hooks per step", "< 1 % of a tiny step", share,
            f"{share:.2%} ({direct['hook_us_per_step']:.0f} us of {step_s * 1e3:.2f} ms)",
            None if p.smoke else share < 0.01,
            f"sampler {direct['sampler_ms_per_reading']:.2f} ms a reading",
        )
    )  # fmt: skip


def demo(p: Profile, emit: Emit) -> None:
    """The demo's job (MobileNetV3, 256 px JPEGs cropped to 64, 5 ms reads), 120 steps."""
    from benchmarks.workloads.jpeg import ImageClassifier, JpegFolderDataset

    steps = p.steps(120, 8)
    data = jpeg_dataset(256, 64)
    assert isinstance(data, JpegFolderDataset)
    data.read_latency_s = 0.005
    job = Job("demo", partial(ImageClassifier, "mobilenet_v3_small"), data, steps=steps)
    plain, ours, notes = [], [], []

    def tuned() -> None:
        cb = callback()
        ours.append(job.fit(0, persistent=False, callbacks=[cb]))
        notes.append(_summary(cb))

    for r in range(p.rounds_of("demo")):
        _in_turn(r, [lambda: plain.append(job.fit(0, persistent=False)), tuned])
    emit(ratio_row("demo", "fit vs defaults", ours, plain, most=0.8, smoke=p.smoke,
                   detail=_rounds(notes)))  # fmt: skip
