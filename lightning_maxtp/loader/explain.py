"""Words for a ``LoaderPlan``: why this setting, and what to do when it is not enough.

Pure text from plain data (no torch). When the best setting is slower than the device's
consumption rate, the recommendations are the ``data_pipeline`` knobs of the project's triage
table in order: workers first (what limited them), then pre-encoding and GPU decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_maxtp._units import format_bytes
from lightning_maxtp.loader.candidate import TARGET_MARGIN, LoaderCandidate, SearchResult, rate_text
from lightning_maxtp.observe.thresholds import MIN_GAIN

if TYPE_CHECKING:
    from lightning_maxtp.loader.budget import LoaderBudget
    from lightning_maxtp.observe.data_path import DataPathAdvice

__all__ = ["Explanation", "explain"]


PRE_ENCODE = (
    "pre-encode the data set once (decoded and resized to the training resolution, stored as "
    "uint8 arrays or a sharded format such as LitData, WebDataset or FFCV) so that workers skip "
    "decoding"
)
GPU_DECODE = (
    "decode and augment on the GPU (torchvision.io.decode_jpeg(..., device='cuda'), NVIDIA "
    "DALI), which takes the per-sample work off the CPUs"
)
CHEAPER = "make each sample cheaper: store smaller images, use cheaper augmentations"


@dataclass(frozen=True)
class Explanation:
    """The reason sentence, the shortfall and the recommendations of a plan."""

    reason: str
    shortfall: float | None
    recommendations: tuple[str, ...]


def _mib(nbytes: int | None) -> str:
    return format_bytes(nbytes, unit="MiB", digits=0)


def _workers(n: int) -> str:
    return "the main process" if n == 0 else f"{n} worker{'s' if n != 1 else ''}"


def _cap_detail(budget: LoaderBudget) -> str:
    if budget.limited_by == "memory" and budget.worker_memory_bytes:
        return (
            f"RAM: each worker uses {_mib(budget.worker_memory_bytes)} and "
            f"{_mib(budget.memory_bytes or 0)} are set aside for workers, so "
            f"{budget.memory_workers} fit"
        )
    if budget.limited_by == "shm" and budget.batch_bytes:
        return (
            f"/dev/shm: {format_bytes(budget.batch_bytes, unit='MiB')} per batch in flight, "
            f"{_mib(budget.shm_bytes or 0)} set aside, so {budget.shm_workers} fit"
        )
    text = f"the CPU budget: {budget.cpu_workers} worker(s) ({budget.cpu_source})"
    if budget.io_workers is not None:
        text += (
            f", raised to {budget.io_workers} because loading waits on I/O (the main process "
            f"ran or waited for a CPU {budget.io_cpu_share or 0:.0%} of its loading time)"
        )
    ceiling = budget.ceiling_workers
    if ceiling is not None and ceiling > budget.budget_workers:
        text = f"the CPU ceiling of {ceiling} worker(s), past {text}"
    return text


def _past_budget(budget: LoaderBudget) -> str:
    """Words for a choice past the CPU budget (``""`` when it is within it)."""
    if not budget.past_budget:
        return ""
    return (
        f"; past the CPU budget of {budget.budget_workers} worker(s) ({budget.cpu_source}), "
        f"each added worker gained >= {MIN_GAIN:.0%}"
    )


def _own(result: SearchResult) -> str:
    """Words for the loader's own setting measured beside the choice (``""``: not measured)."""
    own, chosen = result.own, result.chosen
    if own is None or chosen is None:
        return ""
    setting = f"{_workers(own.num_workers)}" + (
        f", prefetch {own.prefetch_factor}" if own.num_workers else ""
    )
    if result.own_kept:
        others = [c for c in result.candidates if c.complete and not c.note]
        others = [c for c in others if c.key() != own.key()]
        best = max(others, key=lambda c: c.expected_rate, default=None)
        beaten = (
            ""
            if best is None
            else (
                f": the best other setting ({_workers(best.num_workers)}, "
                f"{rate_text(best.samples_per_s)} samples/s) was not {MIN_GAIN:.0%} faster"
            )
        )
        return f"the loader's own setting ({setting}) is kept{beaten}"
    return f"; the loader's own setting ({setting}) gave {rate_text(own.samples_per_s)}"


def _at_cap(result: SearchResult, budget: LoaderBudget, chosen: LoaderCandidate) -> str:
    """How growth met the cap: ``gaining`` (the last step still gained), ``untried`` or ``""``."""
    if result.stop != "cap" or budget.max_workers > chosen.num_workers:
        return ""
    steps = [c for c in result.candidates if c.num_workers and c.prefetch_factor == 2]
    steps = [c for c in steps if c.complete and not c.note]
    if len(steps) >= 2 and steps[-1].samples_per_s >= steps[-2].samples_per_s * (1 + MIN_GAIN):
        return "gaining"
    return "untried"


