"""A realistic-size DFlash CUDA export and one verify step (GPU; not a test).

1. Exports a CUDA DFlash config (default: qwen3-smoke-sampling-cuda, Qwen3-1.7B's
   shapes with 4 layers) through the CLI path and records the time and the file sizes.
2. Traces `target_verify` once more and times one verify step (owners x 16 rows)
   in the rewritten graph (fused `dflash::` head) against the same graph with the
   plain ATen head, both run as graph modules on the GPU (before AOTInductor: an
   AOTInductor `.so` cannot be loaded in Python on that machine).
Prints a markdown table; --out writes it to a file.

    python benchmarks/bench_dflash_step.py --output-dir /tmp/smoke --out smoke.md
"""

import argparse
import copy
import dataclasses
import io
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # graph_program

from dflash_et.export import artifact, boundary, builder, config, exporter, methods  # noqa: E402

ROWS_PER_OWNER = 16


def step_inputs(spec_method, owners: int, vocab: int, seq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = owners * ROWS_PER_OWNER
    values = {
        "tokens": torch.randint(0, vocab, (rows,), generator=g),
        "offsets": torch.arange(owners + 1) * ROWS_PER_OWNER,
        "start_position": torch.full((owners,), seq // 2, dtype=torch.int64),
        "slots": torch.arange(owners),
        "temperature": torch.tensor([0.0, 0.8, 1.0, 0.6] * (owners // 4) + [0.7] * (owners % 4)),
        "top_k": torch.tensor([0, 50, 0, 20] * (owners // 4) + [0] * (owners % 4)),
        "top_p": torch.tensor([1.0, 0.9, 0.9, 1.0] * (owners // 4) + [0.95] * (owners % 4)),
        "seed": torch.arange(owners) + 99,
    }
    return [values[t.name].cuda() for t in spec_method.inputs]


def time_ms(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-smoke-sampling-cuda")
    parser.add_argument("--output-dir", default="out/qwen3-smoke")
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--owners", type=int, default=64)
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from dflash_et.lowering.cuda import prepare
    from graph_program import runnable_module

    cfg = config.load(args.config)
    lines = [
        f"## DFlash CUDA export and verify step: `{args.config}`",
        "",
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, python {platform.python_version()}, "
        f"executorch {exporter.versions()['executorch']}",
        "",
    ]
    if not args.skip_export:
        t0 = time.perf_counter()
        directory = exporter.export_program(cfg, args.output_dir, force=True)
        seconds = time.perf_counter() - t0
        manifest = json.loads((Path(directory) / "manifest.json").read_text())
        sizes = {f: (Path(directory) / f).stat().st_size / 1e6 for f in manifest["files"]}
        lines += [
            f"export: {seconds:.0f} s; " + ", ".join(f"{f} {mb:.1f} MB" for f, mb in sizes.items()),
            f"fused heads: {manifest['lowering']['fused_heads']}",
            "",
        ]
        print("\n".join(lines[-3:]), flush=True)

    spec = builder.build(cfg)
    verify = next(m for m in spec.methods if m.name == "target_verify")
    quiet = artifact.Progress(9, stream=io.StringIO())
    alone = methods.ProgramSpec([verify], spec.constants, spec.dims)
    traced = exporter.trace(alone, quiet, device="cuda")
    aten = copy.deepcopy(traced["target_verify"])
    boundary.strip(aten)
    fused = traced["target_verify"]
    # only the head fused, as an export does it (the markers left are stripped: they would copy the caches)
    heads_only = dataclasses.replace(cfg.lowering, fused_verify=True, fused_attention=False)
    report = prepare(traced, alone, dataclasses.replace(cfg, lowering=heads_only))
    c = spec.constants
    inputs = step_inputs(verify, args.owners, c["vocab_size"], c["max_seq_len"])
    rows = [f"| graph | {args.owners} owners x {ROWS_PER_OWNER} rows, V={c['vocab_size']} | median ms |",
            "|---|---|---:|"]
    results = {}
    for name, ep, iters in (("fused dflash_verify", fused, 20), ("ATen head", aten, 5)):
        module = runnable_module(ep)
        with torch.no_grad():
            results[name] = module(*inputs)
            ms = time_ms(lambda: module(*inputs), iters)
        rows.append(f"| target_verify, {name} | {c['model_dtype']} | {ms:.2f} |")
        print(rows[-1], flush=True)
    same = all(torch.equal(a, b) for a, b in zip(results["fused dflash_verify"][:2], results["ATen head"][:2]))
    lines += rows + ["", f"fused: {report['target_verify']}; accepted/next_token identical: {same}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
