"""Batched inference on Ray: ``BatchInferencePool(backend="ray")``, then Ray Data.

The same small MLP as ``examples/batch_inference.py`` scores "records" (items are ids; ``load``
turns an id into a feature vector, as a real ``load`` would read a file), twice:

1. ``BatchInferencePool(..., backend="ray")``: one Ray actor per model copy (per GPU when the
   cluster has GPUs, else CPU actors), batches pulled lazily and returned in input order, a
   dead actor's batches sent again. ``pool.plan`` shows the actors, ``pool.stats`` the rates.
2. ``Dataset.map_batches(RayDataPredictor, ...)``: for pipelines already on Ray Data; the same
   model code in Ray Data's actors, outputs in an ``output`` column (errors in ``error``).

One record is corrupt: with ``on_error="return"`` its place holds an ``ItemError`` (in the
pool) or an error text (in Ray Data). Both results are checked against the model run here.

Without ``--address`` it starts a local Ray instance with ``--cpus`` CPUs (and no dashboard);
with it, it joins that cluster (``ray.init(address=...)``). Needs ``pip install '.[ray]'`` in a
clone of this repository.

Usage: ``python examples/ray_inference.py [--items N] [--cpus N] [--address ADDR]``
"""

from __future__ import annotations

import argparse
import functools
import os

import numpy as np
import torch

from lightning_maxtp.inference import BatchInferencePool, ItemError, RayDataPredictor

FEATURES = 16
CORRUPT = 13
"""The id of the one record ``load_record`` cannot read."""


def build_model(hidden: int) -> torch.nn.Module:
    """The model factory: runs once in every actor (a fixed seed gives identical copies)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)
    )


def load_record(record_id: int) -> torch.Tensor:
    """Stands in for reading and decoding one record; runs on the actors' I/O threads."""
    if record_id == CORRUPT:
        raise ValueError(f"record {record_id} is corrupt")
    generator = torch.Generator().manual_seed(record_id)
    return torch.randn(FEATURES, generator=generator)


def mismatches(outputs: dict[int, torch.Tensor], model: torch.nn.Module) -> int:
    """How many outputs differ from ``model`` run in this process."""
    wrong = 0
    with torch.inference_mode():
        for record_id, output in outputs.items():
            expected = model(load_record(record_id).unsqueeze(0))[0]
            got = output if isinstance(output, torch.Tensor) else torch.from_numpy(np.array(output))
            wrong += not torch.allclose(got, expected, atol=1e-5)
    return wrong


def main() -> None:
    """Score the records on Ray twice, verify them, print the plan and the stats."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--address", default=None, help="an existing Ray cluster to join")
    args = parser.parse_args()
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a demo reports nothing anywhere
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.cpus, include_dashboard=False)
    factory = functools.partial(build_model, 64)
    reference = factory().eval()
    try:
        with BatchInferencePool(
            factory, backend="ray", load=load_record, batch_size=32, on_error="return"
        ) as pool:
            results = pool.map(range(args.items))
            print(pool.plan)
            print(pool.stats)
        scored = {i: r for i, r in enumerate(results) if not isinstance(r, ItemError)}
        wrong = mismatches(scored, reference)
        print(f"pool: scored {len(scored)} of {len(results)} records, {wrong} mismatches")
        for error in (r for r in results if isinstance(r, ItemError)):
            print(f"pool: error: {error}")

        # The model's actors are gone (the pool closed them): Ray Data can have the CPUs.
        dataset = ray.data.from_items([{"item": i} for i in range(args.items)]).map_batches(
            RayDataPredictor,
            fn_constructor_kwargs={"model_factory": factory, "load": load_record,
                                   "on_error": "return"},
            batch_size=64, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1,
        )  # fmt: skip
        rows = {row["item"]: row for row in dataset.take_all()}
        good = {i: row["output"] for i, row in rows.items() if not row["error"]}
        wrong = mismatches(good, reference)
        print(f"ray data: scored {len(good)} of {len(rows)} records, {wrong} mismatches")
        for i in sorted(set(rows) - set(good)):
            print(f"ray data: error column of record {i}: {rows[i]['error']}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
