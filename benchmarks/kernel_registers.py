"""Compile every kernel variant the launchers produce for sm_90, without a GPU, and print
each one's registers, stack and spills (`cuobjdump -res-usage`), how many asynchronous copy
instructions its PTX holds (0: no loop was software-pipelined) and its shared memory in bytes
(with the registers, what sets the programs an SM: an H100 SM has 228 KB, less 1 KB a program;
the attention's 77,824 bytes allow 2). Not a test: a check to run
before spending GPU time (it catches what the interpreter does not: non-constexpr globals,
type mismatches in branches the test data never takes, register blow-ups).

    python benchmarks/kernel_registers.py [--vocab 151936] [--logits bf16] [--const-vocab --ttir]

Compiled as a real launch specializes them: pointers 16-byte aligned, and `stride`,
`vocab`, `chunk` divisible by 16 (true for V = 151936); without those hints the loads do
not vectorize and the counts mean nothing.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

from dflash_et.kernels import cached_attention, cut_select, delta_rows, greedy_rows, sample_rows, verify
from dflash_et.kernels.launch import (SELECT_WARPS, decide_config, filtered_rows_config, launch_config, prefix_chunks,
                                      select_config, split_rows)
from dflash_et.kernels.scratch import scratch_width

TARGET = GPUTarget("cuda", 90, 32)
# integer arguments divisible by 16 (as Triton's JIT and AOTInductor mark them at the heads' and attention's
# sizes: the attention's strides, so that its K / V loads are 16-byte async copies)
ALIGNED = ("stride", "vocab", "chunk", "select_chunk", "q_row", "q_head", "c_slot", "c_cell", "c_head")
FLOAT_PARAMS = ("temperature_ptr", "top_p_ptr")
ASM_DIR = None  # --asm
ONLY = ""  # --only
LAST_ERROR = []  # (the failures, for a debugging session)
CONSTANTS = {}  # --const-vocab
TTIR_ONLY = False  # --ttir
LOGITS = ("*bf16", 2), ("*fp16", 2), ("*fp32", 4)


def cuobjdump(kernel, flag: str) -> str:
    """Triton's bundled `cuobjdump FLAG` of the kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def resources(kernel) -> str:
    out = cuobjdump(kernel, "-res-usage")
    fields = dict(f.split(":", 1) for f in next(x for x in out.splitlines() if "REG" in x).split() if ":" in f)
    return " ".join(f"{k}:{fields.get(k, '?')}" for k in ("REG", "STACK", "LOCAL"))


