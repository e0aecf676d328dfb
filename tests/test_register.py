"""``import lightning_maxtp`` registers ``strategy="auto_maxtp"`` in either import order.

Each case runs in a fresh interpreter: what is under test is what the first imports do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_import_registers_nothing_heavy_and_installs_one_hook() -> None:
    out = run_fresh(
        """
        import sys
        import lightning_maxtp
        from lightning_maxtp import _register
        _register.install()  # idempotent
        heavy = [m for m in ("torch", "lightning", "lightning.pytorch") if m in sys.modules]
        hooks = [f for f in sys.meta_path if getattr(f, "_lightning_maxtp_hook", False)]
        print(heavy, len(hooks), sys.meta_path[0] is hooks[0])
        """
    )
    assert out == "[] 1 True"


def test_lightning_imported_after_us_gets_the_name() -> None:
    out = run_fresh(
        """
        import importlib, sys
        import lightning_maxtp
        import lightning  # imports lightning.pytorch inside its own __init__
        import lightning.pytorch as pl
        from lightning.pytorch.strategies import StrategyRegistry
        hooks = [f for f in sys.meta_path if getattr(f, "_lightning_maxtp_hook", False)]
        print("registered", "auto_maxtp" in StrategyRegistry, "hooks", len(hooks))
        print("loader", type(pl.__loader__).__name__, type(pl.__spec__.loader).__name__)
        importlib.reload(pl)
        importlib.reload(lightning_maxtp)
        trainer = pl.Trainer(strategy="Auto_MaxTP", accelerator="cpu", logger=False)
        print("after reload", type(trainer.strategy).__name__,
              list(StrategyRegistry).count("auto_maxtp"))
        """
    )
    assert out.splitlines() == [
        "registered True hooks 0",
        "loader SourceFileLoader SourceFileLoader",
        "after reload AutoMaxTP 1",
    ]


def test_lightning_imported_before_us_gets_the_name() -> None:
    out = run_fresh(
        """
        import sys
        import lightning.pytorch as pl
        from lightning.pytorch.strategies import StrategyRegistry
        print("before", "auto_maxtp" in StrategyRegistry)
        import lightning_maxtp
        hooks = [f for f in sys.meta_path if getattr(f, "_lightning_maxtp_hook", False)]
        print("after", "auto_maxtp" in StrategyRegistry, "hooks", len(hooks))
        print(StrategyRegistry["auto_maxtp"]["description"].split(":")[0])
        trainer = pl.Trainer(strategy="auto_maxtp", accelerator="cpu", logger=False)
        print(type(trainer.strategy).__name__)
        """
    )
    assert out.splitlines() == [
        "before False",
        "after True hooks 0",
        "lightning_maxtp",
        "AutoMaxTP",
    ]
