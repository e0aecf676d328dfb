"""``Tuner``: carries out the closed loop's decisions inside one fit.

``TuningLoop`` (pure) decides what to measure, try and keep; the tuner owns what those decisions
act on (the switchable train loader, the user's own loader for ``tune_dataloader``) and what
they leave behind (knob changes with their times, notes), and puts them in the report. The
callback makes a new one for every fit and feeds it measured windows.

Long because it is one idea with many small steps: each decision of the loop (measure the loader,
start, re-measure, cut short, finish a trial, stop) is carried out here, where the loader, the
knobs, the cost and the notes they change live together.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from lightning_maxtp.callbacks.console import Verbosity, baseline_line, trial_line
from lightning_maxtp.callbacks.drift import explain_drift, snapshot
from lightning_maxtp.callbacks.guard import NumericsGuard
from lightning_maxtp.callbacks.journal import Journal
from lightning_maxtp.callbacks.knobs import Knobs
from lightning_maxtp.callbacks.loader_trial import (
    measure_loader,
    most_workers,
    plan_change,
    search_floor_s,
)
from lightning_maxtp.callbacks.math_knobs import MathKnobs
from lightning_maxtp.callbacks.math_trial import MathTrials
from lightning_maxtp.callbacks.metrics import PROGRESS_BAR
from lightning_maxtp.knobs.base import Offer
from lightning_maxtp.knobs.registry import (
    GUARDED,
    LOADER_SETTINGS,
    MATH_KNOBS,
    PERSISTENT,
    PREFETCH,
    WORKERS,
    knob_class,
)
from lightning_maxtp.loader.switchable import SwitchableLoader, switchable_reason
from lightning_maxtp.observe.job_model import JobModel
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.window import combined_rate
from lightning_maxtp.tuning.affordable import (
    Funds,
    affordable,
    may_try_one_more,
    remeasure_refused,
    sized,
    switch_s,
    unpaid,
    worst_case_s,
)
from lightning_maxtp.tuning.carry import carried_settings, loader_key, machine_key, state
from lightning_maxtp.tuning.cost import TuningCost
from lightning_maxtp.tuning.decisions import (
    ASK,
    Ask,
    AskMath,
    Decision,
    MeasureLoader,
    Remeasure,
    Step,
    Stop,
    Try,
)
from lightning_maxtp.tuning.in_force import in_force
from lightning_maxtp.tuning.sequential import baseline_decided, cycle_steps, early_steps
from lightning_maxtp.tuning.switches import (
    Switches,
    queued_batches,
    starts_workers,
    workers_after,
)
from lightning_maxtp.tuning.trials import (
    KnobTrial,
    TuningSummary,
    fmt_settings,
    labelled_untried,
    remaining,
    top_line,
)
from lightning_maxtp.tuning.tuning_loop import (
    NOTHING_LEFT,
    WARMUP_WITHOUT_WORKERS,
    TuningLoop,
    window_rate,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
    from lightning_maxtp.observe.window import Window
    from lightning_maxtp.resources.probe import Resources
    from lightning_maxtp.tuning.admission import Admission
    from lightning_maxtp.tuning.config import TuningConfig

__all__ = ["Tuner"]

log = logging.getLogger(__name__)

_FOLLOWED = (WORKERS, PERSISTENT)
"""A validation loader follows the train loader when these were the same in both."""
MIN_EPOCH_WINDOW = 8
"""The fewest steps a tuning window shortened to one epoch may have (``Tuner.fit_started``)."""


class Tuner:
    """One fit's tuning: the loop, the train loader it switches, the changes and the notes.

    Args:
        config: What the loop may do.
        monitor: The monitor measuring the fit (windows restart and carry settings through it).
        resources: The probe's result (CPU budget, GPUs) for the loader measurement.
        verbosity: What the loop prints on rank zero (``console.verbosity``): nothing, the
            brief lines (plan, baseline, a line per trial, result), or every step.
        progress_bar: Show the tuning's rate, trials, state and MFU in the progress bar.
        carried: Settings tuned earlier (the callback's checkpoint state, or its last fit's),
            applied at once when the machine and the loader match (``carry``).
        world_size: Ranks of the fit (part of what the settings were tuned on).
        local_ranks: Ranks on this node, sharing its CPUs, RAM and ``/dev/shm``.
        allowed: The math knobs ``allow`` permits (``allow.resolve_allow``).
    """

    def __init__(
        self,
        config: TuningConfig,
        monitor: BottleneckMonitor,
        resources: Resources | None,
        *,
        verbosity: Verbosity,
        progress_bar: bool = False,
        carried: dict[str, Any] | None = None,
        world_size: int = 1,
        local_ranks: int = 1,
        allowed: tuple[str, ...] = (),
    ) -> None:
        self.config, self.monitor, self.resources = config, monitor, resources
        self.verbosity, self.carried = verbosity, carried
        self.progress_bar = progress_bar
        self.world_size, self.local_ranks = world_size, local_ranks
        self.loop = TuningLoop(config)
        self.math = MathKnobs(allowed)
        self.knobs = Knobs(self.math)
        self.guard = NumericsGuard()
        self.guard.enabled = bool(GUARDED & set(allowed))
        self.journal = Journal(verbosity, monitor.elapsed_s)
        """The report's notes and knob changes, and the loop's lines (the math trials' too)."""
        self.math_trials = MathTrials(
            config, self.loop, monitor, self.knobs, self.guard, self.journal
        )
        self.window_losses: list[float] = []
        """The losses of the window being handed to ``measured``/``monitored``."""
        self.source_loader: Any = None
        self.unswitchable: str | None = None
        """Why the train loader cannot be switched (``None``: it can, or none was seen yet)."""
        self.loader_plan: Any = None
        """``tune_dataloader``'s plan once measured (``False`` when it failed)."""
        self.cost = TuningCost()
        self.final: list[tuple[Window, tuple[Any, ...]]] = []
        """Windows measured under the settings in force since tuning ended, with diagnoses."""
        self.spans: list[tuple[str, float, float]] = []
        """Blocked spans, ``("blocked", start_s, end_s)`` on the monitor's clock."""
        self._tuning_span: list[float] = []
        self._drifted = False
        # The knob and the settings it replaced, of the trial under way (or the last one).
        self._last_knob = ""
        self._last_old: dict[str, Any] = {}
        self._undone_at: int | None = None
        """The loop's step at which a trial's settings were last undone."""
        self._settle_left = 0
        """Steps to leave out of the first monitoring window after an undo."""
        self._early_at = 0
        """The step of the open tuning window its early checks read at (``early_steps``, in
        whole turns of the workers it started with)."""
        self._early_checked: int | None = None
        """Trials finished when ``_cut_losing`` last read a window (it reads each trial once)."""
        self._before_resume: list[tuple[Window, tuple[Any, ...]]] | None = None
        """The windows under the settings in force before one more trial began after tuning."""
        self._unpaid_noted: set[str] = set()
        """The changes already noted as not tried for want of budget."""
        self.switches = Switches()
        """The pending switch (charged when its settle steps end) and the restarts measured."""
        self.window_steps = config.window_steps
        """Steps per tuning window: the config's, or one epoch when epochs are shorter
        (``fit_started``)."""
        self._epoch_baseline = False
        """The baseline closes at the first epoch's end (``_baseline_at_epoch_end``)."""
        self._ref_state: dict[str, Any] = {}
        """The process and knob state when the reference window was measured (``drift``)."""
        self._val: list[SwitchableLoader] = []
        """The fit's validation loaders that can be switched (``follow``)."""

    @property
    def loader(self) -> SwitchableLoader | None:
        """The fit's switchable train loader (``None``: none to switch); the knobs hold it."""
        return self.knobs.loader

    @loader.setter
    def loader(self, loader: SwitchableLoader | None) -> None:
        self.knobs.loader = loader

    @property
    def notes(self) -> list[str]:
        """The report's caveats so far (the journal's)."""
        return self.journal.notes

    @property
    def knob_changes(self) -> list[KnobChange]:
        """Every knob change so far, tried, kept or reverted (the journal's)."""
        return self.journal.knob_changes

    @property
    def trials(self) -> list[KnobTrial]:
        """Every knob trial so far, in order."""
        return self.loop.trials

    @property
    def summary(self) -> TuningSummary:
        """What the loop did (live while the fit runs)."""
        rate = combined_rate(in_force(self.loop, self.final)[0])
        return self.loop.summary(
            self._settings(), tuple(self.notes), rate, self._cost(), now=time.perf_counter()
        )

    def _cost(self) -> TuningCost:
        cost = dataclasses.replace(self.cost, lost_s=sum(t.lost_s for t in self.trials))
        ref, base = self.loop.ref, self.loop.baseline
        if ref is None or base is None:
            return cost
        since = 0 if self.loop.kept_at is None else self.loop.steps - self.loop.kept_at
        return cost.with_earnings(since, base, window_rate(ref), self.loop.banked_steps)

    def _settings(self) -> dict[str, Any]:
        return self.knobs.settings()

    def wrap(self, loader: object) -> object:
        """The train loader to use: the user's, wrapped so its knobs can switch mid-epoch."""
        if isinstance(loader, SwitchableLoader):  # ours, from an earlier fit of this Trainer
            self.loader, self.source_loader = loader, loader.source
            return loader
        why = switchable_reason(loader)
        self.unswitchable = why
        if why is not None:
            self.journal.note(f"loader knobs not changed: {why}")
            return loader
        previous = self.loader  # Lightning reloads its loaders (reload_dataloaders_every_n_epochs)
        cpus = int(self.resources.cpu.effective) if self.resources else 1
        self.source_loader = loader
        self.loader = SwitchableLoader(loader, cpu_threads=cpus)  # type: ignore[arg-type]
        if previous is not None:  # the settings in force go on with the new loader
            self.loader.request(**previous.settings())
            previous.followers = []
            previous.shutdown()
        self._attach_followers()
        return self.loader

    def follow(self, loader: object) -> object:
        """A validation loader: it takes the train loader's settings when it was built alike.

        Users build both loaders with the same workers and persistence; a worker count or a
        persistence the loop keeps for the one then holds for the other, whose workers restart
        at every validation run as the train loader's do at every epoch. Wrapped when it can
        be switched; it follows once the train loader is known to match it.
        """
        if isinstance(loader, SwitchableLoader):  # ours, from an earlier fit of this Trainer
            self._val.append(loader)
        elif switchable_reason(loader) is None:
            cpus = int(self.resources.cpu.effective) if self.resources else 1
            loader = SwitchableLoader(loader, cpu_threads=cpus)  # type: ignore[arg-type]
            self._val.append(loader)
        self._attach_followers()
        return loader

    def _attach_followers(self) -> None:
        """The validation loaders whose settings match the train loader's follow it."""
        train = self.loader
        if train is None:
            return
        own = {k: v for k, v in train.source.__dict__.items() if k in _FOLLOWED}
        followers = [v for v in self._val if {k: getattr(v.source, k) for k in _FOLLOWED} == own]
        for follower in followers:
            if follower not in train.followers:
                follower.request(**train.settings())  # what the train loader runs with now
        train.followers = followers

    @property
    def followers(self) -> int:
        """Validation loaders that follow the train loader's settings."""
        return 0 if self.loader is None else len(self.loader.followers)

    def fit_started(self, trainer: pl.Trainer) -> None:
        """Fit the loop's steps to this fit: its epochs' length, what needs warming up.

        Tuning windows are one epoch long when epochs are shorter than ``window_steps``: each
        window then holds exactly one epoch boundary (its workers starting, validation), so
        windows compare alike and what the epochs cost is in every one; and a short-epoch fit,
        short in steps too, gets its verdicts sooner. Not under ``MIN_EPOCH_WINDOW`` steps:
        too few to time a setting by. The baseline is the exception: it ends with the first
        epoch (``_baseline_at_epoch_end``), so a first trial starts before the second epoch
        starts its workers, and the warm-up is shortened to leave it ``MIN_EPOCH_WINDOW``
        steps (not below ``WARMUP_WITHOUT_WORKERS``: the baseline then holds a boundary, as
        the other windows do). A loader without workers of a model not compiled has
        nothing to warm up (``TuningLoop.nothing_to_warm``); one with workers warms up until
        their first queue is used (``TuningLoop.drain_first``), unless windows are epoch-long.
        """
        from lightning_maxtp._compat.torch_modules import is_compiled

        settings = self._loader_settings()
        workers = settings.get(WORKERS)
        if workers == 0 and not is_compiled(trainer.lightning_module):
            self.loop.nothing_to_warm()
        batches = trainer.num_training_batches
        steps = self.config.window_steps
        if isinstance(batches, int) and MIN_EPOCH_WINDOW <= batches < steps:
            steps = batches
            early = batches - MIN_EPOCH_WINDOW
            self._epoch_baseline = early >= WARMUP_WITHOUT_WORKERS
            if self._epoch_baseline:
                self.loop.warmup_steps = min(self.loop.warmup_steps, early)
        elif workers:
            self.loop.drain_first(queued_batches(workers, settings.get(PREFETCH)))
        self.window_steps = steps
        self.monitor.window_steps = steps

    def adopt(self, trainer: pl.Trainer) -> None:
        """Apply settings tuned earlier, when they match (rank zero decides under DDP)."""
        self.math.bind(trainer)
        self.adopt_carried(trainer)

    def state(self) -> dict[str, Any]:
        """What to carry into a checkpoint or the next fit: the settings tuning converged to."""
        if self.loader is None or not self.loop.converged or not self.loop.finished:
            return {}  # not mid-trial either (one more trial after tuning converged)
        machine = machine_key(self.resources, self.world_size)
        settings = {**self.loader.settings(), **self.math.in_force}
        return state(settings, machine, loader_key(self.source_loader))

    def on_step(self, trainer: pl.Trainer, window: Window | None) -> None:
        """A training step ended, closing ``window`` (or none): act on it, then on the step.

        A measured window may start at this boundary. A step into a trial's first window, it
        may end early (``_cut_losing``), and so may a baseline that is data-bound beyond doubt
        (``_decided_baseline``): the window they close is acted on here, in turn.
        """
        if window is not None:
            self.on_window(trainer, window)
        self._cut_losing(trainer)
        self._decided_baseline(trainer)
        self._baseline_at_epoch_end(trainer)
        self._settle_longer(trainer)
        # Settle steps count once the old workers drained their in-flight batches
        # (deterministic, so every DDP rank closes its window at the same step); a loader that
        # is not switched has none in flight for a change.
        switched = self.loader is None or self.loader.switched
        if self._settle_left and self.loop.finished and switched:
            self._settle_left -= 1
            if not self._settle_left:
                self._charge_switch()
                self.monitor.restart_window()
        if self.loop.on_step(switched=switched, now=time.perf_counter()):
            self._charge_switch()
            steps = self._turns(self.window_steps)
            self.monitor.window_steps = steps
            self._early_at = early_steps(steps, self._workers())
            self.monitor.restart_window()
            self.guard.clear()
            if not self._tuning_span:  # the baseline window starts: tuning starts
                self._tuning_span.append(self.monitor.elapsed_s())

    def on_window(self, trainer: pl.Trainer, window: Window, *, closing: bool = False) -> None:
        """Act on a closed window: record its diagnosis, then judge it, monitor it, or neither.

        Args:
            trainer: The fit's trainer.
            window: The window the clock closed.
            closing: The fit's last steps, under the settings in force (closed at its end).
        """
        loop, monitor = self.loop, self.monitor
        self.window_losses = self.guard.take()
        if window.steps and not closing:  # the first window after a start: what it cost
            self.switches.rate_start(window.total_s / window.steps)
        if closing:
            self.monitored(window, monitor.record(trainer, window, may_capture=False))
        elif loop.measuring:  # no profiler inside a measured window
            found = monitor.record(trainer, window, may_capture=False)
            self.measured(trainer, window, found)
            if self.progress_bar:
                self._show_progress(trainer, window)
        elif loop.finished:
            self.monitored(window, monitor.record(trainer, window), trainer)
        else:  # warm-up or settle steps: reported, never judged, no profiler before tuning ends
            monitor.record(trainer, window, may_capture=False)

    def _show_progress(self, trainer: pl.Trainer, window: Window) -> None:
        """Tuning progress in the progress bar: rate of the window, trials, whether done."""
        module = trainer.lightning_module
        util = window.utilization
        mfu = None if util is None else util.mfu
        values = (window_rate(window), len(self.trials), float(not self.loop.finished), mfu)
        for name, value in zip(PROGRESS_BAR, values, strict=True):
            if value is not None:  # no FLOP count or peak: no MFU shown
                module.log(name, float(value), prog_bar=True, logger=False, on_step=True)

    def _workers(self, settings: dict[str, Any] | None = None) -> int:
        """The loader's workers under ``settings`` (default: those in force); 0 without one."""
        if settings is None:
            settings = self._loader_settings()
        return int(settings.get(WORKERS) or 0)

    def _loader_settings(self) -> dict[str, Any]:
        """The train loader's settings: the switchable one's, else the user's loader's.

        The user's as read at the fit's start: the loop does not change them.
        """
        if self.loader is not None:
            return self.loader.settings()
        ctx = self.monitor.context
        return {WORKERS: ctx.num_workers, PREFETCH: ctx.prefetch_factor}

    def _turns(self, steps: int, settings: dict[str, Any] | None = None) -> int:
        """A tuning window's length in whole turns of the workers (``cycle_steps``).

        One epoch's window stays one epoch: it holds the epoch's boundary, whatever the workers.
        """
        if steps != self.config.window_steps:
            return steps
        return cycle_steps(steps, self._workers(settings))

    def _mark_switch(self, settings: dict[str, Any]) -> None:
        """A switch to ``settings`` is requested now: its settle steps are charged later.

        With the batches the workers it starts may have ready at once, which its settle drains
        (``queued_batches``).
        """
        context = self.knobs.context()
        starts = workers_after(settings, context) if starts_workers(settings, context) else 0
        prefetch = settings.get(PREFETCH, context.get(PREFETCH))
        queued = queued_batches(starts, prefetch)
        self.switches.mark(len(self.monitor.step_log), starts=starts, queued=queued)

    def _charge_switch(self) -> None:
        """The pending switch's settle steps are over: their excess over the reference counts.

        No window measures them, yet they cost: workers restarting, a compile compiling.
        """
        ref, start = self.loop.ref, self.switches.pending_from
        if ref is None or start is None or not ref.steps:
            return
        steps = [s for _, s, _ in self.monitor.step_log[start:]]
        excess = self.switches.charge(steps, ref.total_s / ref.steps)
        if excess:
            self.cost = dataclasses.replace(self.cost, switch_s=self.cost.switch_s + excess)

    def _cut_losing(self, trainer: pl.Trainer) -> None:
        """Close a trial's first window early when its first steps already decide it.

        They lose (``TuningLoop.losing``), or confirm its predicted gain
        (``TuningLoop.winning``). Read once per trial, after ``early_steps`` steps of its first
        window (every rank counts the same steps), so that under DDP every rank takes part in
        the one broadcast at the same step.
        """
        loop, monitor = self.loop, self.monitor
        if not loop.in_first_trial_window:
            return
        if monitor.open_steps != self._early_at:
            return
        if self._early_checked == len(loop.trials):
            return  # this trial's window was read already (a step since went unrecorded)
        self._early_checked = len(loop.trials)
        if monitor.open_steps >= monitor.window_steps:
            return  # the window closes at this step anyway
        early = None
        if trainer.is_global_zero:
            steps = monitor.open_window()
            early = "losing" if loop.losing(*steps) else "winning" if loop.winning(*steps) else None
        if trainer.world_size > 1:
            early = trainer.strategy.broadcast(early, src=0)
        if early == "losing":
            loop.cut_short()
            self.journal.say(
                f"{loop.trial_knob}: slower on every one of {monitor.open_steps} steps: cut short"
            )
            self._close_now(trainer)
        elif early == "winning":
            self.journal.say(
                f"{loop.trial_knob}: faster as predicted on every one of {monitor.open_steps} "
                "steps: judged now"
            )
            self._close_now(trainer)

    def _close_now(self, trainer: pl.Trainer) -> None:
        """Close the open window at this step (every rank) and act on it (``on_window``)."""
        window = self.monitor.close_window(trainer)
        if window is not None:
            self.on_window(trainer, window)

    def _settle_longer(self, trainer: pl.Trainer) -> None:
        """A settle ends only once its steps read the new settings' steady rate.

        Two reasons to run one more settle step, read at the last one: workers the switch
        started still handing out the batches they prefetched while starting
        (``TuningLoop.draining``: a count, the same on every rank), or a compile still
        compiling (a knob that ``settles_until_steady``: rank zero's step decides, broadcast).
        """
        loop, loader = self.loop, self.loader
        knob = loop.trial_knob
        if loop.settle_left != 1 or knob is None:
            return
        if loader is not None and loader.switched and loop.draining(self.switches.queued):
            loop.extend_settle()
            return
        if knob not in MATH_KNOBS or not knob_class(knob).settles_until_steady:
            return
        longer = None
        if trainer.is_global_zero:
            log = self.monitor.step_log
            longer = bool(log) and loop.settle_longer(log[-1][1])
        if trainer.world_size > 1:
            longer = trainer.strategy.broadcast(longer, src=0)
        if longer:
            loop.extend_settle()

    def _baseline_at_epoch_end(self, trainer: pl.Trainer) -> None:
        """Close an epoch-long baseline at the first epoch's end, before the next one starts.

        Epochs shorter than a window make every tuning window one epoch, holding one epoch
        start (``fit_started``); a baseline that did too would end a few steps into the second
        epoch, after its workers and the validation's started again under the settings a
        first trial may replace. Measured on 2 CPUs, 12-step epochs from 4 workers that do not
        persist (the scoreboard's ``short_epochs``): each such start cost about 2 s, and a
        first trial begun in the second epoch left that fit 1.03-1.19x slower than no workers
        by hand. The baseline's epoch start is predicted instead from the fit's first fetch
        (``StepClock._carry_epochs``). Every rank counts the same steps: no broadcast. A fit
        resumed mid-epoch never ends its first epoch here with the baseline's steps in it: its
        baseline is one epoch long, holding a boundary, as before.
        """
        monitor = self.monitor
        if not self._epoch_baseline or self.loop.phase != "baseline":
            return
        if monitor.epoch_steps != trainer.num_training_batches:
            return
        if MIN_EPOCH_WINDOW <= monitor.open_steps < monitor.window_steps:
            self._close_now(trainer)

    def _decided_baseline(self, trainer: pl.Trainer) -> None:
        """Close the baseline window early when its first steps are data-bound beyond doubt.

        Read once, after ``early_steps`` steps (every rank counts the same steps; rank zero's
        steps decide, broadcast, so every rank closes at the same step).
        """
        monitor = self.monitor
        if self.loop.phase != "baseline":
            return
        if monitor.open_steps != self._early_at:
            return
        if monitor.open_steps >= monitor.window_steps:
            return  # the window closes at this step anyway
        decided = None
        if trainer.is_global_zero:
            decided = baseline_decided(monitor.open_window()[0], monitor.open_waits())
        if trainer.world_size > 1:
            decided = trainer.strategy.broadcast(decided, src=0)
        if decided:
            self.journal.say(
                f"baseline: every one of {monitor.open_steps} steps waits on data: decided"
            )
            self._close_now(trainer)

    def measured(self, trainer: pl.Trainer, window: Window, found: tuple[Any, ...]) -> None:
        """A baseline or trial window closed: judge it; measure again, try the next, or stop."""
        loop = self.loop
        check = self.math_trials.guard_window(trainer, self.window_losses)
        ending, left = "", self._steps_left()
        if loop.phase == "baseline":
            loop.record_baseline(window, found)
            self._ref_state = snapshot(self.math)  # what a later drift is compared with
            model = JobModel.from_window(window)
            if model is not None and model.workers == 0:
                # What loading costs in one process, for windows too short to read it. Not
                # from workers: their waits are then read from their CPU and the step's wait,
                # a bound, and would pin every later window's model to it.
                self.monitor.update_context(loading_s=(model.load_s, model.load_cpu_s))
            self._budget(trainer, window)
            self.journal.say(
                f"baseline {window_rate(window):.1f} samples/s over {window.steps} steps, "
                f"data wait {window.data_wait_share:.0%}; {top_line(found)}",
                brief=baseline_line(window_rate(window), found, self.cost),
            )
        else:
            guarded = check is not None and not check.passed  # the same on every rank
            verdict = None
            if trainer.is_global_zero and not guarded:
                verdict = loop.judge(window, steps_left=left, undo_s=self._undo_s())
                # Decided on its first pair because the fit ends (``decided_at_the_end``):
                # with the steps for it, the verdict would have been another.
                if verdict != loop.judge(window):
                    ending = (
                        f"the fit ends in {left:.0f} steps, too few to measure "
                        f"{loop.trial_knob} again or try another change"
                    )
                    self.journal.say(f"{ending}: {verdict} on its first pair")
            if isinstance(verdict, Remeasure) and not self._remeasure_paid(verdict, window):
                verdict = loop.without_remeasure(window)
            if trainer.world_size > 1 and not guarded:
                verdict = trainer.strategy.broadcast(verdict, src=0)
            verdict = "guarded" if guarded else verdict
            assert verdict is not None
            if self._continue_trial(verdict, window, found, check):
                return
        decision = None
        if trainer.is_global_zero:
            decision = Stop(ending) if ending else self._decide()
        if trainer.world_size > 1:
            decision = trainer.strategy.broadcast(decision, src=0)
        if isinstance(decision, Try):
            self._start_trial(trainer, decision)
        else:
            self.stop(decision.reason if isinstance(decision, Stop) else "no decision")

    def _steps_left(self) -> float:
        """Training batches left in the fit (``inf`` when Lightning cannot say).

        Counted as the loop counts them, a step per batch since this fit began (an optimizer
        step is several batches under accumulation, several optimizer steps one batch under
        manual optimization). A fit resumed from a checkpoint is counted whole: too many steps
        left only keep the rules that save the fit's last steps from acting, while Lightning's
        count of a resumed fit (its whole length, at the loader's batch size now) would leave
        too few when the batch size changed.
        """
        batches = self.cost.batches
        if batches is None or not math.isfinite(batches):
            return math.inf
        return max(0.0, batches - self.loop.steps)

    def _budget(self, trainer: pl.Trainer, baseline: Window) -> None:
        """The fit's expected length at the baseline rate, and what tuning may cost of it."""
        why = "no max_steps, an unsized loader"
        try:
            batches = float(trainer.estimated_stepping_batches) * trainer.accumulate_grad_batches
        except Exception as err:  # Lightning's estimate fails its own way per loader/strategy
            batches, why = math.inf, f"{type(err).__name__}: {err}"
        if not math.isfinite(batches) and self.config.cost_share is not None:
            self.journal.note(
                f"the fit's length is unknown ({why}): no tuning budget from cost_share; "
                "trials are bounded by max_trials and time_budget_s"
            )
        self.cost = self.cost.budgeted(baseline, batches, self.config.cost_share)

    def end(self) -> None:
        """The fit ended: a trial under way is recorded as unfinished and its settings undone."""
        if self._tuning_span:  # the steps measured from the baseline on (validation excluded)
            steps = [s for t, s, _ in self.monitor.step_log if t >= self._tuning_span[0]]
            self.cost = dataclasses.replace(self.cost, fit_s=sum(steps), steps_run=len(steps))
        self._charge_switch()  # the fit ended before a switch's settle steps did
        trial = self.loop.end(now=time.perf_counter(), guard=self.math_trials.closing_check())
        if trial is not None:
            self._finish_trial(trial)
        self.restore()

    def restore(self) -> None:
        """Put the process state back (main threads, math flags).

        The next fit starts as this one did. Idempotent: the fit's end, an exception and the
        teardown all call it.
        """
        self.knobs.restore()
        self.math.restore()

    def monitored(
        self, window: Window, found: tuple[Any, ...], trainer: pl.Trainer | None = None
    ) -> None:
        """A window under the final settings closed (after tuning, or the fit's closing one).

        With ``trainer`` (not the fit's closing window), an automatic change it names that the
        loop has not tried is tried now, as one more trial, when the budget left pays for it.
        """
        self.final.append((window, found))
        if self.loop.finished:
            self.watch_drift(window)
            self.math_trials.watch(self.window_losses)
            if trainer is not None:
                self._one_more(trainer, window, found)

    def _one_more(self, trainer: pl.Trainer, window: Window, found: tuple[Any, ...]) -> None:
        """After tuning converged: try the automatic change a monitoring window names, once.

        When ``affordable.may_try_one_more`` lets it: sized and paid for as a trial during
        tuning is, or noted with why it was not tried.
        """
        loop = self.loop
        if not may_try_one_more(
            converged=loop.converged,
            switchable=self.loader is not None,
            settling=bool(self._settle_left),
            baseline_measured=loop.baseline is not None,
        ):
            return
        change = None
        room = loop.room(self._steps_left())
        if trainer.is_global_zero and len(loop.trials) < self.config.max_trials and room:
            settings = self.knobs.context()
            device = self.monitor.context.device_type
            loop.skipped.clear()
            change = loop.next_try(tuple(found), settings, device_type=device)
            change = None if change is None else self._sized(change, window)
            if change is not None and not loop.time_left(time.perf_counter()):
                change = None
            if change is not None and not self._affordable(change, settings):
                self._unpaid(change, settings, once=True)
                change = None
        if trainer.world_size > 1:
            change = trainer.strategy.broadcast(change, src=0)
        if change is None:
            return
        self.final.pop()  # the window becomes the reference
        loop.resume(window, found, now=time.perf_counter())
        self.monitor.window_steps = self._turns(self.window_steps)
        self._tuning_span.append(self.monitor.elapsed_s())
        self.journal.say(f"one more trial after tuning: {top_line(found)}")
        self._start_trial(trainer, change)

    def watch_drift(self, window: Window) -> None:
        """After tuning: explain (once) a window much slower than the tuned rate.

        ``drift.explain_drift`` checks what the windows and the process show: a setting or the
        process's state that differs from the reference window's (a revert left something
        behind), other processes taking CPUs, a few long steps. What it finds goes in the
        note; a drift nothing explains says so.
        """
        tuned = window_rate(self.loop.ref) if self.loop.ref is not None else None
        slow = tuned and window_rate(window) < (1 - self.config.drift_share) * tuned
        if slow and not self._drifted and self.loop.ref is not None:
            self._drifted = True
            cause = explain_drift(self.loop.ref, window, self._ref_state, snapshot(self.math))
            why = (
                str(cause)
                if cause is not None
                else "no cause shown (settings, process state, other processes' CPU use and "
                "long steps checked)"
            )
            last = self.monitor.diagnoses[-1] if self.monitor.diagnoses else ()
            self.journal.note(
                f"throughput drifted at step {window.first_step}: "
                f"{window_rate(window):.1f} vs {tuned:.1f} samples/s tuned: {why}; "
                f"{top_line(last)}"
            )

    def extend(self, report: ThroughputReport) -> ThroughputReport:
        """The monitor's report, describing the settings in force, with what tuning did.

        The headline numbers and the diagnoses come only from windows measured under the final
        settings: those after tuning ended (the reference window they were judged by
        included), or when tuning did not end, the reference window; never a reverted or
        unfinished trial's.
        """
        final, found = in_force(self.loop, self.final, report)
        rate = combined_rate(final)
        tuning = self.loop.summary(
            self._settings(), tuple(self.notes), rate, self._cost(), now=time.perf_counter()
        )
        notes = [*report.notes, *str(tuning).split("\n")[:2], *(str(t) for t in self.trials)]
        return dataclasses.replace(
            report,
            diagnoses=labelled_untried(
                remaining(tuple(found), self.loop.tried, tuning.settings),
                self._untried_why(),
                loader_why=self.unswitchable,
            ),
            knob_changes=tuple(self.knob_changes),
            notes=(*notes, *self.notes),
            final_windows=tuple(final),
            tuning=tuning.to_dict(),
            spans=self._spans(),
        )

    def _untried_why(self) -> str:
        """Why an automatic change named at the end of the fit was not tried by the loop."""
        reason = self.loop.stop_reason
        if reason.startswith("tuning cost budget spent"):
            return f"the tuning budget was spent ({reason.split(': ', 1)[1]})"
        if reason.startswith("tuning cost budget too small"):
            return f"the tuning budget left was too small ({reason.split(': ', 1)[1]})"
        if self.loop.finished:
            return f"tuning had stopped ({reason})"
        return "the fit ended first"

    def _spans(self) -> tuple[tuple[str, float, float], ...]:
        # Start and end in turn: tuning, then one more trial after it, ...; one left open runs
        # until now.
        ends = [*self._tuning_span, self.monitor.elapsed_s()]
        spans = [("tuning", ends[i], ends[i + 1]) for i in range(0, len(self._tuning_span), 2)]
        return (*spans, *self.spans)

    def adopt_carried(self, trainer: pl.Trainer) -> None:
        """Apply the carried settings when they match (rank zero decides under DDP)."""
        loader = self.loader
        if loader is None or self.loop.finished:
            return
        decision = None
        if trainer.is_global_zero:
            machine = machine_key(self.resources, self.world_size)
            key = loader_key(self.source_loader)
            decision = carried_settings(self.carried, machine, key, self.config.max_workers)
        if trainer.world_size > 1:  # ranks may see different CPUs: one decision for all
            decision = trainer.strategy.broadcast(decision, src=0)
        settings, why = decision if decision is not None else (None, "")
        if settings is None:
            if why:
                self.journal.note(why)
            return
        # Math knobs come back only where this fit allows them and could try them (its Trainer's
        # precision or strategy may differ from the fit that kept them).
        math = self.math
        settings = {
            k: v
            for k, v in settings.items()
            if k in LOADER_SETTINGS or (k in math.allowed and isinstance(math.offer(k), Offer))
        }
        now = self.knobs.current(settings)
        changed = {k: v for k, v in settings.items() if now.get(k) != v}
        if changed:
            self.knobs.request(**changed)
        self.stop(why, converged=True)

    # -- the steps of the loop --------------------------------------------------------------

    def _decide(self) -> Decision:
        """Rank zero: the next trial, or why the loop stops (``Try`` or ``Stop``).

        The loop asks for what it cannot know itself: the loader measured alone (training
        waits for it) and the next allowed math knob; each is answered once.
        """
        cost = self._cost()
        if cost.left_s <= 0:
            spent = f"{cost.cost_s:.1f} s of {cost.budget_s or 0:.1f} s"
            return Stop(f"tuning cost budget spent: {spent}")
        settings = self.knobs.context()
        device = self.monitor.context.device_type
        # A loader that cannot be switched (see the notes) leaves the other knobs: its own
        # settings are then absent from ``settings``, and no loader knob is tried.
        switchable = self.loader is not None
        wants_plan = self.config.tune_loader and self.loader_plan is None and switchable
        plan: Try | Ask | None = ASK if wants_plan else None
        math_knob: Try | Ask | None = ASK
        unpaid = ""
        self.loop.skipped.clear()  # the budget may pay now for what it could not before
        while True:
            decision = self.loop.decide(
                settings,
                device_type=device,
                now=time.perf_counter(),
                steps_left=self._steps_left(),
                plan=plan,
                math=math_knob,
            )
            proposed = decision
            if isinstance(decision, Try) and decision is not plan and decision is not math_knob:
                sized = self._sized(decision)
                if sized is None:  # no count pays for its start in what is left of the fit
                    self.loop.skipped |= {(k, repr(v)) for k, v in decision.settings.items()}
                    continue
                decision = sized
            if isinstance(decision, MeasureLoader):
                plan = self._plan_change()
            elif isinstance(decision, AskMath):
                cost_now = self.summary.cost
                left = cost_now.left_s if cost_now is not None else math.inf
                math_knob = self.math_trials.change(decision.kind, left, decision.named)
            elif (
                isinstance(decision, Try)
                and decision is not plan  # its trial's cost was set aside before measuring
                and not self._affordable(decision, settings)
            ):
                text = self._unpaid(decision, settings)  # each one noted; the first says why
                unpaid = unpaid or text  # the loop stops, if it does
                if decision is math_knob:
                    math_knob = None
                else:
                    for change in (decision, proposed):  # as proposed, and as sized
                        assert isinstance(change, Try)
                        self.loop.skipped |= {(k, repr(v)) for k, v in change.settings.items()}
            elif isinstance(decision, Stop) and unpaid and decision.reason.startswith(NOTHING_LEFT):
                return Stop(f"tuning cost budget too small for the next trial: {unpaid}")
            else:
                return decision

    def _sized(self, change: Try, window: Window | None = None) -> Try | None:
        """``affordable.sized`` for this fit: ``None`` (noted) when no count pays for its start.

        ``window``: the one that named the change, when it is not the reference (a monitoring
        window after tuning).
        """
        answer = sized(
            change,
            window or self.loop.ref,
            batches=self.cost.batches,
            steps_done=self.loop.steps,
            per_start=self.switches.per_start,
            most=self.config.max_workers,
        )
        if isinstance(answer, str):
            self.journal.note(answer)
            return None
        return answer

    def _funds(self) -> Funds:
        """This fit's numbers for ``affordable``: budget, rest, reference, starts measured."""
        cost, ref = self._cost(), self.loop.ref
        return Funds(
            left_s=cost.left_s,
            rest_s=cost.remaining_s(self.loop.steps),
            baseline_rate=self.loop.baseline,
            ref_rate=None if ref is None else window_rate(ref),
            ref_step_s=ref.total_s / ref.steps if ref is not None and ref.steps else 0.0,
            ref_wait_share=None if ref is None else ref.data_wait_share,
            measured_starts=tuple(self.switches.measured),
        )

    def _trial_steps(self, change: Try, settings: dict[str, Any]) -> int:
        """A trial window's length under ``change``: whole turns of its workers (``_turns``)."""
        return self._turns(self.window_steps, {**settings, **change.settings})

    def _risk_s(self, change: Try, settings: dict[str, Any]) -> float:
        """What a trial of ``change`` costs at worst before a window can revert it (predicted).

        ``affordable.worst_case_s`` with this fit's reference and worker starts.
        """
        steps = self._trial_steps(change, settings)
        return worst_case_s(change.settings, settings, self._funds(), window_steps=steps)

    def _affordable(self, change: Try, settings: dict[str, Any]) -> Admission | None:
        """The rule that lets a trial of ``change`` start at its worst (``_risk_s``), or ``None``.

        Within the budget left, or past it on a strong prediction (``affordable.affordable``).
        """
        steps = self._trial_steps(change, settings)
        return affordable(change, settings, self._funds(), window_steps=steps)

    def _undo_s(self) -> float:
        """What undoing the trial under way costs beyond its steps (``affordable.switch_s``)."""
        pending = self.loop.pending
        if pending is None:
            return 0.0
        return switch_s(pending[0], self.knobs.context(), self.switches.measured)

    def _remeasure_paid(self, step: Remeasure, window: Window) -> bool:
        """Rank zero: whether the budget left pays for re-measuring ``step``.

        Its workers' start and the slower side's window at the rates measured so far
        (``affordable.remeasure_refused``, ``TuningLoop.remeasure_loss_s``); otherwise a note
        says why. ``window`` is the window that just closed, the trial's or a reference's.
        """
        knob, pending = self.loop.trial_knob, self.loop.pending
        assert knob is not None and pending is not None
        target = pending[0] if step.settings == "old" else pending[1]
        why = remeasure_refused(
            knob,
            target,
            self.knobs.context(),
            self._funds(),
            expected_gain=self.loop.trial_expected_gain,
            loss_s=self.loop.remeasure_loss_s(window, step.settings),
        )
        if why is not None:
            self.journal.note(why)
        return why is None

    def _unpaid(self, change: Try, settings: dict[str, Any], *, once: bool = False) -> str:
        """Why ``change`` was not tried for want of budget (a note, and the stop reason).

        With ``once``, noted only the first time this change is turned down.
        """
        text = unpaid(change, self._risk_s(change, settings), self._cost().left_s)
        key = fmt_settings(change.settings)
        if not once or key not in self._unpaid_noted:
            self._unpaid_noted.add(key)
            self.journal.note(f"not tried: {text}")
        return text

    def _plan_change(self) -> Try | None:
        """``tune_dataloader`` against the reference window's consumption rate: the trial, if any.

        Training waits while the loader is measured, so the time counts as blocked in the cost
        (and is drawn as a blocked span); a run whose budget cannot pay for it skips it.
        """
        assert self.loop.ref is not None and self.loader is not None
        most = most_workers(self.config, self.resources, self.local_ranks)
        workers = self.loader.settings().get(WORKERS) or 0
        if most is not None and workers >= most:
            # The search could only try fewer workers or a deeper prefetch: the loop tries those
            # on real steps without stopping training to measure the loader alone.
            self.journal.note(
                f"the loader is not measured alone: it already has {workers} workers, the most the "
                "search may try on this machine; single knobs are tried on real steps instead"
            )
            self.loader_plan = False
            return None
        cost, ref = self.summary.cost, self.loop.ref
        # The most a loader fast enough could save: the rest of the fit without its data wait.
        rest = cost.remaining_s(self.loop.steps) if cost is not None else None
        share = 1 - ref.samples_per_s / max(ref.device_samples_per_s, 1e-9)
        potential = 0.0 if rest is None else rest * max(0.0, share)
        # Training waits while the loader is measured: the budget left bounds it beforehand
        # (savings only expected never raise it), less what the trial it proposes may cost.
        trial = Try("loader plan", {WORKERS: most or 1}, "")
        reserve = self._risk_s(trial, self.knobs.context())
        left = (cost.left_s if cost else math.inf) - reserve
        seconds = min(self.config.loader_time_budget_s, left)
        floor = search_floor_s(ref)
        if seconds < floor:  # the search would end before it measured one worker in full
            self.journal.note(
                "the loader is not measured alone: comparing no worker with one needs about "
                f"{floor:.1f} s, and training may wait only {max(0.0, seconds):.2f} s for it "
                f"({reserve:.2f} s of the budget left kept for the trial it would propose; the "
                f"tuning budget is {self.cost.budget_s or 0:.2f} s of an expected "
                f"{self.cost.expected_fit_s or 0:.1f} s fit; a loader fast enough would save at "
                f"most {potential:.1f} s); single knobs are tried on real steps instead"
            )
            self.loader_plan = False
            return None
        rate = self.loop.ref.device_samples_per_s
        self.journal.say(f"measuring the loader alone against {rate:.1f} samples/s consumption")
        started, at = time.perf_counter(), self.monitor.elapsed_s()
        try:
            self.loader_plan = measure_loader(
                self.source_loader,
                self.loop.ref,
                self.config,
                self.resources,
                time_budget_s=seconds,
                local_ranks=self.local_ranks,
            )
        except Exception as err:  # advisory: the diagnosis loop still runs without it
            self.journal.note(f"tune_dataloader failed, skipped: {err!r}")
            self.loader_plan = False
            return None
        finally:
            blocked = self.cost.blocked_s + time.perf_counter() - started
            self.cost = dataclasses.replace(self.cost, blocked_s=blocked)
            self.monitor.restart_step()  # blocked, counted here: in no step's time
            self.spans.append(("blocked", at, self.monitor.elapsed_s()))
        return plan_change(self.loader_plan, self.loader.settings(), window_rate(self.loop.ref))

    def _start_trial(self, trainer: pl.Trainer, change: Try) -> None:
        knob, new, why = change.knob, change.settings, change.why
        old = self.knobs.current(new)
        admitted = self._affordable(change, self.knobs.context())
        self._last_knob, self._last_old = knob, old
        if self.final:  # one more trial after tuning: its windows are under the old settings
            self._before_resume = [*(self._before_resume or []), *self.final]
            self.final.clear()
        self.math_trials.start(trainer, knob)
        self._mark_switch(new)
        self.knobs.request(**new)
        # Windows measured from now on run with the new settings: diagnose them as such.
        self.monitor.update_context(**self.knobs.context())
        self.loop.start(
            knob,
            old,
            new,
            why,
            trainer.global_step,
            settle_steps=self.math_trials.settle_steps(knob),
            expected_gain=change.expected_gain,
            admitted=admitted,
        )
        self.journal.record_change(knob, old, new, f"trying: {why}")
        started = "" if admitted is None or admitted.rule == "budget" else f"; started {admitted}"
        self.journal.say(f"trying {fmt_settings(old)} -> {fmt_settings(new)} ({why}{started})")

    def _continue_trial(
        self, verdict: Step, window: Window, found: tuple[Any, ...], check: Any = None
    ) -> bool:
        """Act on a trial window's verdict; ``True`` while the trial goes on (re-measuring)."""
        assert self.loop.pending is not None
        old, new = self.loop.pending
        trial = self.loop.advance(verdict, window, found, check)
        if trial is None:  # looked like a gain: re-measure the reference, then the trial
            again = isinstance(verdict, Remeasure) and verdict.settings == "old"
            target, what = (old, "the reference") if again else (new, "the trial")
            current = self.knobs.current(target)
            self._mark_switch(target)
            self.knobs.request(**target)
            self.monitor.update_context(**self.knobs.context())
            self.journal.record_change(self._last_knob, current, target, f"re-measuring {what}")
            self.journal.say(
                f"{fmt_settings(current)} -> {fmt_settings(target)}: re-measuring {what}"
            )
            return True
        self._finish_trial(trial)
        return False

    def _finish_trial(self, trial: KnobTrial) -> None:
        self.journal.say(str(trial), brief=trial_line(trial))
        old = self._last_old
        current = self.knobs.current(old)
        # Nothing to undo when kept, or when the fit ended while re-measuring the original.
        if not trial.kept and current != old:
            self._undone_at = self.loop.steps
            self._mark_switch(old)
            self.knobs.request(**old)
            self.journal.record_change(
                trial.knob, current, old, trial.undo_reason(self.config.min_gain)
            )
        if trial.kept:
            self._ref_state = snapshot(self.math)
        if self._before_resume is not None:  # one more trial: unless kept, the windows before
            if not trial.kept:  # it are still under the settings in force
                self.final[:0] = self._before_resume
            self._before_resume = None
        self.math_trials.after_trial(trial)  # the guard's restore, after the knob is undone
        self.monitor.update_context(**self.knobs.context())

    def stop(self, reason: str, *, converged: bool | None = None) -> None:
        """Tuning is over (``TuningLoop.stop``): from now on the fit is only monitored."""
        self.loop.stop(reason, now=time.perf_counter(), converged=converged)
        if len(self._tuning_span) % 2:
            self._tuning_span.append(self.monitor.elapsed_s())
        steps = self.config.monitor_window_steps
        self.monitor.window_steps = steps
        if self._undone_at == self.loop.steps:
            # A trial was just undone: its first steps back (workers restarting, a pool
            # resized) are not the settings' rate, so the first monitoring window starts after
            # them, as a trial's windows do.
            self._settle_left = max(1, self.config.settle_steps)
        self.journal.say(
            f"tuning done after {self.summary.tuning_s:.1f} s: {reason}; now monitoring "
            f"every {steps} steps"
        )
