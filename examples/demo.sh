#!/usr/bin/env bash
# The README's main-job command: set up .venv (first run only), probe the machine, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
.venv/bin/python examples/demo.py "$@"
