"""Benchmarks for lightning_maxtp: throughput of real Lightning training runs.

Run them from the repository root as modules, e.g. ``python -m benchmarks.baseline_jpeg``.
``benchmarks.runner`` times named configurations alternately (A/B/A/B) and reports a table and
one JSON line; ``benchmarks.workloads`` holds the data sets and models that are timed.
"""
