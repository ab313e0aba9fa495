#!/usr/bin/env bash
# The tests, on a fresh machine or an existing checkout: scripts/test.sh [pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env
cd "$ROOT"
export TRITON_INTERPRET=1  # Triton kernels run on the CPU through the interpreter
export PATH="$VENV/bin:$PATH"  # the venv's cmake (>= 3.28) builds the C++ runner in its test
exec "$PY" -m pytest -q "$@"
