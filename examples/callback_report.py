"""Reading the report ``MaxThroughputCallback`` writes: what was tried, kept, and what is left.

``report.json`` holds the measured windows, every knob change (``knob_changes``: tried, then kept
or reverted, with the reason and the measured numbers in ``notes``), and the last diagnosis with
the recommendations the user has to apply (``auto_apply: false``: they change the math).

Usage: ``python examples/callback_report.py [REPORT_DIR]`` (without one, a short run makes it)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def show(report_dir: Path) -> None:
    """Print the parts of ``report_dir/report.json`` a user acts on."""
    data = json.loads((report_dir / "report.json").read_text())
    print(f"throughput over the run: {data['samples_per_s']:.1f} samples/s, "
          f"bottleneck now: {data['bottleneck']}")  # fmt: skip
    print("knob changes:")
    for change in data["knob_changes"]:
        print(f"  t={change['t_s']:.1f}s {change['knob']}: {change['old']} -> {change['new']} "
              f"({change['reason']})")  # fmt: skip
    print("tuning:")
    for note in data["notes"]:
        print(f"  {note}")
    print("left for you:")
    for diagnosis in data["diagnoses"]:
        for rec in diagnosis["recommendations"]:
            mode = "auto" if rec["auto_apply"] else "opt-in"
            print(f"  [{diagnosis['kind']}] {rec['knob']}: {rec['current']} -> {rec['proposed']} "
                  f"({mode}: {rec['reason']})")  # fmt: skip
    print(f"files: {', '.join(sorted(p.name for p in report_dir.iterdir()))} in {report_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", type=Path, nargs="?", default=None)
    args = parser.parse_args()
    if args.report_dir is not None:
        show(args.report_dir)
        return
    import lightning.pytorch as pl
    from callback_train import train

    pl.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as tmp:
        train(60, Path(tmp) / "report", window=6)
        show(Path(tmp) / "report")


if __name__ == "__main__":
    main()
