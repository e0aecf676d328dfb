"""Under DDP a peak measured after the first step is waited for by every rank outside any step.

Two CPU ranks; rank zero's ``measure_peak`` is a fake that sleeps ``PAUSE_S`` (a slow
measurement on an empty cache). Without the wait at the end of the first step, rank one would
spend that time inside its next step, blocked in the gradient all-reduce.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAUSE_S = 3.0
"""Far longer than any step of this tiny MLP, even on a loaded machine."""

SCRIPT = """
import json, os, sys, time
sys.path.insert(0, {root!r})
import torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.resources import peak as peak_mod
from tests.helpers import planted

def slow_measure_peak(device="cpu", **kwargs):
    time.sleep({pause})
    name, key = peak_mod.device_key(device)
    return peak_mod.Peak(name, key, (peak_mod.PeakRate("fp32", 1e15, 1024),))

peak_mod.measure_peak = slow_measure_peak  # every rank runs this script; rank zero measures
data = TensorDataset(torch.randn(256, planted.FEATURES), torch.zeros(256, dtype=torch.long))
monitor = BottleneckMonitor(window_steps=4, sampler_interval_s=None, verbose=False)
trainer = planted.fit(planted.Mlp(), DataLoader(data, batch_size=8), [monitor], steps=9,
                      devices=2, strategy="ddp")
with open(os.path.join({out!r}, "rank%d.json" % trainer.global_rank), "w") as f:
    json.dump(dict(steps=[s for w in monitor.windows for s in w.step_time_s],
                   firsts=[w.first_step for w in monitor.windows],
                   peaks=[dict(w.context.peaks) for w in monitor.windows],
                   notes=list(monitor.report.notes)), f)
"""


def test_every_rank_waits_for_rank_zeros_peak_outside_its_steps(tmp_path: Path) -> None:
    script = tmp_path / "ddp_peak.py"
    script.write_text(
        textwrap.dedent(SCRIPT).format(root=str(ROOT), out=str(tmp_path), pause=PAUSE_S)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=180, cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:  # the same windows on both ranks, the first step left out
        assert rank["firsts"] == [1, 5] and len(rank["steps"]) == 8
        assert max(rank["steps"]) < PAUSE_S / 2, rank["steps"]  # no step holds the pause
    assert all(p == {"fp32": 1e15} for p in ranks[0]["peaks"])
    assert any("after the first step" in n for n in ranks[0]["notes"]), ranks[0]["notes"]
