"""A ``LoaderPlan`` used without Lightning: ``plan.build(loader)`` and ``plan.dataloader_kwargs()``.

Both must carry the thread limit the plan was measured with into every worker (without it each
worker runs BLAS/OpenMP with one thread per CPU) and keep the user's own ``worker_init_fn``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_maxtp.loader import LoaderPlan, tune_dataloader

MARK = "MAXTP_TEST_USER_INIT"


class EnvProbe(Dataset[torch.Tensor]):
    """Each sample says what its worker's environment holds: the BLAS limit, the user's mark."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        blas = int(os.environ.get("OPENBLAS_NUM_THREADS", "0"))
        return torch.tensor([blas, int(os.environ.get(MARK, "0")), i])


def mark(worker_id: int) -> None:
    os.environ[MARK] = str(worker_id + 1)


def _plan(loader: DataLoader[torch.Tensor]) -> LoaderPlan:
    tuned = tune_dataloader(loader, max_workers=1, time_budget_s=2.0)
    # Two workers of two threads each: the limit differs from torch's own default in workers
    # (one thread), so only a plan that carries it can put it there.
    return replace(
        tuned, num_workers=2, prefetch_factor=2, persistent_workers=False, worker_threads=2
    )


def _probe(loader: DataLoader[torch.Tensor]) -> torch.Tensor:
    return torch.cat(list(loader))


def test_dataloader_kwargs_carry_the_thread_limit_and_the_users_worker_init_fn() -> None:
    plan = _plan(DataLoader(EnvProbe(), batch_size=8, worker_init_fn=mark))
    assert plan.user_worker_init_fn is mark
    kwargs = plan.dataloader_kwargs()
    assert set(kwargs) == {
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "persistent_workers",
        "worker_init_fn",
    }
    seen = _probe(DataLoader(EnvProbe(), batch_size=8, **kwargs))
    assert seen[:, 0].tolist() == [2] * 64, "every worker runs with the plan's thread limit"
    assert set(seen[:, 1].tolist()) == {1, 2}, "the user's worker_init_fn ran in both workers"
    assert sorted(seen[:, 2].tolist()) == list(range(64))
    assert "worker_init_fn" not in plan.settings()
    json.dumps(plan.to_dict())  # the user's function is not part of the JSON view


def test_build_keeps_the_users_pipeline_and_applies_everything_the_plan_measured() -> None:
    def loader() -> DataLoader[torch.Tensor]:
        gen = torch.Generator().manual_seed(3)
        return DataLoader(
            EnvProbe(), batch_size=8, shuffle=True, generator=gen, worker_init_fn=mark
        )

    own = loader()
    plan = _plan(loader())
    built = plan.build(own)
    assert (built.num_workers, built.prefetch_factor, built.persistent_workers) == (2, 2, False)
    assert built.batch_size == 8 and own.num_workers == 0, "the user's loader is not changed"
    seen = _probe(built)
    assert seen[:, 0].tolist() == [2] * 64 and set(seen[:, 1].tolist()) == {1, 2}
    # Same sampler and generator: the same shuffled order as the user's own loader.
    assert seen[:, 2].tolist() == _probe(loader())[:, 2].tolist()


def test_a_plan_without_workers_needs_no_worker_init_fn() -> None:
    plan = replace(
        _plan(DataLoader(EnvProbe(), batch_size=8)),
        num_workers=0,
        prefetch_factor=None,
        worker_threads=0,
    )
    assert "worker_init_fn" not in plan.dataloader_kwargs()
    assert _probe(plan.build(DataLoader(EnvProbe(), batch_size=8)))[:, 0].tolist() == [0] * 64
