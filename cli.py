"""`dflash-et`: export DFlash verify heads and programs to ExecuTorch, and check them."""

import argparse
import contextlib
import signal
import sys
import textwrap
import threading

from .export import config as config_mod

EPILOG = """\
configs:
  --config takes a YAML file or the name of a built-in config (configs/):
{configs}

examples:
  dflash-et export --config heads-sampling --output-dir out/heads
  dflash-et check --config heads-sampling --artifact out/heads
  dflash-et run --config tiny-dflash-sampling --artifact out/tiny
  dflash-et distill --config tiny-dflash-sampling --output-dir out/tiny-distilled
  dflash-et export --config out/tiny-distilled/export.yaml --output-dir out/tiny-spec
"""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _jobs(text: str) -> int | None:
    """A positive whole number, or "auto" (None: the lowering decides)."""
    if text == "auto":
        return None
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number or auto (e.g. --jobs 4)") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-et",
        description="Export DFlash speculative-decoding programs (target, drafter, on-device "
        "verify heads) to ExecuTorch .pte files, and check them in the ExecuTorch runtime.",
        epilog=EPILOG.format(configs=textwrap.fill(", ".join(config_mod.builtin_names()), width=78,
                                                  initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser(
        "export", help="trace and lower a config into model.pte (+ config.yaml, manifest.json)",
        description="Trace every method of the config, lower it for its backend and write "
        "model.pte (CUDA: + aoti_cuda_blob.ptd), the resolved config.yaml and manifest.json. "
        "Files are written atomically; the same config always gives the same model.pte "
        "(portable backend). Progress goes to stderr.",
    )
    e.add_argument("--config", required=True, help="YAML file or built-in config name")
    e.add_argument("--output-dir", default=None, help="artifact directory (default: out/<config name>)")
    e.add_argument("--force", action="store_true",
                   help="overwrite an artifact exported from a different config")
    e.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help="CUDA: compile the methods in N worker processes side by side; 1: in this process; "
                   "auto (the default): one per method, at most half the CPU cores (docs/CONTRACT.md)")

    c = sub.add_parser(
        "check", help="load an artifact in executorch.runtime, run every method, compare with eager",
        description="Load model.pte in executorch.runtime, run every method on seeded random "
        "inputs (mixed greedy and sampling owners, empty owners, NaN rows, out-of-range drafts) "
        "and compare with the eager PyTorch reference. Exit code 1 on any mismatch; SPEC.md's "
        "legal differences are reported, not failed.",
    )
    c.add_argument("--config", required=True, help="the config the artifact was exported with")
    c.add_argument("--artifact", required=True, help="artifact directory written by `export`")
    c.add_argument("--cases", type=int, default=20, help="random cases per head method (default 20)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random cases (default 0)")

    d = sub.add_parser(
        "distill", help="train a DFlash config's drafter on its target's greedy text; write a z-lab checkpoint",
        description="Train the config's drafter on its target's greedy continuations of the prompts "
        "`dflash-et run --seed SEED` drives, so that its drafts get accepted there, and write it as a "
        "z-lab checkpoint with export.yaml (the config, model.drafter naming the checkpoint). A random "
        "target's text is only learned where it was seen: export/models/distill.py says more. Runs on "
        "the CPU, in float64: about 10 s for the tiny presets; meant for small models.",
    )
    d.add_argument("--config", required=True, help="YAML file or built-in config name (program: dflash)")
    d.add_argument("--output-dir", default=None, help="checkpoint directory (default: out/<config name>-distilled)")
    d.add_argument("--steps", type=_positive, default=300, help="optimiser steps (default 300)")
    d.add_argument("--seed", type=int, default=0, help="the prompts: those of `dflash-et run --seed` (default 0)")
    d.add_argument("--force", action="store_true", help="replace an existing output directory")

    r = sub.add_parser(
        "run", help="run the speculative loop of a DFlash artifact and print tokens and statistics",
        description="Drive a DFlash program's speculative loop (prefill, draft, verify, commit) "
        "for several owners in executorch.runtime; print committed tokens, tokens per step, "
        "acceptance length and wall time per step.",
    )
    r.add_argument("--config", required=True, help="the config the artifact was exported with")
    r.add_argument("--artifact", required=True, help="artifact directory written by `export`")
    r.add_argument("--steps", type=int, default=8, help="speculative steps (default 8)")
    r.add_argument("--seed", type=int, default=0, help="seed of prompts and owner parameters")
    return p


def _default_output(name: str) -> str:
    from pathlib import Path

    return str(Path("out") / Path(name).name.removesuffix(".yaml"))


def _quiet_third_party() -> None:
    """Silence import-time noise of dependencies that says nothing about the user's export."""
    import logging
    import warnings

    logging.getLogger("torchao").setLevel(logging.ERROR)  # its optional CUDA .so files
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")


@contextlib.contextmanager
def _noting_interrupts(seen: list):
    """While in the block, a Ctrl-C (SIGINT) is noted in `seen` and raised as usual. torch can
    turn the KeyboardInterrupt into another error (a C++ argument parser that was
    interrupted raises TypeError naming it), so `main` asks `seen`, not the exception type.
    A SIGINT that is ignored (a background job) stays ignored; off the main thread (where
    no handler can be set) nothing changes."""
    if (signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def note(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet_third_party()
    interrupts = []
    try:
        with _noting_interrupts(interrupts):
            return _main(args)
    except Exception:
        if not interrupts:
            raise
    except KeyboardInterrupt:
        pass
    print("dflash-et: interrupted; nothing half-written was left behind", file=sys.stderr)
    return 130


def _main(args) -> int:
    from .export import artifact
    from .lowering.errors import LoweringError

    try:
        cfg = config_mod.load(args.config)
        if args.command == "export":
            from .export import exporter

            exporter.export_program(cfg, args.output_dir or _default_output(args.config), force=args.force,
                                   jobs=args.jobs)
            return 0
        if args.command == "distill":
            from .export import distilling
            from .export.models.distill import Recipe

            distilling.distill_checkpoint(cfg, args.output_dir or _default_output(args.config) + "-distilled",
                                          seed=args.seed, recipe=Recipe(steps=args.steps), force=args.force,
                                          say=lambda text: print(f"[dflash-et] {text}", file=sys.stderr))
            return 0
        if args.command == "check":
            from .export import check

            return 0 if check.check_artifact(cfg, args.artifact, runs=args.cases, seed=args.seed) else 1
        from .export import driver  # "run", the last of the required subcommands

        return driver.run_cli(cfg, args.artifact, steps=args.steps, seed=args.seed)
    except (config_mod.ConfigError, artifact.ArtifactError, LoweringError) as e:
        print(f"dflash-et: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
