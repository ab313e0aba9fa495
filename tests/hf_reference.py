"""transformers as a test reference (a test dependency, scripts/env.sh; no hub access).

`python -m pytest` puts the repo root on sys.path, and the root holds a `kernels/` folder
(ours, imported as dflash_et.kernels): transformers asks `import kernels` whether the hub
`kernels` package is installed and would import ours. So transformers is imported with the
root off the path, once."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def transformers():
    if "transformers.activations" not in sys.modules:  # (the module whose import probes for `kernels`)
        saved = sys.path[:]
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
        try:
            import transformers.activations  # noqa: F401
        finally:
            sys.path[:] = saved
    return sys.modules["transformers"]
