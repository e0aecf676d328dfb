"""``maxtp bench``: time a user's own training job for CI and fail on a throughput regression.

Importing this package is cheap (no torch, no lightning): the fits run in child processes.
"""

from lightning_maxtp.bench.format import format_markdown, format_text
from lightning_maxtp.bench.gate import Check, GateResult, compare
from lightning_maxtp.bench.result import BenchResult, Spread
from lightning_maxtp.bench.run import BenchRunError, run_against, run_bench
from lightning_maxtp.bench.target import BenchJob, BenchTargetError

__all__ = [
    "BenchJob",
    "BenchResult",
    "BenchRunError",
    "BenchTargetError",
    "Check",
    "GateResult",
    "Spread",
    "compare",
    "format_markdown",
    "format_text",
    "run_against",
    "run_bench",
]
