"""The fastest batch, not the biggest: ``find_batch_size(...) -> BatchSizePlan``.

``find`` drives the pure ``search`` (double to the memory ceiling, bisect, back off, pick the
knee) over a ``trial`` of real training ``steps`` on the ``subject`` (model, optimizer, device,
example batch); ``snapshot`` restores the state the trials touch bit for bit, ``oom`` recognises
out-of-memory errors and reads peak memory, ``trainer_internals`` gathers the Trainer internals
touched, ``global_batch`` does the accumulation and learning-rate arithmetic, and ``apply`` makes
a Trainer train as planned. Importing it imports neither torch nor lightning.
"""

from lightning_maxtp.batch_size.find import find_batch_size
from lightning_maxtp.batch_size.plan import BatchSizePlan
from lightning_maxtp.batch_size.search import TrialResult

__all__ = ["BatchSizePlan", "TrialResult", "find_batch_size"]
