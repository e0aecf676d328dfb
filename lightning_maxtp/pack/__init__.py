"""``maxtp pack``: independent jobs run concurrently, one or more per free GPU, or CPU shares.

A job is a ``spec`` (from a ``jobs_file`` or code); ``placement`` is the pure planner (which job
starts where, what waits and why); ``plan`` and ``results`` are the plain results with their
text; ``runner`` starts jobs as capacity frees up, through ``proc`` (one process group per job),
with ``progress`` (event and status lines, and ``Book``: the one results path of both backends)
and ``signals`` (Ctrl-C stops every job). ``backend="ray"``: ``ray_placement`` plans each job's
Ray task (pure), ``ray_cluster`` connects and reads the cluster, ``ray_runner`` runs each job as
a Ray task (Ray's scheduling, retries, driver logging and cancellation). Importing it imports
neither torch, lightning nor Ray.
"""

from lightning_maxtp.pack.jobs_file import load_jobs, parse_jobs
from lightning_maxtp.pack.plan import PackPlan, plan_pack
from lightning_maxtp.pack.results import JobResult, PackResult
from lightning_maxtp.pack.runner import run_jobs
from lightning_maxtp.pack.spec import JobSpec

__all__ = [
    "JobResult",
    "JobSpec",
    "PackPlan",
    "PackResult",
    "load_jobs",
    "parse_jobs",
    "plan_pack",
    "run_jobs",
]
