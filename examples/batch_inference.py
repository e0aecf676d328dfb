"""Batched inference over a stream of items with ``BatchInferencePool``.

A small MLP scores "records" (items are ids; ``load`` turns an id into a feature vector, as a
real ``load`` would read a file). On GPUs the pool starts one worker process per model copy; on
a CPU it measures first: it runs the first batches in this process and starts worker processes
only if the rest of the input is long enough to pay for trying them (for 500 records it is not).
It builds the model once per copy and streams results back in input order; ``pool.plan`` says
what it measured and decided, ``pool.stats`` the end-to-end and steady items/s.
One record is corrupt: with ``on_error="return"`` its place holds an ``ItemError`` with its index.
The script checks every output against the same model run in this process, then prints the stats.

The workers import this file (spawn re-imports the main script), so it imports torch only at the
top and keeps the pool under ``if __name__ == "__main__":``.

Usage: ``python examples/batch_inference.py [--items N] [--batch-size N|auto] [--workers N]``
"""

from __future__ import annotations

import argparse
import functools

import torch

from lightning_maxtp.inference import BatchInferencePool, ItemError

FEATURES = 16
CORRUPT = 13
"""The id of the one record ``load_record`` cannot read."""


def build_model(hidden: int) -> torch.nn.Module:
    """The model factory: runs once in every worker (a fixed seed gives identical copies)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)
    )


def load_record(record_id: int) -> torch.Tensor:
    """Stands in for reading and decoding one record; runs in the workers' I/O threads."""
    if record_id == CORRUPT:
        raise ValueError(f"record {record_id} is corrupt")
    generator = torch.Generator().manual_seed(record_id)
    return torch.randn(FEATURES, generator=generator)


def main() -> None:
    """Score the records, verify them, print the stats."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--batch-size", default="32", help="items per batch, or 'auto'")
    parser.add_argument("--workers", default="auto", help="workers per device, or 'auto'")
    args = parser.parse_args()
    workers = args.workers if args.workers == "auto" else int(args.workers)
    batch_size = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    factory = functools.partial(build_model, 64)
    with BatchInferencePool(
        factory, load=load_record, batch_size=batch_size, workers_per_device=workers,
        on_error="return",
    ) as pool:  # fmt: skip
        # A sized input: the pool knows how much is left when it decides where to run it. (A
        # generator works too: the pool then pulls only a few batches ahead of what was consumed.)
        results = list(pool.imap(range(args.items)))
        stats = pool.stats
        print(pool.plan)
    reference = factory().eval()
    mismatches = 0
    for index, result in enumerate(results):
        if isinstance(result, ItemError):
            print(f"error: {result}")
            continue
        with torch.inference_mode():
            expected = reference(load_record(index).unsqueeze(0))[0]
        mismatches += not torch.allclose(result, expected, atol=1e-5)
    scored = sum(not isinstance(r, ItemError) for r in results)
    print(f"scored {scored} of {len(results)} records, {mismatches} mismatches vs. one process")
    print(stats)


if __name__ == "__main__":
    main()
