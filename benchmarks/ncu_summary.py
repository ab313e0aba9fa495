"""Where a C++ runner's GPU time goes, kernel by kernel (GPU; the summary itself runs anywhere).

`scripts/gpu-checks.sh profile` runs the runner under Nsight Compute with one metric,
`gpu__time_duration.sum` (ncu replays each kernel once for it; `--clock-control none`
leaves the clocks alone) and its CSV goes here: kernels are grouped by name (AOTInductor's
generated ones by their kind: `triton_tem_` GEMM templates, `triton_poi_` pointwise,
`triton_red_` / `triton_per_` reductions; our ops by their kernel names), each group with
its launches, total time and share. The runner's own `--timing` gives the wall time the
same calls took, so the difference is launch overhead and host work.

    python benchmarks/ncu_summary.py ncu.csv [--top 25] [--out PROFILE.md]
    python benchmarks/ncu_summary.py ncu.csv --last 9   (one op call's launches, in order)
    python benchmarks/ncu_summary.py ncu.csv --calls    (each method call of the runner's steps
        broken down into GEMMs, attention, heads and the rest: issue #26's step breakdown)
"""

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
KINDS = (("triton_tem_", "GEMM template (Inductor)"), ("triton_poi_", "pointwise (Inductor)"),
         ("triton_red_", "reduction (Inductor)"), ("triton_per_", "persistent reduction (Inductor)"))


def kind(name: str) -> str:
    """A kernel's group: Inductor's kernels by kind, others by their name without template arguments."""
    for prefix, label in KINDS:
        if name.startswith(prefix):
            return label
    return re.sub(r"<.*>|\(.*\)", "", name).strip() or name


def read(path: Path, shapes: bool = False) -> list[tuple]:
    """(kernel name, microseconds) per launch from ncu's --csv output (lines before the header
    skipped); with shapes, (name, grid, block, microseconds)."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (a line starting with \"ID\"); was ncu run with --csv?")
    out = []
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNITS:
            raise SystemExit(f"{path}: unknown time unit {unit!r} for {row.get('Kernel Name')}")
        us = float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        out.append((row["Kernel Name"], row.get("Grid Size", "?"), row.get("Block Size", "?"), us) if shapes
                   else (row["Kernel Name"], us))
    return out


# A method call's last launch: the drafter's argmax ends draft_forward, the accept launch ends
# target_verify (dflash_verify and dflash_verify_argmax alike): programs with fused heads only.
CALL_ENDS = {"greedy_rows_kernel": "draft_forward", "verify_accept_kernel": "target_verify"}
PARTS = ("GEMMs", "attention", "heads", "other")


def part(name: str) -> str:
    """Where a launch's time goes in a step: GEMMs (Inductor's templates, cuBLAS / CUTLASS
    kernels), attention (`dflash::cached_attention`'s kernels), heads (the verify and
    sampling heads, the drafts' argmax), other (Inductor's pointwise and reduction kernels)."""
    low = name.lower()
    if name.startswith("triton_tem_") or any(word in low for word in ("gemm", "xmma", "cutlass")):
        return "GEMMs"
    if name.startswith(("cached_attention_", "combine_kernel")):
        return "attention"
    if name.startswith(("verify_", "greedy_rows_kernel", "sample_", "chunk_kernel")):
        return "heads"
    return "other"


def calls(launches: list[tuple[str, float]]) -> list[str]:
    """Each method call, in order, found by its last launch (CALL_ENDS), its kernel time by part."""
    lines = ["| call | method | launches | kernels us | " + " | ".join(f"{p} us" for p in PARTS) + " |",
             "|---|---|---|---|" + "---|" * len(PARTS)]
    current: dict[str, float] = defaultdict(float)
    count = found = 0
    for name, us in launches:
        current[part(name)] += us
        count += 1
        method = CALL_ENDS.get(kind(name))
        if method is not None:
            found += 1
            total = sum(current.values())
            lines.append(f"| {found} | {method} | {count} | {total:.0f} | " + " | ".join(
                f"{current[p]:.0f} ({current[p] / max(total, 1e-9):.0%})" for p in PARTS) + " |")
            current, count = defaultdict(float), 0
    if not found:
        raise SystemExit(f"no method call found: none of {', '.join(CALL_ENDS)} was launched (a program "
                         "without fused heads? then use the plain summary)")
    if count:
        lines.append(f"(after the last call: {count} launches, {sum(current.values()):.0f} us)")
    return lines


def summary(launches: list[tuple[str, float]], top: int = 25) -> list[str]:
    total = sum(us for _, us in launches)
    groups: dict[str, list[float]] = defaultdict(list)
    for name, us in launches:
        groups[kind(name)].append(us)
    lines = [f"{len(launches)} launches, {total / 1e3:.2f} ms of kernel time", "",
             "| kernel (group) | launches | total ms | share | mean us |", "|---|---|---|---|---|"]
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    for name, times in ranked[:top]:
        lines.append(f"| {name} | {len(times)} | {sum(times) / 1e3:.3f} | {sum(times) / max(total, 1e-9):.1%} | "
                     f"{sum(times) / len(times):.1f} |")
    if len(ranked) > top:
        rest = [t for _, times in ranked[top:] for t in times]
        lines.append(f"| ({len(ranked) - top} more groups) | {len(rest)} | {sum(rest) / 1e3:.3f} | "
                     f"{sum(rest) / max(total, 1e-9):.1%} | - |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--last", type=int, default=0,
                    help="instead, the last N launches one by one, in order, with their grid and block "
                         "(one call of an op: its launches, e.g. the sample select's stages)")
    ap.add_argument("--calls", action="store_true",
                    help="instead, each method call (draft_forward, target_verify) in order, its kernel time "
                         "broken down into GEMMs, attention, heads and the rest")
    args = ap.parse_args(argv)
    if args.calls:
        text = "\n".join(calls(read(args.csv))) + "\n"
    elif args.last:
        rows = read(args.csv, shapes=True)[-args.last:]
        text = "\n".join(["| kernel | grid | block | us |", "|---|---|---|---|"]
                         + [f"| {kind(n)} | {g} | {b} | {us:.1f} |" for n, g, b, us in rows]) + "\n"
    else:
        text = "\n".join(summary(read(args.csv), args.top)) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
