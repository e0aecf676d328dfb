"""A model of the running job, built from one measured window: what every loader setting gives.

Like tf.data's autotuner, each stage has a measured cost per sample and a parallelism, and the
model predicts the job's rate for any setting within the CPUs this rank has. Two stages:

* **the step**: ``step_s`` seconds per sample when it has its cores to itself, using
  ``step_cores`` cores while it runs (its intra-op threads on a CPU device; on a GPU host the
  thread that launches kernels);
* **the loader**: ``load_s`` seconds per sample in one process, of which ``load_cpu_s`` is CPU
  work and the rest waits (on reads, a network, a sleep). ``W`` workers deliver at most
  ``W / load_s`` samples/s; waiting costs no CPU, so waiting loaders scale almost for free.

With no workers the two run in series: ``t(0) = step_s + load_s`` seconds per sample. With
``W >= 1`` they overlap, and the loading's CPU work has ``k = min(W, cores)`` cores between
steps. Loaders are eager: they work whenever they have a free prefetch slot, so a share of
their CPU work (the step's share of the time) runs *during* the step. First on the cores the
step leaves free (``cores - step_cores``), at no cost to it; past those, on a CPU device, each
displaces one of the step's threads and every other thread waits for it at the next barrier:
the step stretches by ``CONTENTION`` seconds per CPU-second of that loading (``load_x`` per
sample). Per sample the step then takes ``s' = step_s * (1 + q * load_x / t)`` and the rest of
the loading runs between steps on ``k`` cores, which gives ``t`` from

    t = step_s + load_x / k + (q - 1/k) * load_x * step_s / t

bounded below by what ``W`` loaders deliver (``load_s / W``) and by the step alone. The same
equation read the other way gives ``step_s`` from a window measured with workers (the step it
saw was stretched).

On CUDA the host's step time is launch time; the steps' CUDA events give the device's own time
per sample (``device_s``), and no setting runs faster than it.

Epochs: what each epoch boundary costs beyond a steady step (``Window.epoch_cost_s``: the
workers starting again, the first batches, validation) is measured too. The part that is
worker starts (``restart_s`` per loader that restarts, the train loader and the validation
loaders that follow it) goes with persistence or with no workers; the rest stays. Spread over
an epoch's samples, it is part of every setting's time per sample.

Predicted, then confirmed: the loop tries the setting the model ranks best, real steps judge
it, and a measured window replaces the prediction (``JobModel.from_window`` of the trial's
window). Every number comes from the window; the one constant, ``CONTENTION``, was measured.

Long because it is one idea: the stages' costs read from a window and the predictions made from
them share every field, and each reading rule sits next to the prediction that needs it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.window import Window

__all__ = [
    "CONTENTION",
    "MAX_WORKERS_PER_CORE",
    "PER_WORKER_S",
    "WORKER_MEMORY_BYTES",
    "WORKER_START_S",
    "JobModel",
    "Prediction",
    "WorkerChoice",
]

CONTENTION = 2.5
"""Seconds a CPU step that computes on every core is stretched per CPU-second of loading that
displaces one of its threads. Measured on 2 CPUs at steady state (time per sample with 0, 1 and
2 workers): MobileNetV3 at 96 px (3.3 ms a sample on two threads, 1.0 ms of JPEG loading) 2.1
to 2.5; a conv step of 0.09 ms a sample (2.8 ms a batch, shorter than the scheduler's tick,
beside 1.35 ms of loading) 4.6. The smaller is the prior: a trial that falls short re-ranks the
next change in its direction by what it measured (``TuningLoop``)."""

WORKER_START_S = 0.05
PER_WORKER_S = 0.02
"""What starting a loader's workers costs before a start was measured: this base plus this per
worker. Measured on 2 CPUs, a process with torch and Lightning loaded, from ``iter()`` to the
first batch of a cheap dataset: 28 ms for 1 worker, 58 ms for 4, 136 ms for 8, 491 ms for 32.
A fit's own starts are measured as they happen (``tuning.switches``) and replace it."""

MAX_WORKERS_PER_CORE = 16
"""Most workers per core the model considers: loaders that wait on reads scale far past the
cores (a 3 ms read a sample on 2 CPUs: 8 workers 5.4 s, 16 workers 3.0 s, 32 workers 2.2 s for
12,800 samples), but every process holds memory and takes time to start."""

