"""A CUDA DFlash program in the C++ runner (GPU; not a test): export time, then the
runner's own per-method times (--timing: median of every call, the GPU work included)
for `owners` owners, speculative and target-only, and the loop's tokens per second.

    python benchmarks/bench_cuda_runner.py --runner RUNNER --config qwen3-smoke-sampling-cuda \
        --output-dir /tmp/q --out q.md
    (long contexts: --config qwen3-smoke-8k-sampling-cuda --prompt 128 --prompt-max 8000
     --modes speculative --graphs off (or on): its export took ~465 s on the H200 and each run
     reloads a 15 GB .ptd, so more than one run does not fit one 10-minute device call; with
     --zero-constants true the caches stay out of the .ptd (lowering/zero_constants.py, the
     runner's zero-constants patch: token-identical on the GPU, benchmarks/HISTORY.md session
     54). On an 80 GB GPU its compiles side by side (--jobs auto) ran out of memory: pass
     fewer there (--jobs 2 would fit the memory seen then; not tried). The step at fixed
     lengths against max_seq_len (issue #26): the
     same --prompt / --prompt-max with --max-seq-len 2048 ... 32768)

The drafts of the presets' random drafters are never accepted, so the speculative loop
commits one token per verify; a step costs the same whatever is accepted (the verify rows
are fixed by the block), so with drafts that are always right it would commit block_size
tokens per step: the table gives that figure as step time / block_size.

`--graphs both` (the default) runs each mode twice: as the backend launches it, and with the
runner's --cuda-graphs (each method's calls replayed as CUDA graphs). The difference is the
launch and allocation overhead that graphs remove (issue #26).

A second table puts target_verify and draft_forward against their roofline (`roofline.py`:
bytes / copy bandwidth or FLOPs / bf16 matmul rate, both measured in this run) and against their
sequential floor (the attention's roofline plus the rest's: `roofline.Terms.sequential`), at each
owner's mean context during the run (prompt + half the new tokens).
"""

import argparse
import dataclasses
import multiprocessing
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import runner_cli  # noqa: E402
from roofline import measure_rates, step_terms  # noqa: E402

