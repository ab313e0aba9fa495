"""`dflash::sample_rows`: the sampling rule of SPEC.md on every row, fused.

Algorithm, three steps (no host synchronisation between their launches):

1. `chunk_kernel`, up to 16 programs per row (`launch.split_rows`): each reads one
   chunk of a greedy or temperature-only row (`scan_lanes`) and stores its max,
   argmax, finite count and mass. A few rows (sample_rows often has only one per
   owner) still fill the GPU this way. The first program of a top-k / top-p row
   reads it whole: stats and candidates (`filtered.filtered_pass`). A row whose filters
   keep one token (top-k 1, top-p <= 0) is greedy (`sampling_rule.decided_temperature`).
2. `sample_rows_kernel`, light instance, one program per row: combines the chunks;
   a greedy row's token is the argmax, a temperature row's is searched in the one
   chunk where the prefix mass crosses t (`light_token_from_chunks`).
3. `sample_rows_kernel`, FILTERED instance, one program per top-k / top-p row: the
   token from its candidates, sorted in registers (`filtered.filtered_token`), else the
   sample select begins (`cut_select.py`), and `sample_select_kernel` goes on with its
   pass, rounds and search launches (the pass split over 16 light programs a row: 64 rows
   fill the GPU).

Supported domain (`supports`): float32 / bfloat16 / float16 logits, 1 <= V <= 2^30,
CUDA tensors (or CPU under TRITON_INTERPRET=1). Reference: `export.heads.SampleRows`.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .launch import supports  # noqa: F401  (this head's domain: the one in launch.py)
from .common import uniform
from .filtered import filtered_pass, filtered_token
from .cut_select import (SELECT_PASS, SELECT_ROUNDS, SELECT_SEARCH, SPLIT_BITS, pass_item, pass_span_bits,
                         select_pass_part, select_rounds, select_search)
from .launch import (SELECT_WARPS, check_inputs, check_length, checked_scratch, launch_config, select_config,
                     select_programs, split_rows)
from .scratch import S_X_MAX, UNDECIDED, Scratch, load_f32, parts_of, scratch_width, stats_of
from .sampling_rule import chunk_stats, decided_temperature, is_light, light_token_from_chunks


@triton.jit
def chunk_kernel(logits_ptr, stride, temperature_ptr, top_k_ptr, top_p_ptr, part_ptr, work_ptr, vocab, chunk,
                 SPLITS: tl.constexpr, BLOCK: tl.constexpr, BUF: tl.constexpr, WORK: tl.constexpr,
                 STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    temperature = decided_temperature(tl.load(temperature_ptr + row), top_k, top_p)  # (light rows: theirs)
    row_ptr = logits_ptr + row * stride
    if is_light(temperature, top_k, top_p, vocab):
        chunk_stats(row_ptr, vocab, temperature, c, chunk, part_ptr + (row * SPLITS + c) * 4, BLOCK, STAGES)
    elif c == 0:  # a filtered row: one program reads it whole
        work = work_ptr + row * WORK
        filtered_pass(row_ptr, vocab, temperature, top_k, top_p, work, stats_of(work, BUF), BLOCK, STAGES, BUF)


@triton.jit
def sample_rows_kernel(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr,
                       seed_ptr, out_ptr, work_ptr, part_ptr, vocab, chunk, select_chunk, FILTERED: tl.constexpr,
                       BLOCK: tl.constexpr, BUF: tl.constexpr, WORK: tl.constexpr, SPLITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    temperature = decided_temperature(tl.load(temperature_ptr + row), top_k, top_p)  # (light rows: theirs)
    row_ptr = logits_ptr + row * stride
    light = is_light(temperature, top_k, top_p, vocab)
    u = uniform(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    if FILTERED:
        if not light:
            work = work_ptr + row * WORK
            stats = stats_of(work, BUF)
            token = filtered_token(row_ptr, vocab, temperature, top_k, top_p, u, work, stats, BLOCK, BUF, True, True)
            if token == UNDECIDED:  # the sample select's first rounds (`sample_select_kernel` goes on)
                token = select_rounds(row_ptr, vocab, temperature, top_k, top_p, u, load_f32(stats + S_X_MAX), work,
                                      stats, parts_of(work, BUF), select_chunk, BUF, False)
            tl.store(out_ptr + row, token)
    elif light:
        token = light_token_from_chunks(row_ptr, vocab, temperature, u, part_ptr + row * SPLITS * 4, chunk,
                                        SPLITS, BLOCK)
        tl.store(out_ptr + row, token)


@triton.jit
def sample_select_kernel(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, out_ptr,
                         work_ptr, vocab, select_chunk, num_rows, BUF: tl.constexpr, WORK: tl.constexpr,
                         STAGE: tl.constexpr, INLINE: tl.constexpr, LANES: tl.constexpr):
    """The sample select's later launches on the top-k / top-p rows the FILTERED instance left in
    it (`cut_select.py`): STAGE SELECT_ROUNDS (INLINE: until decided), SELECT_SEARCH (step 7),
    a program a row, or SELECT_PASS (item (row, c): parts c to c + span - 1 of the pass the row
    wants), whose fixed number of programs take the items (rows x SELECT_SPLITS / span spans:
    `cut_select.pass_span_bits` from the row count) in turn (as in `verify.verify_filtered_kernel`).
    A decided row's token goes to out."""
    if STAGE == SELECT_PASS:
        step = tl.num_programs(0)
        span_bits = pass_span_bits(num_rows, step)
        items = num_rows << (SPLIT_BITS - span_bits)
        for item in range(tl.program_id(0), items, step):  # (`_sample_stage` skips a light row's)
            row, part = pass_item(item, span_bits)
            _sample_stage(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, out_ptr,
                          work_ptr, vocab, select_chunk, row, part, 1 << span_bits, BUF, WORK, STAGE, INLINE, LANES)
    else:
        _sample_stage(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, out_ptr,
                      work_ptr, vocab, select_chunk, tl.program_id(0), 0, 1, BUF, WORK, STAGE, INLINE, LANES)


