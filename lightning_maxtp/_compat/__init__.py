"""Every private Lightning, torch and Ray API the package uses, each behind a function.

A Lightning, torch or Ray upgrade that moves one of these breaks here, and
``tests/compat/test_private_apis.py`` (one test per access) says which. No other module reads a
private attribute of an object it does not own; ``tests/test_layout.py`` checks that.

* ``version``: the Lightning releases this is checked on (``CHECKED_LIGHTNING``, a range) and the
  one warning per process outside them.
* ``lightning_data``: rebuilding a DataLoader with Lightning's recorded constructor arguments
  (the loader plan).
* ``lightning_loops``: the fit loop's progress counters, logging step counter and train loader
  source (the batch-size search).
* ``lightning_strategy``: the launcher hook, the strategy swap and the DDP settings behind
  ``strategy="auto_maxtp"``.
* ``torch_data``: a DataLoader's kept iterator, its workers and its multiprocessing context
  (switching loader knobs mid-fit, measuring loaders).
* ``torch_modules``: in-place compiled modules, fused optimizer kernels, LR scheduler marks and
  ``GradScaler`` state (the math knobs and the training-state snapshot).

Importing it imports neither torch nor lightning (``lightning_strategy`` imports the first
two, when imported).
"""

from lightning_maxtp._compat.version import (
    CHECKED_LIGHTNING,
    lightning_checked,
    warn_if_lightning_unchecked,
)

__all__ = ["CHECKED_LIGHTNING", "lightning_checked", "warn_if_lightning_unchecked"]
