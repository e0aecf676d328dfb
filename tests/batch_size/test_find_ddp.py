"""DDP on CPU (2 processes, gloo): ranks with different ceilings agree on every trial.

The script runs in its own interpreter (a real ``Trainer`` with ``strategy="ddp_fork"``, whose
launcher joins both processes), so pytest itself is never re-executed by a launcher. Forked, the
ranks inherit the script's imports; spawned, each imported torch and Lightning again (~16 s of
CPU for the two).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
from lightning_maxtp.batch_size import find_batch_size
from tests.helpers.oom_models import PlantedModule

OUT = {out!r}
THRESHOLDS = {{0: 40, 1: 24}}  # rank 1 runs out of memory first


class Search(pl.Callback):
    def on_fit_start(self, trainer, pl_module):
        pl_module.model.threshold = THRESHOLDS[trainer.global_rank]
        self.plan = find_batch_size(
            pl_module, trainer=trainer, init_batch_size=4, global_batch="grow", lr_scaling="none"
        )
        self.plan.apply(trainer)

    def on_fit_end(self, trainer, pl_module):
        with open(f"{{OUT}}/rank{{trainer.global_rank}}.json", "w") as f:
            json.dump({{"plan": self.plan.to_dict(), "seen": pl_module.seen_batches}}, f)


if __name__ == "__main__":
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Search()],
    )
    trainer.fit(PlantedModule(batch_size=4))
"""


@pytest.mark.slow
def test_two_ranks_with_different_thresholds_adopt_the_smaller_and_train_on(
    tmp_path: Path,
) -> None:
    script = tmp_path / "ddp_search.py"
    script.write_text(SCRIPT.format(root=str(ROOT), out=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    plans = [r["plan"] for r in ranks]
    # 32 fails on rank 1 only; bisection then stops at rank 1's ceiling on both ranks.
    assert plans[0]["tried"][:8] == [4, 8, 16, 32, 24, 28, 26, 25]
    assert plans[0]["tried"] == plans[1]["tried"]
    assert plans[0]["ceiling"] == plans[1]["ceiling"] == 24
    assert plans[0]["safe_max_batch_size"] == 19 and plans[0]["world_size"] == 2
    assert plans[0]["batch_size"] == plans[1]["batch_size"] <= 19
    rank0_at_32 = plans[0]["trials"][3]
    assert rank0_at_32["fits"] is False and rank0_at_32["error"] == "out of memory on rank(s) [1]"
    assert plans[1]["trials"][3]["error"].startswith("OutOfMemoryError: CUDA out of memory.")
    rates = [[t["samples_per_s"] for t in p["trials"]] for p in plans]
    assert rates[0] == rates[1]  # the slowest rank's throughput, identical on both
    chosen = plans[0]["batch_size"]
    assert ranks[0]["seen"] == ranks[1]["seen"] == [chosen, chosen]