from dflash_et.export import artifact, builder, config, driver, exporter, models  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", required=True, help="the CUDA dflash_runner (scripts/build-cuda-runner.sh)")
    ap.add_argument("--config", default="qwen3-smoke-sampling-cuda", help="a built-in config or a YAML path")
    ap.add_argument("--fused-verify", choices=("true", "false"), help="override lowering.fused_verify")
    ap.add_argument("--autotune", choices=config.AUTOTUNE, help="override lowering.autotune")
    ap.add_argument("--fused-attention", choices=("true", "false"), help="override lowering.fused_attention")
    ap.add_argument("--zero-constants", choices=("true", "false"), help="override lowering.zero_constants")
    ap.add_argument("--max-seq-len", type=int, help="override limits.max_seq_len (the same owners at 2k-32k)")
    ap.add_argument("--output-dir", required=True, help="export here (kept if it already holds this config)")
    ap.add_argument("--owners", type=int, default=0, help="default: the program's max_owners")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per owner")
    ap.add_argument("--prompt-max", type=int, default=0,
                    help="draw each owner's prompt length from [--prompt, this] (long contexts; default: --prompt)")
    ap.add_argument("--new", type=int, default=48, help="tokens to generate per owner")
    ap.add_argument("--jobs", type=lambda t: None if t == "auto" else int(t), default=None,
                    help="compile the methods in N worker processes (export --jobs; default auto)")
    ap.add_argument("--mix", choices=tuple(MIXES), default="mixed",
                    help="the owners' sampling parameters (sampling programs; greedy programs take greedy)")
    ap.add_argument("--modes", default="speculative,target-only",
                    help="the runner runs, comma-separated (a long-context program reloads its .ptd for each: "
                         "give one to fit a device call)")
    ap.add_argument("--graphs", choices=("off", "on", "both"), default="both",
                    help="run without the runner's --cuda-graphs, with it, or both (default)")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)

    flags = {"speculative": [], "target-only": ["--target-only"]}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(flags):
        ap.error(f"--modes {args.modes!r}: give speculative, target-only or both, comma-separated")
    cfg = config.load(args.config)
    lowering = {}
    if args.fused_verify is not None:
        lowering["fused_verify"] = args.fused_verify == "true"
    if args.autotune is not None:
        lowering["autotune"] = args.autotune
    if args.fused_attention is not None:
        lowering["fused_attention"] = args.fused_attention == "true"
    if args.zero_constants is not None:
        lowering["zero_constants"] = args.zero_constants == "true"
    cfg = dataclasses.replace(cfg, lowering=dataclasses.replace(cfg.lowering, **lowering))
    if args.max_seq_len is not None:
        cfg = dataclasses.replace(cfg, limits=dataclasses.replace(cfg.limits, max_seq_len=args.max_seq_len))
    out = Path(args.output_dir)
    held = artifact.read_manifest(out)
    if held is not None and held.get("config_digest") == cfg.digest():
        export_note = "export reused"
    else:
        start = time.perf_counter()
        export_in_child(cfg, out, args.jobs)
        export_note = f"export {time.perf_counter() - start:.0f} s (--jobs {args.jobs or 'auto'})"
    spec = builder.build(cfg)
    c = spec.constants
    n = args.owners or c["max_owners"]
    g = torch.Generator().manual_seed(0)
    sampling = c["variant"] == "sampling"
    longest = max(args.prompt, args.prompt_max)
    if longest + args.new > c["max_seq_len"]:
        ap.error(f"prompts up to {longest} + {args.new} new tokens do not fit max_seq_len {c['max_seq_len']}")
    lengths = torch.randint(args.prompt, longest + 1, (n,), generator=g).tolist()
    params = MIXES[args.mix if sampling else "greedy"]
    owners = [driver.Owner(f"owner{i}", torch.randint(0, c["vocab_size"], (lengths[i],), generator=g).tolist(),
                           args.new, **params[i % len(params)], seed=i) for i in range(n)]
    listed = tempfile.NamedTemporaryFile("w", suffix=".owners", delete=False)  # 64 long prompts: too long
    with listed:  # for a command line
        listed.write("".join(runner_cli.owner_spec(o) + "\n" for o in owners))
    prompt = (f"prompt {args.prompt}" if longest == args.prompt
              else f"prompts {args.prompt}-{longest} (sum {sum(lengths)})")
    ptd_bytes = sum(p.stat().st_size for p in out.glob("*.ptd"))
    lines = [f"# {args.config} in the C++ CUDA runner",
             f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, python {platform.python_version()}, "
             f"{export_note}, max_seq_len {c['max_seq_len']}, .ptd {ptd_bytes / 1e9:.2f} GB, lowering {cfg.lowering}, "
             f"{n} owners x {prompt} + {args.new} new tokens "
             f"({MIX_TEXT[args.mix if sampling else 'greedy']}), block {c['block_size']}", "",
             "(a method's us, then in brackets its host us: until the call returned, before the GPU finished)", "",
             "| mode | CUDA graphs | draft_forward us | target_verify us | step us | target_prefill us | tokens/s | "
             "tokens/s, drafts always right (step / block) |", "|---|---|---|---|---|---|---|---|"]
    timings = {}  # {mode: {method: median us}}, of the runs with graphs where there are any
    graph_runs = {"off": [False], "on": [True], "both": [False, True]}[args.graphs]
    try:
        for mode in modes:
            for graphs in graph_runs:
                done = subprocess.run([args.runner, "--program", out / "model.pte", "--data",
                                       out / "aoti_cuda_blob.ptd", "--timing", *flags[mode],
                                       *(["--cuda-graphs"] if graphs else []), "--owners", listed.name],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                got = runner_cli.parse(done.stdout)
                t = timings[mode] = {m: v["median_us"] for m, v in got["timing"].items()}
                right = f"{n * c['block_size'] / (t['step'] * 1e-6):.0f}" if mode == "speculative" else "-"
                used = got["cuda_graphs"]
                used = f"{used['captured']} captured, {used['replayed']} calls" if graphs else "off"
                lines.append(f"| {mode} | {used} | {with_host(t, 'draft_forward')} | {with_host(t, 'target_verify')} | "
                             f"{t['step']:.0f} | {t['target_prefill']:.0f} | {got['loop']['tokens_per_second']:.0f} | "
                             f"{right} |")
    finally:
        Path(listed.name).unlink()
    lines += ["", *roofline_lines(cfg, n, [length + args.new / 2 for length in lengths], timings)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def export_in_child(cfg, out: Path, jobs: int | None) -> None:
    """`exporter.export_program(cfg, out)` in a process of its own (spawned), so that the GPU memory
    the export took is given back before the runner loads the program: exported in this process,
    the 32k config's runner ran out of the H200's memory at load (benchmarks/HISTORY.md, session 62).
    Raises SystemExit, naming the config, when the export fails (its error is printed above)."""
    child = multiprocessing.get_context("spawn").Process(
        target=exporter.export_program, args=(cfg, out), kwargs={"force": True, "jobs": jobs})
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"the {cfg.backend} {cfg.program} export into {out} failed (exit {child.exitcode}; its error "
                         "is above)")


def with_host(t: dict, method: str) -> str:
    """`method`'s median us with its host part (`<method>.host`), or '-' where it did not run."""
    if method not in t:
        return "-"
    return f"{t[method]:.0f} ({t[method + '.host']:.0f})"


GREEDY = dict(temperature=0.0, top_k=0, top_p=1.0)
MIXES = {  # owner i takes entry i % len: the heads' cost per kind of owner, apart or mixed
    "mixed": [GREEDY, dict(temperature=0.8, top_k=40, top_p=1.0), GREEDY, dict(temperature=0.8, top_k=0, top_p=0.95)],
    "greedy": [GREEDY],
    "temperature": [dict(temperature=0.8, top_k=0, top_p=1.0)],
    "top-p": [dict(temperature=1.0, top_k=0, top_p=0.95)],
}
MIX_TEXT = {"mixed": "half greedy, half T 0.8 with top-k 40 / top-p 0.95", "greedy": "every owner greedy",
            "temperature": "every owner T 0.8", "top-p": "every owner T 1.0, top-p 0.95"}


def roofline_lines(cfg, owners: int, cells: list[float], timings: dict) -> list[str]:
    """The roofline table of the runs' `timings` ({mode: {method: median us}})."""
    target, _ = models.target_config(cfg.model)
    drafter, _ = models.drafter_config(cfg.model)
    element = 4 if cfg.model.dtype == "float32" else 2
    block = drafter.block_size
    bandwidth, rate = measure_rates(owners * block, target.hidden_size, target.vocab_size)
    lines = [f"Roofline: copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write), bf16 matmul "
             f"{rate / 1e12:.0f} TFLOP/s at [{owners * block} x {target.hidden_size}] x "
             f"[{target.hidden_size} x {target.vocab_size}]; mean context {sum(cells) / len(cells):.0f} cells", "",
             "| call | rows | GFLOP | GB | memory us | compute us | measured us | x roofline | sequential floor us "
             "| x sequential floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    calls = [("target_verify", "speculative", block), ("draft_forward", "speculative", block),
             ("target_verify", "target-only", 1)]
    for method, mode, rows_per_owner in calls:
        measured = timings.get(mode, {}).get(method)
        if not measured:
            continue
        terms = step_terms(target, drafter, owners, rows_per_owner, cells, element)[method]
        memory, compute = terms.seconds(bandwidth, rate)
        sequential = terms.sequential(bandwidth, rate)
        lines.append(f"| {method} ({mode}) | {owners * (block if method == 'draft_forward' else rows_per_owner)} | "
                     f"{terms.flops / 1e9:.0f} | {terms.bytes / 1e9:.2f} | {memory * 1e6:.0f} | {compute * 1e6:.0f} | "
                     f"{measured:.0f} | {measured * 1e-6 / max(memory, compute):.2f} | {sequential * 1e6:.0f} | "
                     f"{measured * 1e-6 / sequential:.2f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
