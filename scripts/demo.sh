#!/usr/bin/env bash
# Set everything up and run the whole chain on the bundled digits example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/qparity demo "$@"
