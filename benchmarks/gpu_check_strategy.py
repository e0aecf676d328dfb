"""GPU check for ``Trainer(strategy="auto_maxtp")``: is the plan right, and does it run?

What it checks, each fit in a fresh process (Lightning's launchers leave ``LOCAL_RANK``, a
process group and our plan in the environment of the process that ran them):

1. ``single``: ``strategy="auto_maxtp", accelerator="cuda", devices=1`` on a ~200 M-parameter
   MLP -> ``SingleDeviceStrategy`` on ``cuda:0``, the plan line logged once, the fit completes
   and the weights change.
2. ``auto``: ``devices="auto"``: every free GPU (single device on a one-GPU host, DDP on more).
3. ``fsdp``: ``AutoMaxTP(memory_budget_bytes=...)`` with a budget between what FSDP with CPU
   offload needs and what a full copy needs, ``precision="bf16-mixed"`` -> FSDP + CPU offload
   on one GPU, ``FSDPPrecision``, the fit completes. Its seconds per step are printed next to
   the single-device run's (expect it several times slower: that is why it is warned).
4. ``busy``: a detached process (not ours) holds memory on GPU 0; on a one-GPU host
   ``devices="auto"`` must fail with "found no free GPU", naming it; with more GPUs the plan
   must skip GPU 0 and name it.
5. The GPU-marked tests of ``tests/strategy/test_auto_maxtp.py``.

Prints a table, then one JSON line. On a machine without a GPU (``--smoke``, or automatically)
the GPU items are skipped and the ``cpu`` item (the same worker, single device on the CPU) runs,
so the script itself is tested on a CPU.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_strategy.py [--smoke] [--steps N] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.checks import check, finish, run_gpu_tests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ALLOCATE = (
    "import time, torch; x = torch.empty(int(3 * 2**30), dtype=torch.uint8, device='cuda'); "
    "print('ready', flush=True); time.sleep(300)"
)
WIDTH, DEPTH = 4096, 12  # 12 x Linear(4096, 4096): ~201 M parameters, 12 FSDP units


def worker(item: str, steps: int) -> dict[str, Any]:
    """Run one item in this (fresh) process and return what it saw."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from torch import nn

    import lightning_maxtp
    from lightning_maxtp import AutoMaxTP, ModelSize
    from lightning_maxtp.strategy import estimate_memory

    class StepClock(pl.Callback):
        """End time of every step, read after a device sync."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())

    class MLP(pl.LightningModule):
        def __init__(self, width: int, depth: int) -> None:
            super().__init__()
            self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            return self.net(batch).float().pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    width, depth = (WIDTH, DEPTH) if item != "cpu" else (64, 2)
    model = MLP(width, depth)
    data = torch.utils.data.DataLoader(torch.randn(64 * steps, width), batch_size=64)
    precision = "bf16-mixed" if item == "fsdp" else "32-true"
    kwargs: dict[str, Any] = {"accelerator": "cpu" if item == "cpu" else "cuda"}
    kwargs["devices"] = "auto" if item in ("auto", "busy") else 1
    # The registered name is what users type; an instance keeps the plan for the busy item.
    strategy: Any = AutoMaxTP() if item == "busy" else "auto_maxtp"
    budget = None
    if item == "fsdp":
        memory = estimate_memory(ModelSize.from_module(model), precision=precision)
        budget = (memory.fsdp_bytes(1, cpu_offload=True) + memory.single_device_bytes()) // 2
        strategy = AutoMaxTP(memory_budget_bytes=budget)
    clock = StepClock()
    trainer = pl.Trainer(
        strategy=strategy, precision=precision, max_steps=steps, logger=False, callbacks=[clock],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **kwargs,
    )  # fmt: skip
    before = [p.detach().float().sum().item() for p in model.parameters()][:1]
    result: dict[str, Any] = {"item": item, "budget_bytes": budget, "rank": trainer.global_rank}
    try:
        trainer.fit(model, data)
    except ValueError as err:
        result["error"] = str(err)
        return result
    # The first step includes set-up (wrapping, allocator growth): steady steps only.
    gaps = sorted(b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False))
    chosen = trainer.strategy
    result.update(
        strategy=type(chosen).__name__,
        root_device=str(chosen.root_device),
        devices=trainer.num_devices,
        steps=trainer.global_step,
        seconds_per_step=round(gaps[len(gaps) // 2], 4) if gaps else None,
        weights_changed=before != [p.detach().float().sum().item() for p in model.parameters()][:1],
        fsdp_precision=isinstance(chosen.precision_plugin, FSDPPrecision),
        cpu_offload=bool(getattr(getattr(chosen, "cpu_offload", None), "offload_params", False)),
        plan=strategy.plan.to_dict() if isinstance(strategy, AutoMaxTP) and strategy.plan else None,
        version=lightning_maxtp.__version__,
    )  # fmt: skip
    return result


def run_item(item: str, steps: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``worker(item)`` in a fresh interpreter; its plan lines come back from stderr."""
    proc = subprocess.run(
        [sys.executable, __file__, "--item", item, "--steps", str(steps)],
        capture_output=True, text=True, env=env or ENV, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(lines[-1][7:]) if lines else {"item": item}
    result["returncode"] = proc.returncode
    result["plan_lines"] = re.findall(r"^maxtp: strategy: .*$", proc.stderr, flags=re.M)
    if proc.returncode != 0 or not lines:
        result["stderr_tail"] = proc.stderr[-1500:]
    return result


def fit_checks(rows: list[dict[str, Any]], res: dict[str, Any], strategy: str, steps: int) -> None:
    item = res["item"]
    plans = res["plan_lines"]
    done = res["returncode"] == 0 and res.get("steps") == steps and res.get("weights_changed")
    check(rows, f"{item}: fit completes", bool(done), res.get("stderr_tail", "")[-200:] or
          f"{res.get('steps')} steps, {res.get('seconds_per_step')} s/step")  # fmt: skip
    check(rows, f"{item}: strategy", res.get("strategy") == strategy,
          f"{res.get('strategy')} on {res.get('root_device')}")  # fmt: skip
    check(rows, f"{item}: one plan line", len(plans) == 1, (plans or ["none"])[0][:110])


def gpu_checks(rows: list[dict[str, Any]], steps: int, gpus: int) -> dict[str, Any]:
    results = {item: run_item(item, steps) for item in ("single", "auto", "fsdp")}
    fit_checks(rows, results["single"], "SingleDeviceStrategy", steps)
    fit_checks(rows, results["auto"], "SingleDeviceStrategy" if gpus == 1 else "DDPStrategy", steps)
    fsdp = results["fsdp"]
    fit_checks(rows, fsdp, "FSDPStrategy", steps)
    check(rows, "fsdp: CPU offload + FSDPPrecision", bool(fsdp.get("cpu_offload") and
          fsdp.get("fsdp_precision")), f"budget {fsdp.get('budget_bytes')} bytes")  # fmt: skip
    single_s, fsdp_s = results["single"].get("seconds_per_step"), fsdp.get("seconds_per_step")
    if single_s and fsdp_s:
        ratio = f"{fsdp_s / single_s:.1f}x the single-device time"
        check(rows, "fsdp offload s/step vs single", None, f"{fsdp_s} vs {single_s}: {ratio}")
    results["busy"] = busy_check(rows, steps, gpus)
    return results


def busy_check(rows: list[dict[str, Any]], steps: int, gpus: int) -> dict[str, Any]:
    # bash backgrounds the allocator and exits, so it is re-parented: not our child, not "own".
    env = {**ENV, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    log = Path("/tmp/maxtp_strategy_alloc.log")
    script = f'{sys.executable} -c "{ALLOCATE}" > {log} 2>&1 & echo $!'
    pid = int(subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             env=env, check=True).stdout.split()[0])  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text():
            if time.monotonic() > deadline:
                raise TimeoutError("allocator did not start within 60 s")
            time.sleep(0.2)
        res = run_item("busy", steps)
    finally:
        os.kill(pid, signal.SIGKILL)
    if gpus == 1:
        error = res.get("error", "")
        ok = "found no free GPU" in error
        check(rows, "busy: no free GPU is an error", ok, error[:110] or res.get("strategy", "?"))
        check(rows, "busy: names the process", None if not ok else f"pid {pid}" in error,
              f"pid {pid} {'named' if f'pid {pid}' in error else 'not in NVML list'}")  # fmt: skip
    else:
        plan = res.get("plan") or {}
        ok = 0 not in plan.get("devices", [0]) and "skipped GPU 0" in plan.get("reason", "")
        check(rows, "busy: GPU 0 skipped and named", ok, plan.get("reason", "")[-110:])
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="skip GPU items (CPU test run)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per fit")
    parser.add_argument("--quick", action="store_true", help="no pytest (the compact run)")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    parser.add_argument("--item", help=argparse.SUPPRESS)  # internal: run one worker item
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.item:
        result = worker(args.item, args.steps)
        if result["rank"] == 0:  # DDP children (a multi-GPU "auto") run this too
            print("RESULT " + json.dumps(result), flush=True)
        return 0

    from lightning_maxtp import inspect_resources, plan_strategy

    machine = inspect_resources()
    gpus = len(machine.gpus)
    rows: list[dict[str, Any]] = []
    for billions in (1, 7, 70):  # what the plan says for common sizes on this very machine
        try:
            plan = plan_strategy(machine, int(billions * 1e9), precision="bf16-mixed")
            detail = str(plan)[len("maxtp: strategy: ") :][:150]
        except ValueError as err:
            detail = f"ValueError: {err}"[:150]
        check(rows, f"plan {billions}B params, bf16-mixed", None, detail)
    if gpus and not args.smoke:
        results = gpu_checks(rows, args.steps, gpus)
        if not args.quick:
            run_gpu_tests(rows, "tests/strategy/test_auto_maxtp.py", "real_gpu")
    else:
        results = {"cpu": run_item("cpu", args.steps)}
        fit_checks(rows, results["cpu"], "SingleDeviceStrategy", args.steps)
        check(rows, "GPU checks", None, "skipped: no GPU visible (or --smoke)")
    return finish("gpu_check_strategy", rows, args.out, none_label="info", results=results,
                  machine=machine.to_dict())  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
