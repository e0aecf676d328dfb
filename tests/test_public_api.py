from __future__ import annotations

import subprocess
import sys

import pytest

import lightning_maxtp


def test_every_public_name_resolves() -> None:
    assert lightning_maxtp.__all__ == sorted(lightning_maxtp.__all__)
    for name in lightning_maxtp.__all__:
        assert getattr(lightning_maxtp, name) is not None, name


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        lightning_maxtp.NoSuchThing  # noqa: B018


def test_import_is_light() -> None:
    code = (
        "import sys, lightning_maxtp\n"
        "print([m for m in ('torch', 'lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
