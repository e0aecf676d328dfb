"""CI benchmark mode: a small suite, A/B alternating in one run, gated against a baseline file.

    python -m benchmarks.run --suite ci --json out.json
    python -m benchmarks.run --suite ci --json out.json --baseline base.json --max-regression 0.10

Each case trains a small workload to a fixed number of steps under several configurations, one
after another per round (A, B, A, B, ...), and records the whole fit's samples/s (tuning
included: what a user gets). The gate compares each configuration's *ratio to the case's first
configuration* (measured in the same run, so it travels between machines) with the baseline's;
``--gate absolute`` compares samples/s instead (same machine only). Exit status: 0 when no
metric fell by more than ``--max-regression``, 1 on a regression, 2 for bad arguments.
Suites: ``ci`` (a few minutes on 2 CPUs), ``tiny`` (seconds; for tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "maxtp-ci-bench/1"


@dataclass(frozen=True)
class Case:
    """One workload: ``fit(config)`` trains it once and returns samples/s of the whole fit."""

    name: str
    configs: tuple[str, ...]
    fit: Callable[[str], float]


def _fit_factory(size: int, latency_s: float, steps: int, window: int) -> Callable[[str], float]:
    def fit(config: str) -> float:
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader

        from benchmarks.workloads.ci import LatencyDataset, TinyMLP
        from lightning_maxtp.callbacks import MaxThroughputCallback

        callbacks: list[Any] = []
        if config == "callback":
            callbacks.append(
                MaxThroughputCallback(
                    warmup_steps=2,
                    window_steps=window,
                    tune_loader=False,
                    verbose=False,
                    max_trials=3,
                )
            )
        pl.seed_everything(0, verbose=False)
        trainer = pl.Trainer(
            accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        )  # fmt: skip
        loader = DataLoader(LatencyDataset(size, latency_s), batch_size=16, shuffle=True)
        start = time.perf_counter()
        trainer.fit(TinyMLP(), loader)
        return steps * 16 / (time.perf_counter() - start)

    return fit


def suite(name: str) -> list[Case]:
    """The cases of a suite (``ci`` or ``tiny``)."""
    configs = ("defaults", "callback")
    if name == "tiny":
        return [Case("slow_storage", configs, _fit_factory(640, 0.002, 40, 5))]
    if name == "ci":
        return [
            Case("slow_storage", configs, _fit_factory(4096, 0.003, 160, 10)),
            Case("in_memory", configs, _fit_factory(4096, 0.0, 400, 20)),
        ]
    raise ValueError(f"`--suite` must be 'ci' or 'tiny', got {name!r}")


def run(cases: list[Case], rounds: int) -> dict[str, Any]:
    """Run every case A/B alternating for ``rounds`` rounds; JSON-safe result."""
    from statistics import median

    from lightning_maxtp.resources import inspect_resources

    out: dict[str, Any] = {"schema": SCHEMA, "rounds": rounds, "cases": {}}
    for case in cases:
        values: dict[str, list[float]] = {c: [] for c in case.configs}
        for r in range(rounds):
            for config in case.configs:
                values[config].append(case.fit(config))
                print(f"{case.name} round {r + 1}/{rounds} {config}: "
                      f"{values[config][-1]:.1f} samples/s", flush=True)  # fmt: skip
        medians = {c: median(v) for c, v in values.items()}
        first = medians[case.configs[0]]
        out["cases"][case.name] = {
            "samples_per_s": values,
            "median_samples_per_s": medians,
            "ratio": {c: m / first if first > 0 else 0.0 for c, m in medians.items()},
        }
    out["machine"] = inspect_resources().to_dict()
    return out


def compare(
    current: dict[str, Any], baseline: dict[str, Any], max_regression: float, gate: str = "ratio"
) -> list[str]:
    """Regressions of ``current`` against ``baseline``: one line each (empty: none).

    Args:
        current: A result of ``run``.
        baseline: An earlier result (cases or configs missing from either are skipped).
        max_regression: Largest tolerated fall, as a share (0.10: 10 %).
        gate: ``"ratio"`` (each config over the case's first, measured in one run) or
            ``"absolute"`` (median samples/s; same machine only).
    """
    key = "ratio" if gate == "ratio" else "median_samples_per_s"
    found = []
    for case, data in current["cases"].items():
        base = baseline.get("cases", {}).get(case)
        if base is None:
            continue
        for config, value in data[key].items():
            before = base[key].get(config)
            if before is None or before <= 0:
                continue
            if value < (1 - max_regression) * before:
                change = f"{value / before - 1:+.1%}, limit -{max_regression:.0%}"
                found.append(f"{case}/{config} {key}: {before:.3f} -> {value:.3f} ({change})")
    return found


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description="maxtp CI benchmark (A/B, regression gate)")
    parser.add_argument("--suite", default="ci", choices=("ci", "tiny"))
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    parser.add_argument("--baseline", type=Path, default=None, help="a result to compare with")
    parser.add_argument("--max-regression", type=float, default=0.10)
    parser.add_argument("--gate", choices=("ratio", "absolute"), default="ratio")
    parser.add_argument("--rounds", type=int, default=None, help="default: 3 (tiny: 1)")
    args = parser.parse_args(argv)
    if not 0 < args.max_regression < 1:
        parser.error(f"--max-regression must be in (0, 1), got {args.max_regression}")
    if args.baseline is not None and not args.baseline.is_file():
        parser.error(f"--baseline {args.baseline} does not exist; write one with --json first")
    rounds = args.rounds or (1 if args.suite == "tiny" else 3)
    if rounds < 1:
        parser.error(f"--rounds must be >= 1, got {rounds}")
    import logging
    import warnings

    import lightning.pytorch  # noqa: F401  (sets its logger's level on import; quiet it after)

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    result = run(suite(args.suite), rounds)
    for case, data in result["cases"].items():
        ratios = ", ".join(f"{c} {r:.2f}x" for c, r in data["ratio"].items())
        print(f"{case}: {ratios} (median of {rounds} round(s))")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.baseline is None:
        return 0
    found = compare(result, json.loads(args.baseline.read_text()), args.max_regression, args.gate)
    for line in found:
        print(f"REGRESSION {line}")
    print("benchmark gate: " + ("FAILED" if found else "passed") + f" against {args.baseline}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