WORKER_MEMORY_BYTES = 256 * 2**20
"""Memory one worker is taken to hold when none was measured: the RAM ceiling is half the
available RAM divided by it."""

CLOSE_TO_BEST = 0.02
"""Without a fit length to weigh start-up against, the fewest workers whose predicted time per
sample is within this share of the best."""


@dataclass(frozen=True)
class Prediction:
    """The model's rate for one setting, and what bounds it."""

    workers: int
    samples_per_s: float
    bound: str
    """``"serial"`` (no workers: loading, then the step), ``"loader"`` (the workers deliver no
    faster), ``"cpu"`` (loading and the step share the cores), ``"step"`` (the step alone), or
    ``"measured"`` (the setting in force: its rate was measured)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


@dataclass(frozen=True)
class WorkerChoice:
    """The worker count the model ranks best, against the settings measured."""

    workers: int
    now: Prediction
    best: Prediction
    gain: float
    """Predicted relative gain in samples/s (0.8: 1.8x): the model's prediction for the
    setting in force against its prediction for this one."""
    reason: str
    persistent: bool = False
    """Whether the workers should persist across epochs (their restarts cost each epoch)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "workers": self.workers,
            "now": self.now.to_dict(),
            "best": self.best.to_dict(),
            "gain": self.gain,
            "reason": self.reason,
            "persistent": self.persistent,
        }


