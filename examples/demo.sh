#!/usr/bin/env bash
# The README's demo command: set up .venv with what the demo needs (first run only), run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup --demo
.venv/bin/python examples/demo.py "$@"
