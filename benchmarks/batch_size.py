"""Batch size: our throughput knee vs. Lightning's BatchSizeFinder, searched and then trained.

What it measures, on one workload (an MLP on in-memory tensors by default, so only the model's
step counts):

1. **The searches**, alternated for ``--search-rounds`` rounds (ours, Lightning's, ours, ...):
   wall time of a ``Trainer.fit`` that only searches (``find_batch_size`` from ``on_fit_start``,
   then stop; ``Tuner.scale_batch_size(mode="power")``, which exits after its search), and the
   batch each picks. Both get the same cap, since on a CPU nothing runs out of memory.
2. **Training at the picks**: samples/s of a real ``Trainer.fit`` at our pick, at Lightning's and
   at Lightning's default batch (32), timed A/B/A/B (``run_ab``), warm-up excluded.

Why: Lightning's finder returns the largest batch that fits (on an H200 with ResNet-50: 2048 in
28 s), we return the smallest within ``--tolerance`` of the best measured throughput. Expect the
two picks to train at about the same speed, ours with a batch (and memory) several times smaller.

Usage (from the repository root)::

    python -m benchmarks.batch_size                    # ~2 min on 2 CPU cores
    python -m benchmarks.batch_size --smoke            # seconds: checks the plumbing
    python -m benchmarks.batch_size --out r.json --table-out r.txt
    python -m benchmarks.batch_size --threads 1        # steadier on a CPU shared with others
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from benchmarks.runner import Config, Measurement, format_table, run_ab, time_fit
from benchmarks.workloads.common import LoaderSettings, make_loader
from benchmarks.workloads.tensors import MLPClassifier, make_tensor_dataset
from lightning_maxtp.batch_size import BatchSizePlan, find_batch_size

SMOKE = {"features": 32, "hidden": 64, "depth": 1, "cap": 64, "search_rounds": 1, "rounds": 1}
DEFAULT_BATCH = 32
"""Lightning's and most tutorials' default batch: the third config."""


class SearchableMLP(MLPClassifier):
    """The workload's MLP with a ``batch_size`` that its ``train_dataloader`` reads.

    Both finders resize the loader through that attribute.
    """

    def __init__(self, features: int, hidden: int, depth: int, samples: int) -> None:
        super().__init__(features, hidden, depth, classes=10, optimizer="sgd", lr=0.05)
        self.batch_size = DEFAULT_BATCH
        self.samples = samples
        self.dataset = make_tensor_dataset(samples, features=features)

    def train_dataloader(self) -> DataLoader[Any]:
        return make_loader(self.dataset, LoaderSettings(batch_size=self.batch_size))


class SearchOnly(pl.Callback):
    """Run ``find_batch_size`` in ``on_fit_start``, then stop the fit before any step."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.plan = kwargs, None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.plan = find_batch_size(pl_module, trainer=trainer, **self.kwargs)
        trainer.should_stop = True


def _trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, max_epochs=1, **kwargs,
    )  # fmt: skip


def search_ours(args: argparse.Namespace) -> tuple[BatchSizePlan, float]:
    model = SearchableMLP(args.features, args.hidden, args.depth, args.samples)
    callback = SearchOnly(max_batch_size=args.cap, tolerance=args.tolerance)
    start = time.perf_counter()
    _trainer(callbacks=[callback]).fit(model)
    seconds = time.perf_counter() - start
    assert callback.plan is not None
    return callback.plan, seconds


def search_lightning(args: argparse.Namespace) -> tuple[int, float]:
    from lightning.pytorch.tuner import Tuner

    model = SearchableMLP(args.features, args.hidden, args.depth, args.samples)
    trainer = _trainer(default_root_dir=args.work_dir)
    start = time.perf_counter()
    picked = Tuner(trainer).scale_batch_size(model, mode="power", max_val=args.cap)
    seconds = time.perf_counter() - start
    return int(picked or 0), seconds


