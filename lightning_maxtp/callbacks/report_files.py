"""Writing the report files at the end of a fit, without ever failing the fit.

The user's training has finished when the report is written; a folder that cannot be created
(a file stands where it should be, no permission, a full disk) costs the report, never the run:
the error becomes one warning that names the folder, the error and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lightning_maxtp._log import rank_zero_warn

if TYPE_CHECKING:
    from lightning_maxtp.observe.report import ThroughputReport

__all__ = ["write_report_files"]


def write_report_files(report: ThroughputReport, folder: Path) -> dict[str, Path] | None:
    """``report.write(folder)``; on any error a warning, and ``None``.

    Args:
        report: The fit's report.
        folder: The callback's ``report_dir``.

    Returns:
        The written files by name, or ``None`` when nothing could be written.
    """
    try:
        return report.write(folder)
    except Exception as err:  # any failure of reporting must spare the fit
        rank_zero_warn(
            f"report_dir={str(folder)!r}: the report files were not written "
            f"({type(err).__name__}: {err}); the fit itself finished. Pass a report_dir that "
            "can be created and written (or report_dir=None); the report is still in "
            "callback.report and the log above."
        )
        return None