def ttir_ops(source: ASTSource, warps: int) -> int:
    """Generate and verify the kernel's TTIR only, as torch's mutation analysis of a kernel
    launch does during AOTInductor export (`generate_ttir`: `make_ir`, then `verify`), and
    count its operations. The frontend is where a kernel fails on what that analysis passes
    as Python constants; the later stages (layouts, LLVM, ptxas) take nearly all of a full
    compile's time and play no part in it."""
    backend = make_backend(TARGET)
    options = backend.parse_options({"num_warps": warps})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(TARGET, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    if not module.verify():
        raise RuntimeError("the TTIR module does not verify")
    ops = 0

    def count(op):
        nonlocal ops
        ops += 1

    module.walk(count)
    return ops


# the sample select's launches as the heads make them: (STAGE, INLINE, warps; None: the filtered config's)
SELECT_STAGES = ((cut_select.SELECT_BEGIN.value, False, None), (cut_select.SELECT_ROUNDS.value, False, None),
                 (cut_select.SELECT_ROUNDS.value, True, None),
                 (cut_select.SELECT_PASS.value, False, SELECT_WARPS),
                 (cut_select.SELECT_SEARCH.value, False, SELECT_WARPS))


def stage_label(stage: int, inline: bool) -> str:
    name = {cut_select.SELECT_BEGIN.value: "begin", cut_select.SELECT_ROUNDS.value: "rounds",
            cut_select.SELECT_PASS.value: "pass", cut_select.SELECT_SEARCH.value: "search"}[stage]
    return name + " inline" if inline else name


def compile_one(label: str, fn, logits: str, constexprs: dict, warps: int, greedy: bool = False,
                types: dict | None = None, stages: int | None = None) -> bool:
    """`types`: argument types that differ from the defaults below (by name); `stages`: the
    launch's num_stages where it gives one (else Triton's default, as the launch)."""
    if ONLY not in label:
        return True
    constexprs = {**{k: v for k, v in CONSTANTS.items() if k in fn.arg_names}, **constexprs}
    names = fn.arg_names
    missing = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs and not p.has_default]
    if missing:
        print(f"FAIL {label}: no value for constexpr {missing}")
        return False
    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            consts[(i,)] = constexprs[name]
        elif name.endswith("_ptr"):
            float_param = name in FLOAT_PARAMS and not greedy  # the greedy op passes int64 stand-ins
            signature[name] = logits if name == "logits_ptr" else "*fp32" if float_param else "*i64"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i64" if name == "stride" else "i32"
            if name in ALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
        signature[name] = (types or {}).get(name, signature[name])
    source = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    try:
        if TTIR_ONLY:
            print(f"{label:48s} TTIR ops:{ttir_ops(source, warps)}")
            return True
        options = {"num_warps": warps, **({"num_stages": stages} if stages is not None else {})}
        kernel = triton.compile(source, target=TARGET, options=options)
    except Exception as e:  # report every failing variant, then fail
        print(f"FAIL {label}: {type(e).__name__}: {str(e)[-400:]}"); LAST_ERROR.append(e)
        return False
    ptx = kernel.asm["ptx"]
    copies = ptx.count("cp.async.ca") + ptx.count("cp.async.cg") + ptx.count("cp.async.bulk")
    print(f"{label:48s} {resources(kernel)} async-copies:{copies} smem:{kernel.metadata.shared}")
    if ASM_DIR:
        name = label.replace(" ", "_").replace("*", "").replace("=", "-")
        for kind in ("ttgir", "ptx"):
            with open(os.path.join(ASM_DIR, f"{name}.{kind}"), "w") as f:
                f.write(kernel.asm[kind])
        with open(os.path.join(ASM_DIR, f"{name}.sass"), "w") as f:
            f.write(cuobjdump(kernel, "-sass"))
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--asm", metavar="DIR", help="also write each variant's TTGIR, PTX and SASS there")
    parser.add_argument("--only", default="", metavar="TEXT", help="only the variants whose label holds TEXT")
    parser.add_argument("--const-vocab", action="store_true",
                        help="compile with vocab as a constant, as torch's mutation analysis of the kernels does "
                             "during AOTInductor export (a Python int there: no .to() on it)")
    parser.add_argument("--logits", choices=[name[1:] for name, _ in LOGITS], action="append",
                        help="only the variants for these logits dtypes (repeatable; default: every dtype)")
    parser.add_argument("--ttir", action="store_true",
                        help="stop after generating each variant's TTIR, as torch's mutation analysis does "
                             "(no registers: prints the TTIR's operation count)")
    args = parser.parse_args(argv)
    global ASM_DIR, ONLY, TTIR_ONLY
    ASM_DIR, ONLY, TTIR_ONLY = args.asm, args.only, args.ttir
    if ASM_DIR and TTIR_ONLY:
        parser.error("--asm needs the full compile, not --ttir")
    if args.const_vocab:
        CONSTANTS["vocab"] = args.vocab
    if ASM_DIR:
        os.makedirs(ASM_DIR, exist_ok=True)
    ok = True
    for logits, itemsize in LOGITS:
        if args.logits and logits[1:] not in args.logits:
            continue
        light, heavy = launch_config(args.vocab, itemsize=itemsize)
        work = scratch_width(heavy.buf)
        _, splits = split_rows(args.vocab, light.block)
        decide = decide_config(args.vocab, itemsize=itemsize)
        marked = filtered_rows_config(decide)
        for greedy, filtered in ((False, False), (True, False), (False, True)):
            cfg = marked if filtered else decide
            ok &= compile_one(
                f"verify_rows {logits} greedy={greedy} filtered={filtered}", verify.verify_rows_kernel, logits,
                dict(GREEDY=greedy, FILTERED=filtered, BLOCK=cfg.block, BUF=heavy.buf, WORK=work,
                     STAGES=cfg.stages, BLOCK_O=verify.BLOCK_O), cfg.warps, greedy)
        _, verify_splits = prefix_chunks(args.vocab, decide.block)
        for greedy in (False, True):
            ok &= compile_one(
                f"verify_accept {logits} greedy={greedy}", verify.verify_accept_kernel, logits,
                dict(GREEDY=greedy, BLOCK=decide.block, BUF=heavy.buf, WORK=work, SPLITS=verify_splits,
                     BLOCK_O=verify.BLOCK_O, BLOCK_J=verify.BLOCK_J), decide.warps, greedy)
        ok &= compile_one(f"greedy_rows {logits}", greedy_rows.greedy_rows_kernel, logits,
                          dict(BLOCK=decide.block, STAGES=decide.stages), decide.warps)
        _, select_lanes = select_config(args.vocab, itemsize)
        for stage, inline, warps in SELECT_STAGES:
            ok &= compile_one(
                f"verify_filtered {logits} {stage_label(stage, inline)}", verify.verify_filtered_kernel, logits,
                dict(BLOCK=heavy.block, BUF=heavy.buf, WORK=work, STAGE=stage, INLINE=inline, LANES=select_lanes),
                warps or heavy.warps)
        ok &= compile_one(f"sample_rows chunk {logits}", sample_rows.chunk_kernel, logits,
                          dict(SPLITS=splits, BLOCK=light.block, BUF=heavy.buf, WORK=work, STAGES=light.stages),
                          light.warps)
        for cfg, filtered in ((light, False), (heavy, True)):
            ok &= compile_one(
                f"sample_rows {logits} filtered={filtered}", sample_rows.sample_rows_kernel, logits,
                dict(FILTERED=filtered, BLOCK=cfg.block, BUF=heavy.buf, WORK=work, SPLITS=splits), cfg.warps)
        for stage, inline, warps in SELECT_STAGES[1:]:  # (the FILTERED instance above begins the select)
            ok &= compile_one(
                f"sample_select {logits} {stage_label(stage, inline)}", sample_rows.sample_select_kernel, logits,
                dict(BUF=heavy.buf, WORK=work, STAGE=stage, INLINE=inline, LANES=select_lanes), warps or heavy.warps)
        # issue #26's attention, at Qwen3-like heads (128 dims, 2 or 4 query heads per KV head): whole runs (a
        # 256-cell slot), runs in pieces (32k cells: the plan, the pieces, their combine)
        ints = {n: "i64" for n in ("q_row", "q_head", "c_slot", "c_cell", "c_head")}
        floats = {p: "*fp32" for p in ("m_ptr", "l_ptr", "acc_ptr")}
        for heads in (16, 32):
            whole, warps = cached_attention.launch_meta(torch.float32 if logits == "*fp32" else torch.bfloat16,
                                                        heads, 8, 128, 256)
            pieces = cached_attention.launch_meta(torch.float32 if logits == "*fp32" else torch.bfloat16,
                                                  heads, 8, 128, 32768)[0]
            tile = {k: whole[k] for k in ("GROUPS", "BLOCK_G", "BLOCK_R", "HEAD_DIM", "BLOCK_D", "BLOCK_N")}
            types = {**{p: logits for p in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}, **ints,
                     "scale": "fp64"}  # (as AOTInductor passes a Python float)
            ok &= compile_one(f"cached_attention {logits} G={whole['GROUPS']} whole",
                              cached_attention.cached_attention_kernel, logits, tile, warps,
                              stages=cached_attention.STAGES, types=types)
            ok &= compile_one(
                f"cached_attention {logits} G={whole['GROUPS']} pieces={pieces['SPLITS']}",
                cached_attention.cached_attention_pieces_kernel, logits,
                dict(tile, SPLITS=pieces["SPLITS"], SPLIT_CELLS=cached_attention.SPLIT_CELLS,
                     BLOCK_T=cached_attention.BLOCK_T), warps, stages=cached_attention.STAGES,
                types={**types, **floats, "count_ptr": "*i32"})
            ok &= compile_one(f"cached_attention combine {logits} G={whole['GROUPS']}", cached_attention.combine_kernel,
                              logits, {k: pieces[k] for k in cached_attention.COMBINE_META},
                              cached_attention.COMBINE_WARPS, types={"out_ptr": logits, **floats, "count_ptr": "*i32"})
        ok &= compile_one(f"cached_attention plan {logits}", cached_attention.cached_attention_plan_kernel, logits,
                          {"BLOCK_R": pieces["BLOCK_R"]}, cached_attention.PLAN_WARPS)  # (of the last head layout)
        # issue #27's recurrence at Qwen3.5's shapes (dk = dv = 128, K = 4; the model dtype follows the logits')
        model = logits if logits == "*fp32" else "*bf16"
        ok &= compile_one(
            f"delta_rows {logits}", delta_rows.delta_rows_kernel, logits,
            dict(K=4, RING=4, DK=128, DKP=128, DV=128, BV=delta_rows.BLOCK_V), 4,
            types={**{p: model for p in ("mixed_ptr", "a_ptr", "b_ptr", "weight_ptr", "a_log_ptr", "dt_bias_ptr",
                                         "windows_ptr", "windows_out_ptr")},
                   **{p: "*fp32" for p in ("states_ptr", "states_out_ptr", "core_ptr")}, "scale": "fp64"})
    print("all kernels compile" if ok else "some kernels failed to compile")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
