#!/usr/bin/env bash
# The main job on the embedded default: for a DFlash config, first distil its drafter on the
# target's greedy text (a random drafter's drafts are never accepted); export the config to a
# .pte, load and run every method in the ExecuTorch runtime, check it against the eager
# reference, and (for a DFlash program) run its speculative loop with tokens/step,
# acceptance length and wall time.
#   scripts/demo.sh [config] [steps]      (default: tiny-dflash-sampling, 12 steps)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env
cd "$ROOT"
CONFIG="${1:-tiny-dflash-sampling}"
STEPS="${2:-12}"
OUT="out/${CONFIG##*/}"
OUT="${OUT%.yaml}"
CLI="$VENV/bin/dflash-et"

if [[ "$("$PY" -c 'import sys; from dflash_et.export import config; print(config.load(sys.argv[1]).program)' "$CONFIG")" == dflash ]]; then
  "$CLI" distill --config "$CONFIG" --output-dir "$OUT-distilled" --force
  CONFIG="$OUT-distilled/export.yaml"
fi
"$CLI" export --config "$CONFIG" --output-dir "$OUT" --force
"$CLI" check --config "$CONFIG" --artifact "$OUT"
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
m = json.loads((out / "manifest.json").read_text())
print(f"\nartifact {out}: program {m['program']}, variant {m['variant']}, backend {m['backend']}")
for name, meta in m["files"].items():
    print(f"  {name}: {meta['bytes'] / 1e6:.2f} MB  sha256 {meta['sha256'][:16]}")
for name, meth in m["methods"].items():
    args = ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in meth["inputs"])
    print(f"  method {name}({args})")
print("  constants: " + ", ".join(f"{k}={v}" for k, v in m["constants"].items()))
PY
if grep -q '"program": "dflash"' "$OUT/manifest.json"; then
  echo
  "$CLI" run --config "$CONFIG" --artifact "$OUT" --steps "$STEPS"
fi
