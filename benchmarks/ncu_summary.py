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
    args = ap.parse_args(argv)
    if args.last:
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
