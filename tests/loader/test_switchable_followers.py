"""A validation loader built like the train loader follows the settings the loop gives it."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.loader.switchable import SwitchableLoader


def _loader(workers: int = 0) -> DataLoader[tuple[torch.Tensor, ...]]:
    data = TensorDataset(torch.arange(16.0).unsqueeze(1))
    return DataLoader(data, batch_size=4, num_workers=workers)


def test_a_follower_takes_every_setting_asked_of_the_train_loader() -> None:
    train, val = SwitchableLoader(_loader()), SwitchableLoader(_loader())
    train.followers = [val]
    train.request(num_workers=2, persistent_workers=True)
    assert val.settings()["num_workers"] == 2 and val.settings()["persistent_workers"]
    # The follower runs with them from its next iterator, every batch in order.
    assert [b[0].flatten().tolist() for b in val] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                     [8, 9, 10, 11], [12, 13, 14, 15]]  # fmt: skip
    assert val.num_workers == 2 and val.persistent_workers
    train.shutdown()  # the train loader's shutdown stops its followers' workers too
    assert val._current is None
