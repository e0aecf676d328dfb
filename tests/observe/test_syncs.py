"""``SyncCounter`` at the GPU boundary: a fake ``torch.cuda`` that warns like the real one."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from lightning_maxtp.observe.syncs import SyncCounter


class FakeCuda:
    """``set_sync_debug_mode``/``get_sync_debug_mode`` and a "synchronizing" warning on demand."""

    def __init__(self) -> None:
        self.mode: Any = 0

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode

    def item(self) -> None:
        """What ``tensor.item()`` does under mode "warn"."""
        if self.mode == "warn":
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)


def test_syncs_are_counted_per_step_by_the_line_that_asked_and_the_mode_put_back() -> None:
    cuda = FakeCuda()
    counter = SyncCounter(cuda)
    counter.start()
    assert cuda.mode == "warn" and counter.running
    for _ in range(3):
        cuda.item()  # line A, once a step
        cuda.item()  # line B
        cuda.item()  # line B again (a loop in the step)
        counter.step()
    count = counter.stop()
    assert cuda.mode == 0 and not counter.running
    assert count is not None and count.steps == 3 and count.count == 9 and count.per_step == 3.0
    assert [n for _, n in count.sources] == [3, 3, 3]
    assert all(line.startswith(__file__) for line, _ in count.sources)
    assert counter.stop() is None  # idempotent


def test_the_users_own_warnings_are_passed_on_not_swallowed() -> None:
    counter = SyncCounter(FakeCuda())
    with pytest.warns(UserWarning, match="your learning rate is odd"):
        counter.start()
        warnings.warn("your learning rate is odd", UserWarning, stacklevel=1)
        count = counter.stop()
    assert count is not None and count.count == 0


def test_lines_inside_torch_and_lightning_are_counted_under_their_package() -> None:
    import lightning.pytorch
    import torch

    from lightning_maxtp.observe.syncs import source_of

    torch_file = str(Path(torch.__file__).parent / "_tensor.py")
    lightning_file = str(Path(lightning.pytorch.__file__).parent / "callbacks" / "progress.py")
    assert source_of(torch_file, 12) == "torch internals"
    assert source_of(lightning_file, 7) == "lightning internals"
    assert source_of("/home/me/train.py", 42) == "/home/me/train.py:42"