@dataclass(frozen=True)
class JobModel:
    """The job's stages as measured (see the module docstring); ``predict`` any worker count."""

    cores: float
    """CPUs this rank has (its share of the node's)."""
    workers: int
    """Workers in the window the model was built from."""
    step_s: float
    """Seconds per sample of the step with its cores to itself."""
    step_cores: float
    """Cores the step keeps busy while it runs."""
    load_s: float
    """Seconds per sample one loader process takes, waits included."""
    load_cpu_s: float
    """CPU seconds per sample of that loading."""
    contention: float
    """``CONTENTION`` on a CPU device, 1 elsewhere (a displaced launch thread only waits)."""

    measured_samples_per_s: float
    """The window's rate (its steps and each epoch's cost between them)."""
    max_workers: int
    """The most workers the model considers (cores, RAM)."""
    source: str
    """Where the loader's cost was read, in words."""
    steps_samples_per_s: float = 0.0
    """The window's steps alone (``Window.samples_per_s``: no epoch's cost between them)."""
    persistent: bool = False
    """Whether the workers in the window persist across epochs."""
    epoch_cost_s: float | None = None
    """What one epoch boundary cost beyond a steady step (``None``: none seen)."""
    epoch_step_s: float | None = None
    """Of it, the epoch's first step beyond a steady one: the train loader's workers starting
    (unless they persist) and its first batch."""
    batch_size: int = 1
    """Samples per batch (the first batch of an epoch waits for a whole one)."""
    epoch_samples: int | None = None
    """Samples per epoch (``None``: unknown, the epochs' cost is left out)."""
    loaders: int = 1
    """Loaders whose workers restart with these settings at every epoch (the train loader and
    the validation loaders that follow it)."""
    device_s: float = 0.0
    """CUDA: seconds per sample the device itself needs (the steps' events,
    ``Window.device_step_s``); no setting of the loader makes the job faster. 0: unknown (the
    host's step time, ``step_s``, is then the only bound)."""
    serial_s: float = 0.0
    """Seconds per sample with no workers as measured, when the window had none: each step
    after its wait included, which can be slower than ``step_s`` (``_fed_step_s``). 0: the
    step and the loading in series, ``step_s + load_s``."""

    @property
    def free_cores(self) -> float:
        """Cores the step leaves free while it runs."""
        return max(0.0, self.cores - self.step_cores)

    def displacing_s(self, step_s: float | None = None) -> float:
        """CPU seconds per sample of loading that cannot run on the cores the step leaves free."""
        step = self.step_s if step_s is None else step_s
        return max(0.0, self.load_cpu_s - self.free_cores * step)

    @classmethod
    def from_window(cls, window: Window) -> JobModel | None:
        """The model of the job ``window`` measured, or ``None`` when it cannot be built.

        Needs the CPUs this rank has (``JobContext.cpus_per_rank``, from the probe) and the
        loader's cost: with no workers, the main process's own loading while the step waited
        (its time and its thread's CPU); with workers, their CPU from the sampler, else what an
        earlier window measured (``JobContext.loading_s``).
        """
        ctx = window.context
        whole, window = window, window.steady()  # the epochs' cost is modelled apart
        n = sum(window.samples)
        rate = window.samples_per_s
        workers = ctx.num_workers
        if n <= 0 or rate <= 0 or workers is None or not ctx.cpus_per_rank:
            return None
        # Not less the CPUs other processes seem to use: the sampler reads ~0.6 of 2 cores as
        # someone else's on an idle machine (a process's short-lived threads escape it).
        cores = float(ctx.cpus_per_rank)
        t = 1 / rate
        wait = t * window.data_wait_share
        compute = t - wait
        step_cores = _step_cores(window, cores)
        q = CONTENTION if ctx.device_type == "cpu" else 1.0
        serial_s = 0.0
        if workers == 0:
            if not window.wait_cpu_s:
                return None
            load_s = wait
            load_cpu_s = min(load_s, sum(window.wait_cpu_s) / n)
            # Only where the steps wait on reads beyond doubt: a loaded machine's CPU
            # contention also reads as loading off the CPU, with a few percent of data wait.
            waits = window.data_wait_share >= th.DATA_WAIT_SHARE_STRONG
            step_s = _fed_step_s(window) if waits and load_cpu_s < load_s / 2 else compute
            serial_s = t
            source = "the main process's own loading while the step waited"
        else:
            busy = window.sampler.mean_worker_cpu
            if busy is not None:
                load_cpu_s = busy / 100 * workers * t
                load_s, source = _worker_load_s(window, workers, t, load_cpu_s)
                # What they delivered bounds what they take: while the step waits, its queue
                # is empty and every worker busy, so W workers of ``load_s`` each ran the
                # window at ``W / load_s * wait`` at least. A reading that takes their waits for
                # waits on a core (4 workers that wait 3 ms a sample off the CPU, read at the
                # fit's start as saturated: 0.30 ms a sample) is contradicted by it (the window
                # ran at 1,190 samples/s waiting 84 %: 2.8 ms at least).
                least = workers * t * window.data_wait_share
                if least > load_s:
                    load_s = least
                    source += (
                        f", yet the step waited on them {window.data_wait_share:.0%} of the "
                        f"window: {least * 1e3:.2f} ms a sample at least"
                    )
            elif ctx.loading_s is not None:  # a window too short for the sampler to read
                load_s, load_cpu_s = ctx.loading_s
                source = "the loading measured by an earlier window"
            else:
                return None
            # The step the window saw was stretched by the loading beside it (see the module);
            # what displaces it depends on the step's own time: a few rounds settle it.
            free = max(0.0, cores - step_cores)
            step_s = compute
            for _ in range(20):
                displacing = max(0.0, load_cpu_s - free * step_s)
                step_s = compute / (1 + q * displacing / t)
        memory = window.sampler.available_ram_bytes
        ram_cap = (
            int(min(memory) * 0.5 // WORKER_MEMORY_BYTES) if memory else 10**6
        )  # half the RAM left
        most = max(workers, min(ram_cap, int(MAX_WORKERS_PER_CORE * cores)))
        # The loader's own batch_size is None behind a batch sampler (the switchable one too).
        batches, batch = ctx.epoch_batches, round(n / window.steps) if window.steps else None
        device = whole.device_step_s
        device_s = device * whole.steps / sum(whole.samples) if device and whole.samples else 0.0
        return cls(
            cores=cores,
            workers=workers,
            step_s=max(step_s, 1e-9),
            step_cores=step_cores,
            load_s=max(load_s, 0.0),
            load_cpu_s=max(load_cpu_s, 0.0),
            contention=q,
            measured_samples_per_s=whole.fit_samples_per_s,
            steps_samples_per_s=rate,
            max_workers=most,
            source=source,
            persistent=bool(ctx.persistent_workers),
            epoch_cost_s=whole.epoch_cost_s,
            epoch_step_s=None if whole.epoch_parts_s is None else whole.epoch_parts_s[0],
            batch_size=batch or 1,
            epoch_samples=batches * batch if batches and batch else None,
            loaders=1 + ctx.loaders_following,
            device_s=device_s,
            serial_s=serial_s,
        )

    @property
    def wait_share(self) -> float:
        """Share of the loading that waits rather than computes (0..1)."""
        return 1 - self.load_cpu_s / self.load_s if self.load_s > 0 else 0.0

    def seconds_per_sample(self, workers: int) -> tuple[float, str]:
        """Predicted seconds per sample with ``workers`` loader workers, and what bounds them."""
        s, load = self.step_s, self.load_s
        if workers <= 0:
            return max(self.serial_s or s + load, self.device_s), "serial"
        k = min(float(workers), self.cores)
        cpu = self.displacing_s()
        a = s + cpu / k
        b = max(0.0, self.contention - 1 / k) * cpu * s
        t_cpu = (a + math.sqrt(a * a + 4 * b)) / 2
        t_loader = load / workers
        t = max(t_cpu, t_loader, s, self.device_s)
        bound = "loader" if t == t_loader and t_loader > t_cpu else "cpu"
        if t == max(s, self.device_s) and t >= max(t_cpu, t_loader):
            bound = "step"
        return t, bound

    def measured_restart_s(self) -> float | None:
        """What restarting the train loader's workers cost at each epoch, as measured.

        The epoch's first step beyond a steady one, less its first batch (which persistent
        workers load too); ``None`` when no boundary was seen, or nothing restarted.
        """
        if self.epoch_step_s is None or not self.workers or self.persistent:
            return None
        first_batch = self.batch_size * self.load_s
        return max(0.0, self.epoch_step_s - first_batch)

    def restart_s(
        self, workers: int, persistent: bool, start_s: tuple[float, float] | None = None
    ) -> float:
        """What restarting the workers costs at every epoch boundary, seconds.

        ``start_s`` (``(base, per worker)``) or the prior, scaled to the restart measured at the
        settings in force, for each loader that restarts (the train loader and its followers).
        """
        if workers <= 0 or persistent:
            return 0.0
        base, each = start_s or (WORKER_START_S, PER_WORKER_S)
        one = base + each * workers
        measured = self.measured_restart_s()
        if measured is not None and measured > 0:
            one *= measured / (base + each * self.workers)
        return self.loaders * one

    def epoch_s(
        self, workers: int, persistent: bool, start_s: tuple[float, float] | None = None
    ) -> float:
        """What one epoch boundary is predicted to cost at these settings, seconds.

        With no boundary measured yet, only the restarts of workers that do not persist.
        """
        now = self.restart_s(self.workers, self.persistent, start_s)
        rest = max(0.0, (self.epoch_cost_s or 0.0) - now)
        return rest + self.restart_s(workers, persistent, start_s)

    def fit_seconds_per_sample(
        self, workers: int, persistent: bool, start_s: tuple[float, float] | None = None
    ) -> float:
        """Predicted seconds per sample of the fit: the steps, and each epoch's boundary.

        The setting in force is predicted too: compared with each other, the model's errors
        cancel.
        """
        t = self.seconds_per_sample(workers)[0]
        if self.epoch_samples:
            t += self.epoch_s(workers, persistent, start_s) / self.epoch_samples
        return t

    def threads_gain(self, threads: int, now: int) -> float:
        """The gain predicted for the step on ``threads`` intra-op threads instead of ``now``.

        The step's time scales with its threads as if its operations split evenly, and it keeps
        at most that many cores busy, so the loading beside it first fills the cores it leaves
        instead of displacing its threads; a single thread is only delayed, not stalled. Fewer
        threads: the prediction errs against the change (real scaling is less than linear: from
        1 to 2 threads on 2 CPUs, ResNet-18 at 64 px 1.75x, a 2048-wide matmul 1.84x). Measured
        the same day, one thread beat two only once the loading beside them took about half a
        core (ResNet-18: 0.94x the time at 0.5 of a core, 1.26x at 0.25; the matmul 1.17x at
        0.5, 0.70x at 1.0). Against the rate measured too, as in ``choose``.
        """
        workers = self.workers
        other = replace(
            self,
            step_s=self.step_s * now / threads,
            step_cores=min(self.step_cores, float(threads)),
            # One thread has no other waiting for it at a barrier: loading that displaces it
            # delays it by its own CPU time, no more.
            contention=1.0 if threads == 1 else self.contention,
            serial_s=0.0,
        )
        before, after = self.seconds_per_sample(workers)[0], other.seconds_per_sample(workers)[0]
        gain = before / after - 1
        if self.steps_samples_per_s > 0:
            gain = min(gain, 1 / (after * self.steps_samples_per_s) - 1)
        return gain

    def predict(self, workers: int) -> Prediction:
        """The predicted rate of the steps with ``workers`` workers."""
        t, bound = self.seconds_per_sample(workers)
        return Prediction(workers, 1 / t if t > 0 else 0.0, bound)

    def choose(
        self,
        *,
        most: int | None = None,
        samples_left: float | None = None,
        start_s: tuple[float, float] = (WORKER_START_S, PER_WORKER_S),
    ) -> WorkerChoice:
        """The worker count (and persistence) that finishes the job soonest, and its gain.

        Args:
            most: A cap on the workers (the user's ``max_workers``); the model's own ceiling
                applies too.
            samples_left: Samples the fit still has to train; the start-up of more workers is
                then weighed against what they save. ``None`` (unknown): the fewest workers
                within ``CLOSE_TO_BEST`` of the best time per sample.
            start_s: What starting workers costs: ``(base, per worker)`` seconds.
        """
        top = self.max_workers if most is None else min(most, self.max_workers)
        options = [
            (w, p) for w in range(max(top, 0) + 1) for p in ((False, True) if w else (False,))
        ]
        if self.workers > top:
            options.append((self.workers, self.persistent))
        times = {o: self.fit_seconds_per_sample(*o, start_s) for o in options}
        now = (self.workers, self.persistent if self.workers else False)
        times[now] = self.fit_seconds_per_sample(*now, start_s)
        if samples_left is not None and math.isfinite(samples_left) and samples_left > 0:

            def finish(option: tuple[int, bool]) -> float:
                workers = option[0]
                starts = 0.0 if workers in (self.workers, 0) else start_s[0] + start_s[1] * workers
                return samples_left * times[option] + starts

            best = min(times, key=lambda o: (finish(o), o[0], not o[1]))
        else:
            fastest = min(times.values())
            close = [o for o, t in times.items() if t <= fastest * (1 + CLOSE_TO_BEST)]
            # The fewest workers; among equals, persistence only when it is the faster.
            best = min(close, key=lambda o: (o[0], times[o]))
        workers, persistent = best
        measured = Prediction(self.workers, self.measured_samples_per_s, "measured")
        gain = times[now] / times[best] - 1
        if self.measured_samples_per_s > 0:
            # Against the rate measured too: a model that underrates the settings in force (it
            # reads them under another bound than the one that holds) would promise a gain
            # over its own low figure that the measured rate already has.
            gain = min(gain, 1 / (times[best] * self.measured_samples_per_s) - 1)
        chosen = Prediction(
            workers, self.measured_samples_per_s * (1 + gain), self.seconds_per_sample(workers)[1]
        )
        return WorkerChoice(workers, measured, chosen, gain, self.explain(workers), persistent)

    def explain(self, workers: int) -> str:
        """Why ``workers`` gives what the model predicts, in one clause."""
        p = self.predict(workers)
        cost = (
            f"loading {self.load_s * 1e3:.2f} ms a sample ({self.wait_share:.0%} of it waiting), "
            f"the step {self.step_s * 1e3:.2f} ms on {self.step_cores:.1f} of {self.cores:g} cores"
        )
        return (
            f"the job model predicts {p.samples_per_s:.0f} samples/s with {workers} workers "
            f"({p.bound}-bound; {cost})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


def _worker_load_s(window: Window, workers: int, t: float, load_cpu_s: float) -> tuple[float, str]:
    """One worker's seconds per sample, waits included, from a window with workers.

    What an earlier window measured in one process when there is one
    (``JobContext.loading_s``: no workers, its waits its own, no core to wait for), or less
    when the step waits on workers that took less (``W * t``). Else, when
    every core is busy, its CPU work alone (a worker off the CPU then waits for a core, not for
    a read: more workers would wait the same). Else, when the step waits for data (beyond
    ``DATA_WAIT_SHARE``, epoch starts left out), the workers do not idle (their queue runs
    empty), so W of them took ``W * t`` each per sample. Else they idle on a full queue and
    their waits cannot be told from idling: its CPU work alone. (The few samples timed in this
    process at the first batch are no measure: cold caches made them several times slower.)
    """
    cpu = f"{workers} workers use {load_cpu_s * 1e3:.2f} ms of CPU a sample"
    earlier = window.context.loading_s
    if earlier is not None:
        # Measured in one process before (no workers): the loading's own time a sample, its
        # waits included, free of what workers beside each other and the step wait for a core.
        # Unless the workers, never idle while the step waits on them, took less (``W * t``
        # each): the main process's own overhead was then part of that measurement.
        busy = workers * t if window.data_wait_share >= th.DATA_WAIT_SHARE else earlier[0]
        load_s = max(load_cpu_s, min(earlier[0], busy))
        return load_s, f"{cpu}; a sample loaded in {load_s * 1e3:.2f} ms"
    system = window.sampler.mean_system_cpu
    if system is not None and system >= th.SYSTEM_CPU_SATURATED:
        # Every core busy: a worker's time off the CPU is a wait for a core, not for a read;
        # more workers would wait the same.
        return load_cpu_s, f"{cpu}; the CPUs are saturated ({system:.0f} %)"
    if window.data_wait_share >= th.DATA_WAIT_SHARE:
        return max(load_cpu_s, workers * t), f"{cpu}; the step waits on them"
    return load_cpu_s, f"{cpu}; they keep up (their waits, if any, unseen)"


def _fed_step_s(window: Window) -> float:
    """Seconds per sample of the step fed back to back, from a window whose loading waits.

    Read only from a window that waits for data beyond ``DATA_WAIT_SHARE_STRONG`` and whose
    loading mostly waits off the CPU.

    With no workers and reads that wait, the cores idle while the main process waits, and the
    step after each wait runs several times slower than one fed back to back (measured on
    2 CPUs, a tiny MLP after 0.1 s of reads: 10-13 ms a step, 1.5 ms for one that found its
    threads awake; 1.1 ms fed from memory). Workers feed it back to back: the fastest step
    seen is its cost then. The mean would cap every prediction near the rate of the slow
    steps, and the first trial would stop far short of the count the reads need.
    """
    per_sample = [
        (step - wait) / samples
        for step, wait, samples in zip(
            window.step_time_s, window.data_wait_s, window.samples, strict=True
        )
        if samples > 0
    ]
    return max(min(per_sample), 0.0) if per_sample else 0.0


def _step_cores(window: Window, cores: float) -> float:
    """Cores the step keeps busy while it runs (at least a little, at most the rank's).

    The training process's CPU over the window (the sampler's reading, all its threads) less
    what its main thread spent loading while waiting, over the time the step ran; without the
    sampler, the main thread's own share while computing. On a CPU device whose cores are all
    busy (or whose load is unknown), a step whose main thread computes most of the time holds
    its intra-op threads: loaders beside it take their cores by preempting them, so it counts
    them all (their measured CPU is what the preemption left).
    """
    ctx = window.context
    compute = window.total_s - sum(window.data_wait_s)
    main = sum(window.compute_cpu_s) / compute if window.compute_cpu_s and compute > 0 else None
    process = window.sampler.mean_main_cpu
    if process is not None and compute > 0:
        used = max((process / 100 * window.total_s - sum(window.wait_cpu_s)) / compute, main or 0)
    else:
        used = main if main is not None else 1.0
    threads = ctx.intra_op_threads
    system = window.sampler.mean_system_cpu
    saturated = system is None or system >= th.SYSTEM_CPU_SATURATED
    if ctx.device_type == "cpu" and threads and saturated and (main is None or main >= 0.5):
        used = max(used, min(float(threads), cores))
    return max(0.05, min(used, cores))
