#!/usr/bin/env bash
# Create .venv (if needed) and install qparity with its pinned CPU torch and test tools.
# Idempotent: a second call only checks that the install is current.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.qparity-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU build (see docs/environment.md).
  # The zoo extra (torchvision, timm) too: tests run the field's own model definitions.
  .venv/bin/python -m pip install --quiet -e '.[test,zoo]'
  touch "$stamp"
fi
