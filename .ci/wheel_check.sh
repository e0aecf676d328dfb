#!/usr/bin/env bash
# What a user installs: build the sdist and, from it, the wheel (python -m build), check their
# metadata (twine check --strict: the README renders on an index), install the wheel alone into
# a fresh folder and import lightning_maxtp from there, not from this clone. The wheel must hold
# every module of the package, py.typed and the `maxtp` entry point; the sdist the same modules.
# A few seconds; .ci/run runs it after ruff. Usage: bash .ci/wheel_check.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Without isolation: the virtual environment's setuptools builds, so no download is needed.
# The wheel is built from the sdist (build's default), so a file the sdist misses fails here.
if ! "$PY" -m build --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1; then
  cat "$work/build.log"
  exit 1
fi
"$PY" -m twine check --strict "$work"/dist/*

# --target: a plain folder, no dependency (--no-deps); the import below puts it first on the
# path and runs from that folder, so this clone's (editable) copy cannot answer instead.
"$PY" -m pip --disable-pip-version-check -q install --no-deps --no-compile \
  --target "$work/site" "$work"/dist/*.whl 2>&1 | grep -v '^WARNING: Location' || true

"$PY" - "$work" <<'EOF'
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

work = Path(sys.argv[1])
(wheel,) = (work / "dist").glob("*.whl")
(sdist,) = (work / "dist").glob("*.tar.gz")
modules = {p.as_posix() for p in Path("lightning_maxtp").rglob("*.py")}
in_wheel = set(zipfile.ZipFile(wheel).namelist())
missing = sorted(modules - in_wheel)
assert not missing, f"{wheel.name} lacks {missing}"
assert "lightning_maxtp/py.typed" in in_wheel, f"{wheel.name} lacks py.typed (PEP 561)"
(entry_points,) = [n for n in in_wheel if n.endswith(".dist-info/entry_points.txt")]
assert "maxtp = lightning_maxtp.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
root = sdist.name.removesuffix(".tar.gz")
in_sdist = {n.removeprefix(root + "/") for n in tarfile.open(sdist).getnames()}
missing = sorted(modules - in_sdist)
assert not missing, f"{sdist.name} lacks {missing}"

site = work / "site"
check = (
    "import pathlib, sys, lightning_maxtp as m; "
    f"assert pathlib.Path(m.__file__).is_relative_to({str(site)!r}), m.__file__; "
    "import lightning_maxtp.cli; "
    "print(m.__version__, pathlib.Path(m.__file__).parent)"
)
# -S: no site-packages, so neither this clone's editable install nor a copy in the virtual
# environment can be imported; the package and its CLI module import without their dependencies.
out = subprocess.run(
    [sys.executable, "-S", "-c", check],
    cwd=work, env={"PYTHONPATH": str(site)}, capture_output=True, text=True, check=False,
)
assert out.returncode == 0, out.stderr
subpackages = sorted({m.split("/")[1] for m in modules if m.count("/") > 1})
print(
    f"wheel ok: {wheel.name} ({len(modules)} modules, {len(subpackages)} subpackages, py.typed, "
    f"maxtp entry point), {sdist.name}; imported {out.stdout.strip()}"
)
EOF
