"""Batch plumbing in the worker: collate items, move batches to the device and outputs back."""

from __future__ import annotations

from typing import Any


def default_collate(values: list[Any]) -> Any:
    """Stack tensors/arrays/numbers along a new first dimension; recurse into tuples and dicts.

    Anything else (strings, PIL images, ...) is passed to the model as the list itself.
    """
    import numpy as np
    import torch

    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.stack(values))
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return torch.tensor(values)
    if isinstance(first, tuple):
        return tuple(default_collate(list(column)) for column in zip(*values, strict=True))
    if isinstance(first, dict):
        return {key: default_collate([v[key] for v in values]) for key in first}
    return list(values)


def to_device(batch: Any, device: Any, *, pin: bool) -> Any:
    """``batch`` on ``device``; with ``pin``, through pinned host memory and non-blocking copies."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        if pin and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=pin)
    if isinstance(batch, tuple):
        return tuple(to_device(b, device, pin=pin) for b in batch)
    if isinstance(batch, list):
        return [to_device(b, device, pin=pin) for b in batch]
    if isinstance(batch, dict):
        return {k: to_device(v, device, pin=pin) for k, v in batch.items()}
    return batch


def to_host(output: Any, *, non_blocking: bool, upcast: bool) -> Any:
    """``output`` on the CPU, detached; with ``upcast``, half-precision floats become float32."""
    import torch

    if isinstance(output, torch.Tensor):
        output = output.detach()
        if upcast and output.dtype in (torch.bfloat16, torch.float16):
            output = output.float()
        return output.to("cpu", non_blocking=non_blocking)
    if isinstance(output, tuple):
        return tuple(to_host(o, non_blocking=non_blocking, upcast=upcast) for o in output)
    if isinstance(output, list):
        return [to_host(o, non_blocking=non_blocking, upcast=upcast) for o in output]
    if isinstance(output, dict):
        return {k: to_host(v, non_blocking=non_blocking, upcast=upcast) for k, v in output.items()}
    return output


def split_output(output: Any, count: int) -> list[Any]:
    """One output per item: rows of a tensor, or tuples/dicts of rows; a list of ``count`` as is.

    Raises:
        ValueError: If ``output`` has no leading dimension of ``count``.
    """
    import torch

    if isinstance(output, torch.Tensor) and output.ndim > 0 and output.shape[0] == count:
        # Clone: a row view would carry (and pickle) the whole batch's storage.
        return [row.clone() for row in output.unbind(0)]
    if isinstance(output, tuple) and output:
        return list(zip(*(split_output(o, count) for o in output), strict=True))
    if isinstance(output, dict) and output:
        columns = {k: split_output(v, count) for k, v in output.items()}
        return [{k: column[i] for k, column in columns.items()} for i in range(count)]
    if isinstance(output, list) and len(output) == count:
        return output
    shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    raise ValueError(
        f"cannot split the model output ({shape}) into {count} items; return a tensor (or a "
        "tuple/dict of tensors) with the batch as first dimension, or a list with one entry "
        "per item"
    )


def compact(entries: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``entries`` with every tensor view that shares a larger storage copied out.

    Pickling a tensor sends its whole storage: a row of ``big.unbind(0)`` would carry all of
    ``big`` to the worker (measured: 64 rows of a 24 MiB tensor made a 1.5 GiB message).
    """
    import torch

    return [
        (index, item.clone() if isinstance(item, torch.Tensor) and _is_view(item) else item)
        for index, item in entries
    ]


def _is_view(tensor: Any) -> bool:
    """Whether ``tensor`` shares a storage more than twice its own size."""
    return bool(tensor.untyped_storage().nbytes() > 2 * max(1, tensor.nbytes))
