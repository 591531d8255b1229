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
# The simulator's compiled kernels: built here, once per source hash (about a minute and a
# half on 2 cores for the AVX2 build), so neither the demo nor the tests wait on a compiler.
# Never fatal: without a compiler the executor runs its torch kernels and says so.
.venv/bin/python -c "from simulator.runtime import native; print('simulator kernels:', native.status())" \
  || echo "setup.sh: the simulator's compiled kernels did not build; the torch kernels run instead" >&2