def _why(result: SearchResult, budget: LoaderBudget, chosen: LoaderCandidate) -> str:
    eligible = [c for c in result.candidates if c.complete and not c.note]
    workers = [c for c in eligible if c.num_workers > 0]
    if chosen.num_workers == 0:
        if not workers:
            if budget.max_workers == 0:
                return f"loading stays in the main process: {_cap_detail(budget)} leaves none"
            return (
                "loading stays in the main process: the time budget ended the search before "
                "a worker setting was measured in full"
            )
        top = max(workers, key=lambda c: c.expected_rate)
        return (
            "loading in the main process is fastest "
            f"({rate_text(chosen.samples_per_s)} samples/s); the best with workers was "
            f"{rate_text(top.samples_per_s)} samples/s with "
            f"{_workers(top.num_workers)}, so workers do not measurably help"
        )
    verb = "gives" if chosen.num_workers == 1 else "give"
    text = f"{_workers(chosen.num_workers)} {verb} {rate_text(chosen.samples_per_s)} samples/s"
    smaller = [c for c in eligible if c.num_workers < chosen.num_workers]
    if smaller:
        below = max(smaller, key=lambda c: c.key())
        text += f" ({_workers(below.num_workers)}: {rate_text(below.samples_per_s)})"
    larger = [c for c in eligible if c.key() > chosen.key()]
    over = [c for c in result.candidates if c.note.startswith("over")]
    at_cap = _at_cap(result, budget, chosen)
    if at_cap == "gaining":
        text += f"; more workers were still paying off, but the cap is {_cap_detail(budget)}"
    elif at_cap == "untried":
        text += f"; no more workers were tried: the cap is {_cap_detail(budget)}"
    elif larger:
        above = max(larger, key=lambda c: c.expected_rate)
        gain = above.expected_rate / chosen.expected_rate - 1 if chosen.expected_rate else 0.0
        text += (
            f"; {_workers(above.num_workers)} (prefetch {above.prefetch_factor}) gave "
            f"{gain:+.0%}, under the {MIN_GAIN:.0%} needed to add more"
        )
    if over:
        first = min(over, key=lambda c: c.key())
        text += f"; {_workers(first.num_workers)} went {first.note}"
    if chosen.prefetch_factor and chosen.prefetch_factor > 2:
        text += f"; prefetch_factor {chosen.prefetch_factor} gained >= {MIN_GAIN:.0%}"
    return text


def explain(
    result: SearchResult,
    budget: LoaderBudget,
    consumption_rate: float | None,
    persistent_why: str,
    data_path: DataPathAdvice | None = None,
) -> Explanation:
    """The reason, shortfall and recommendations for a search result.

    ``data_path`` (measured when the loader falls short) replaces the generic pre-encoding and
    GPU-decode advice with the path that fits and its numbers.
    """
    chosen = result.chosen
    if chosen is None:
        slowest = max((c.startup_s for c in result.candidates), default=0.0)
        return Explanation(
            f"no setting could be measured within the {budget.time_budget_s:g} s time budget "
            f"(the first batch took {slowest:.1f} s); the loader's own settings are kept; "
            "pass a larger `time_budget_s`",
            None,
            (),
        )
    if result.own_kept:
        reason = _own(result)
    elif result.target_met and consumption_rate is not None:
        reason = (
            f"{_workers(chosen.num_workers)} reach{'es' if chosen.num_workers <= 1 else ''} "
            f"{TARGET_MARGIN:g}x the consumption rate ({rate_text(chosen.samples_per_s)} vs target "
            f"{rate_text(TARGET_MARGIN * consumption_rate)} samples/s)"
        )
        smaller = [c for c in result.candidates if c.complete and c.key() < chosen.key()]
        if smaller:
            below = max(smaller, key=lambda c: c.key())
            reason += f"; {_workers(below.num_workers)} gave {rate_text(below.samples_per_s)}"
    else:
        reason = _why(result, budget, chosen)
    if not result.own_kept:
        reason += _past_budget(budget) + _own(result)
    if result.stop == "time" and "time budget" not in reason:
        reason += "; the time budget ended the search"
    shortfall = None
    recommendations: list[str] = []
    if consumption_rate is not None and not result.target_met:
        fastest = max(c.samples_per_s for c in result.candidates if c.complete and not c.note)
        if fastest < consumption_rate:
            shortfall = 1.0 - fastest / consumption_rate
            reason += (
                f". Even the fastest setting ({rate_text(fastest)} samples/s) is {shortfall:.0%} "
                f"short of the {rate_text(consumption_rate)} samples/s the device consumes"
            )
            at_cap = _at_cap(result, budget, chosen)
            if at_cap:
                helps = "would still help" if at_cap == "gaining" else "may help (not tried)"
                recommendations.append(
                    f"num_workers: more than {budget.max_workers} {helps}, but the cap is "
                    f"{_cap_detail(budget)}; give each device process more of it"
                )
            generic = [PRE_ENCODE, GPU_DECODE]
            recommendations += [*(data_path.lines() if data_path else generic), CHEAPER]
        else:
            reason += (
                f". The loader keeps up with the consumption rate ({rate_text(consumption_rate)} "
                f"samples/s) but without the {TARGET_MARGIN - 1:.0%} margin"
            )
    if persistent_why:
        reason += f". {persistent_why[0].upper()}{persistent_why[1:]}"
    return Explanation(reason + ".", shortfall, tuple(recommendations))
