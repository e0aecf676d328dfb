"""Workloads the benchmarks time: a JPEG image-classification pipeline and tensor-only models.

``jpeg`` exercises the input pipeline (file reads, JPEG decode, augmentation) together with a
torchvision model; ``tensors`` takes the input pipeline out of the picture (in-memory tensors),
so what remains is model compute and per-step framework overhead.
"""
