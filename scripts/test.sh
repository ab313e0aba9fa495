#!/usr/bin/env bash
# The tests, on a fresh machine or an existing checkout: scripts/test.sh [pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env
cd "$ROOT"
export TRITON_INTERPRET=1  # Triton kernels run on the CPU through the interpreter
exec "$PY" -m pytest -q "$@"
