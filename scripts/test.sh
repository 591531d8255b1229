#!/usr/bin/env bash
# Set everything up and run the test suite (and the import-layer and lint checks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The report's browser test needs Debian's chromium: install it when missing, never fatally
# (without apt-get or root the test skips and says why).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
  apt_install 2>/dev/null || { apt-get update -qq && apt_install; } \
    || echo "test.sh: could not install chromium; the report's browser test will skip" >&2
fi
.venv/bin/ruff check .
# Byte-compile once: with PYTHONDONTWRITEBYTECODE set (as in this project's sandbox), each
# pytest worker and every child process a test starts (the CLI, the sweep's workers)
# compiled every module of ours from source again, and pytest re-rewrote every test file.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 2 analysis bench examples pipelines qparity schemas simulator stages tests >/dev/null
# Two workers (one torch thread each; tests/conftest.py), whole files per worker so a
# module's fixtures are built once: $QPARITY_TEST_WORKERS=0 runs in one process.
.venv/bin/python -m pytest -q -n "${QPARITY_TEST_WORKERS:-2}" --dist loadfile "$@"