def train_at(args: argparse.Namespace, batch_size: int) -> Measurement:
    model = SearchableMLP(args.features, args.hidden, args.depth, args.samples)
    steps = max(3, args.samples_per_config // batch_size)
    loader = make_loader(model.dataset, LoaderSettings(batch_size=batch_size), steps=steps + 2)
    return time_fit(model, loader, warmup_steps=2, steps=steps)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--samples", type=int, default=8192, help="data set size")
    p.add_argument("--cap", type=int, default=1024, help="max batch for both finders")
    p.add_argument("--tolerance", type=float, default=0.03)
    p.add_argument("--search-rounds", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds of training at the picks")
    p.add_argument("--samples-per-config", type=int, default=4096, help="timed samples per fit")
    p.add_argument(
        "--threads", type=int, default=0,
        help="torch intra-op threads (0: torch's default); 1 steadies timings on a shared CPU",
    )  # fmt: skip
    p.add_argument("--work-dir", type=Path, default=Path(".maxtp"))
    p.add_argument("--out", type=Path, help="also write the JSON line here")
    p.add_argument("--table-out", type=Path, help="also write the table here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.samples, args.samples_per_config = 512, 256
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.threads > 0:
        # With other jobs on the same cores, a thread pool as wide as the machine stalls at every
        # parallel region while one of its threads is preempted; one thread does not.
        torch.set_num_threads(args.threads)
    pl.seed_everything(0, verbose=False)

    ours: list[tuple[BatchSizePlan, float]] = []
    theirs: list[tuple[int, float]] = []
    for _ in range(args.search_rounds):
        ours.append(search_ours(args))
        theirs.append(search_lightning(args))
    plan = ours[-1][0]
    # The knee itself: under global_batch="keep" the plan's micro-batch also depends on the
    # model's current batch, which says nothing about the search.
    our_pick, their_pick = plan.fastest_batch_size, theirs[-1][0]
    picks = [
        (f"maxtp pick {our_pick}", our_pick),
        (f"lightning pick {their_pick}", their_pick),
        (f"default {DEFAULT_BATCH}", DEFAULT_BATCH),
    ]
    configs: list[Config] = []
    for name, batch in picks:
        same = [c for c in configs if c.settings["batch_size"] == batch]
        if same:  # the same batch twice would only time itself twice: name it once
            configs[configs.index(same[0])] = Config(
                f"{same[0].name} = {name}", same[0].run, same[0].settings
            )
        else:
            configs.append(Config(name, partial(train_at, args, batch), {"batch_size": batch}))
    search = {
        "maxtp_picks": [p.fastest_batch_size for p, _ in ours],
        "maxtp_search_s": [round(s, 2) for _, s in ours],
        "maxtp_plan_s": [round(p.seconds, 2) for p, _ in ours],
        "lightning_picks": [b for b, _ in theirs],
        "lightning_search_s": [round(s, 2) for _, s in theirs],
        "plan": plan.to_dict(),
    }
    params = {k: getattr(args, k) for k in ("features", "hidden", "depth", "samples", "cap")}
    params.update(tolerance=args.tolerance, device="cuda" if torch.cuda.is_available() else "cpu",
                  torch_threads=torch.get_num_threads(), smoke=args.smoke)  # fmt: skip
    result = run_ab("batch_size", configs, rounds=args.rounds, params=params)
    ours_s = statistics.median(search["maxtp_search_s"])
    theirs_s = statistics.median(search["lightning_search_s"])
    lines = [
        str(plan),
        "",
        f"search (median of {args.search_rounds}, whole fit call): maxtp {ours_s:.1f} s -> "
        f"{search['maxtp_picks']}, lightning power {theirs_s:.1f} s -> "
        f"{search['lightning_picks']} (time ratio {theirs_s / ours_s:.2f}x)",
        "",
        format_table(result),
    ]
    table = "\n".join(lines)
    line = json.dumps({**result.to_dict(), "search": search})
    for path, text in ((args.out, line), (args.table_out, table)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
    print(table)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
