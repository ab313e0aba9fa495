#!/usr/bin/env bash
# Build the C++ runner for CUDA programs (examples/cpp/dflash_runner with -DDFLASH_RUNNER_CUDA=ON),
# on a machine with the CUDA toolkit, CMake and a C++17 compiler:
#   scripts/build-cuda-runner.sh EXECUTORCH_SOURCE [BUILD_DIR]
# EXECUTORCH_SOURCE is an ExecuTorch v1.2.0 source tree, e.g. a clone of pytorch/executorch
# checked out at tag v1.2.0; it is only read (the backend source is patched in BUILD_DIR).
# The python3 on PATH must import executorch 1.2.0 and its torch (2.11): the runner links the
# C++ runtime inside that wheel. Prints the runner's path. Installs nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ $# -lt 1 || $# -gt 2 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
source_dir=$(cd "$1" 2>/dev/null && pwd) || { echo "build-cuda-runner.sh: $1 is not a directory (give an ExecuTorch v1.2.0 source tree)" >&2; exit 2; }
build=${2:-examples/cpp/dflash_runner/build-cuda}
# executorch's package directory, torch's libraries and libpython's directory, without importing torch.
paths=$(python3 - <<'PY'
import importlib.metadata as md, importlib.util, sys, sysconfig
try:
    version = md.version("executorch")
except md.PackageNotFoundError:
    sys.exit("build-cuda-runner.sh: python3 has no executorch: pip install executorch==1.2.0 (the release paired with torch 2.11)")
if not version.startswith("1.2."):
    sys.exit(f"build-cuda-runner.sh: python3 has executorch {version}; the CUDA runner is built against 1.2.0's runtime")
torch = importlib.util.find_spec("torch")
if torch is None:
    sys.exit("build-cuda-runner.sh: python3 has no torch (executorch 1.2.0's runtime needs libtorch 2.11 at run time)")
print(importlib.util.find_spec("executorch").submodule_search_locations[0])
print(torch.submodule_search_locations[0] + "/lib")
print(sysconfig.get_config_var("LIBDIR"))
PY
)
mapfile -t p <<<"$paths"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S examples/cpp/dflash_runner -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDFLASH_RUNNER_CUDA=ON \
  -DEXECUTORCH_SOURCE="$source_dir" -DEXECUTORCH_PACKAGE="${p[0]}" -DTORCH_LIBRARY_DIR="${p[1]}" \
  -DPYTHON_LIBRARY_DIR="${p[2]}" >&2
cmake --build "$build" >&2
echo "$build/dflash_runner"