@triton.jit
def _sample_stage(logits_ptr, stride, position_ptr, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, out_ptr,
                  work_ptr, vocab, select_chunk, row, part, span, BUF: tl.constexpr, WORK: tl.constexpr,
                  STAGE: tl.constexpr, INLINE: tl.constexpr, LANES: tl.constexpr):
    """`sample_select_kernel`'s STAGE for one row (part, span: the pass's first part and their
    number)."""
    row = row.to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    if not is_light(temperature, top_k, top_p, vocab):  # (a light row's stats are never written)
        row_ptr = logits_ptr + row * stride
        work = work_ptr + row * WORK
        stats = stats_of(work, BUF)
        x_max = load_f32(stats + S_X_MAX)
        if STAGE == SELECT_PASS:
            select_pass_part(row_ptr, vocab, temperature, x_max, work, stats, parts_of(work, BUF), part, span,
                             select_chunk, BUF, LANES)
        else:
            u = uniform(tl.load(seed_ptr + row), tl.load(position_ptr + row))
            if STAGE == SELECT_SEARCH:
                token = select_search(row_ptr, vocab, temperature, u, x_max, stats, LANES)
            else:
                token = select_rounds(row_ptr, vocab, temperature, top_k, top_p, u, x_max, work, stats,
                                      parts_of(work, BUF), select_chunk, BUF, INLINE)
            if token != UNDECIDED:
                tl.store(out_ptr + row, token)


def launch(logits, position, temperature, top_k, top_p, seed, cap: int | None = None,
           block: int | None = None, scratch: Scratch | None = None):
    """`scratch`: one of `launch.scratch_for` with the same logits, cap and block, kept by the
    caller to look inside afterwards (by default a fresh one)."""
    n, vocab = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    light, heavy = launch_config(vocab, cap, block, logits.element_size())
    chunk, splits = split_rows(vocab, light.block)
    select_chunk, select_lanes = select_config(vocab, logits.element_size())
    width = scratch_width(heavy.buf)
    work = checked_scratch(scratch, logits, heavy.buf).work
    parts = torch.empty(n, splits, 4, dtype=torch.int64, device=logits.device)
    if n > 0:
        wrap_triton(chunk_kernel)[(n, splits)](
            logits, logits.stride(0), temperature, top_k, top_p, parts, work, vocab, chunk, SPLITS=splits,
            BLOCK=light.block, BUF=heavy.buf, WORK=width, STAGES=light.stages, num_warps=light.warps)
        for cfg, filtered in ((light, False), (heavy, True)):
            wrap_triton(sample_rows_kernel)[(n,)](
                logits, logits.stride(0), position, temperature, top_k, top_p, seed, out, work, parts, vocab,
                chunk, select_chunk, FILTERED=filtered, BLOCK=cfg.block, BUF=heavy.buf, WORK=width, SPLITS=splits,
                num_warps=cfg.warps)

        def select(stage, inline=False):  # one later stage of the select (pass and search: the light ones)
            grid = (select_programs(logits.device),) if stage == SELECT_PASS else (n,)
            light = stage in (SELECT_PASS, SELECT_SEARCH)
            wrap_triton(sample_select_kernel)[grid](
                logits, logits.stride(0), position, temperature, top_k, top_p, seed, out, work, vocab, select_chunk,
                n, BUF=heavy.buf, WORK=width, STAGE=stage.value, INLINE=inline, LANES=select_lanes,
                num_warps=SELECT_WARPS if light else heavy.warps)

        select(SELECT_PASS)
        select(SELECT_ROUNDS)  # (a row that wants another pass: the pass launch again, split over the GPU)
        select(SELECT_PASS)
        select(SELECT_ROUNDS, inline=True)  # (every row left decided: the design's bound)
        select(SELECT_SEARCH)
    return out


@triton_op("dflash::sample_rows", mutates_args={})
def sample_rows(
    logits: torch.Tensor,  # [N, V]
    position: torch.Tensor,  # [N] int64
    temperature: torch.Tensor,  # [N] float32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] float32
    seed: torch.Tensor,  # [N] int64
) -> torch.Tensor:  # [N] int64
    params = {"position": position, "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "seed": seed}
    check_inputs("sample_rows", logits, **params)
    for name, t in params.items():
        check_length("sample_rows", name, t, logits.shape[0], "N (logits rows)")
    return launch(logits, position, temperature, top_k, top_p, seed)


@sample_rows.register_fake
def _(logits, position, temperature, top_k, top_p, seed):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)

