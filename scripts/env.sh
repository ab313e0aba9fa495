# Sourced by demo.sh and test.sh: create .venv and install what the project needs, once.
# The only place that installs anything. Pins: torch 2.13.0 (the CPU build; never a CUDA
# one), executorch 1.5.1 (paired with torch 2.13), triton 3.7.0 (kernels; CPU interpreter).
set -euo pipefail

# No bytecode is compiled at install (--no-compile): a module is compiled when first imported
# and its bytecode kept, so only what the scripts import is compiled, once (compiling all of
# site-packages took 27 s of the 55 s install on 2 cores; the test run's imports compile in
# ~10 s). So that it is kept, bytecode writing stays on in these scripts' processes.
unset PYTHONDONTWRITEBYTECODE
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

REQUIREMENTS=(
  "torch==2.13.0"
  "executorch==1.5.1"
  "triton==3.7.0"
  "pyyaml>=6"
  "numpy"
  "scipy"
  "safetensors"
  "transformers==5.18.0"  # tests only: the reference for checkpoints it writes (issue #27)
  "pytest>=8,<9"  # 9.x moved Node.nodeid: pytest-xdist 3.8's loadgroup then ignores xdist_group marks
  "pytest-xdist"
  "cmake>=3.28,<4"
)

ensure_env() {
  local stamp="$VENV/.dflash-et-installed"
  local want
  want="$(printf '%s\n' "${REQUIREMENTS[@]}" | sha256sum | cut -c1-16)-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
  if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "[setup] creating $VENV and installing (torch 2.13.0 CPU, executorch 1.5.1, triton 3.7.0) ..." >&2
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --no-compile --upgrade pip >&2
  # torch first and alone: the CPU build this machine carries. The constraint keeps every
  # later install (executorch asks for torch too) from replacing it with a CUDA build.
  "$PY" -m pip install -q --no-compile "torch==2.13.0" >&2
  local constraints="$VENV/constraints.txt"
  echo "torch==2.13.0" > "$constraints"
  "$PY" -m pip install -q --no-compile -c "$constraints" "${REQUIREMENTS[@]:1}" >&2
  "$PY" -m pip install -q -c "$constraints" --no-build-isolation --no-deps -e "$ROOT" >&2
  "$PY" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__; assert not torch.version.cuda, 'a CUDA torch was installed'"
  echo "$want" > "$stamp"
}
