"""``lightning_maxtp.data``'s names resolve, and importing the package costs nothing."""

from __future__ import annotations

import subprocess
import sys

import lightning_maxtp.data


def test_every_name_resolves() -> None:
    assert lightning_maxtp.data.__all__ == sorted(lightning_maxtp.data.__all__)
    for name in lightning_maxtp.data.__all__:
        assert getattr(lightning_maxtp.data, name) is not None, name


def test_import_is_light() -> None:
    code = (
        "import sys, lightning_maxtp.data\n"
        "print([m for m in ('torch', 'lightning', 'litdata') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
