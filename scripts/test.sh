#!/usr/bin/env bash
# The tests, on a fresh machine or an existing checkout: scripts/test.sh [--quick] [pytest args]
# --quick: the representative subset marked `quick` (reference rules, models, checkpoints, one
# case of each kernel, the lowering pass, config errors and the check command; under 3 minutes
# on 2 cores), for the edit-test loop. CI runs everything.
# Runs on every core (at most 4 workers; DFLASH_TEST_WORKERS=1 runs in one process): the
# Triton interpreter tests are single-threaded Python, so two cores take about half the time.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env
cd "$ROOT"
export TRITON_INTERPRET=1  # Triton kernels run on the CPU through the interpreter
export PATH="$VENV/bin:$PATH"  # the venv's cmake (>= 3.28) builds the C++ runner in its test
select=()
if [[ "${1:-}" == "--quick" ]]; then
  shift
  select=(-m quick)
fi
workers="${DFLASH_TEST_WORKERS:-$(nproc)}"
(( workers > 4 )) && workers=4
parallel=()
if (( workers > 1 )); then
  # Modules whose fixtures export programs carry an xdist_group mark: one worker each.
  parallel=(-n "$workers" --dist loadgroup)
  export OMP_NUM_THREADS=1  # one intra-op thread per worker: no spin-waiting between them
fi
exec "$PY" -m pytest -q --durations=15 "${parallel[@]}" "${select[@]}" "$@"
