"""transformers as a test reference (a test dependency, scripts/env.sh; no hub access).

`python -m pytest` puts the repo root on sys.path, and the root holds a `kernels/` folder
(ours, imported as dflash_et.kernels): transformers asks `import kernels` whether the hub
`kernels` package is installed and would import ours. So transformers is imported with the
root off the path, once."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def transformers():
    if "transformers" not in sys.modules or "kernels" in sys.modules:
        saved = sys.path[:]
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
        try:
            import transformers as module
            import transformers.activations  # noqa: F401 (the import that probes for `kernels`)
        finally:
            sys.path[:] = saved
        return module
    return sys.modules["transformers"]
