#!/usr/bin/env bash
# GPU validation on a CUDA machine (the H200 of the device tool; not CI). Stages:
#   scripts/gpu-checks.sh kernels   Triton compile warm-up, then the GPU parity suite in three shards (324 s)
#   scripts/gpu-checks.sh parity-small  the parity suite at small sizes (V = 1000 and 32000, the row kinds x
#                                   modes among them), without memcheck: a first check of changed kernels
#   scripts/gpu-checks.sh sanitizer the parity suite (small sizes) and the split-walk cases under memcheck
#                                   (a stage of its own: run alongside it, the full parity suite
#                                   did not finish within one 10 min device call)
#   scripts/gpu-checks.sh lowering  CUDA exports of the head configs, rewritten graphs on the GPU
#   scripts/gpu-checks.sh dflash    CUDA exports of the tiny DFlash configs, their rewritten graphs
#                                   in the driver's loop against the ATen heads and the CPU program
#   scripts/gpu-checks.sh smoke     the Qwen3-sized CUDA export + one verify step, fused vs ATen head
#   scripts/gpu-checks.sh runtime   builds the CUDA C++ runner (scripts/build-cuda-runner.sh; ExecuTorch
#                                   v1.2.0 sources in $ET_SRC, default .et-src) and runs CUDA exports in
#                                   it against the CPU reference (tests/examples/test_cuda_runner_gpu.py).
#                                   By default the five fused exports, 3 compile jobs each (four: 253 s); all
#                                   side by side did not finish within a 10 min call. The other two in a
#                                   call of their own: DFLASH_RUNTIME_EXPORTS=sampling-f32-unfused,greedy-cpu;
#                                   a Qwen3.5 hybrid target: DFLASH_RUNTIME_EXPORTS=hybrid-f32 (~2 min); the
#                                   attention in pieces (4096-cell slots): sampling-f32-attn-pieces
#   scripts/gpu-checks.sh runner-bench  a CUDA export (default qwen3-smoke-sampling-cuda; --config, --prompt-max ...) timed in the
#                                   C++ runner, max_owners owners ($OUT/RUNNER.md)
#   scripts/gpu-checks.sh profile   after runner-bench in the same call: the runner's decoding steps' kernels
#                                   under Nsight Compute (64 greedy owners, 17 new tokens: the first step 16
#                                   rows an owner, then an owner's tokens left, 15 down to 1, with the random
#                                   drafter; PROFILE_PROMPT / PROFILE_PROMPT_MAX: prompt lengths, default 16;
#                                   prefill left out by the runner's --profile-steps), by kind ($OUT/PROFILE.md)
#                                   and each call by GEMMs / attention / heads / other ($OUT/CALLS.md)
#   scripts/gpu-checks.sh bench     the head benchmark ($OUT/RESULTS.md, then RESULTS.2.md ...; copy to benchmarks/); its
#                                   options pass through: --kinds --quick (issue #25's table), --empty-launches,
#                                   --breakdown, --drafts accepted (every draft the target's own token)
#   scripts/gpu-checks.sh launches  each launch of one dflash_verify call under Nsight Compute, on flat
#                                   and peaked top-p rows and temperature rows ($OUT/LAUNCHES.md)
#   scripts/gpu-checks.sh stalls    where the sample select's launches stall: Nsight Compute's PC sampling per
#                                   SASS instruction on one dflash_verify call over flat top-p 0.9 rows, and
#                                   the launches' cubins (line info) ($OUT/stalls/: parse offline)
#   scripts/gpu-checks.sh phases    the sample select's steps per row, timed by a patched copy of the kernels
#                                   (clock64 around each step: benchmarks/select_phases.py; $OUT/PHASES.md)
#   scripts/gpu-checks.sh occupancy dflash_verify under launch variants of the select's begin and rounds
#                                   launches (maxnreg, rows a program: benchmarks/select_occupancy.py;
#                                   --quick, --variants; $OUT/OCCUPANCY.md)
#   scripts/gpu-checks.sh attention dflash::cached_attention at a verify step's shapes (16 rows an owner, 15,
#                                   then one: decoding), max_seq_len 2k-32k, against its floor (--reference: and
#                                   the models' reference) ($OUT/ATTENTION.md)
#   scripts/gpu-checks.sh chain 570 kernels "bench --kinds --quick" phases   stages in turn within one call's
#                                   seconds (each bounded by the time left; one that does not fit is named)
#   scripts/gpu-checks.sh detach "stage [options]"   a stage longer than one device call (the 32k export):
#                                   started in a process session of its own (setsid), which the device
#                                   tool leaves running after the call returns, until the machine goes
#                                   back; its $OUT and log in $DETACHED (default /tmp/detached). One at a
#                                   time. Raise the stage's own limit (RUNTIME_TIMEOUT=1500 for runner-bench)
#   scripts/gpu-checks.sh wait SECONDS   waits up to SECONDS for the detached stage, then copies its $OUT and
#                                   log into this call's $OUT; call it again, at once (an idle machine goes
#                                   back within a minute), until it says "done"
#   scripts/gpu-checks.sh count-pass the select's count pass alone (top-k's first pass from an element bound),
#                                   with and without its list, x floor, bf16 and fp32 ($OUT/COUNT_PASS.md;
#                                   benchmarks/bench_count_pass.py, --tree DIR: another tree's kernels beside)
#   scripts/gpu-checks.sh sample-select  issue #25's sample select: each stage's time, x floor, on flat,
#                                   power-law and peaked rows, bf16 and fp32, top-p 0.9 / 0.99, top-k 1000
#                                   ($OUT/SAMPLE_SELECT.md)
# That machine has no network: ExecuTorch 1.2.0 comes as wheels in .whl/ (../shared/tools/device-wheels.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/out/gpu}"
mkdir -p "$OUT" /tmp/pkg
ln -sfn "$PWD" /tmp/pkg/dflash_et  # the package maps the repo root to dflash_et
if [[ -d .whl ]]; then  # once per machine: stages may run side by side
  if mkdir /tmp/site.lock 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    touch /tmp/site.lock/done
  fi
  while [[ ! -e /tmp/site.lock/done ]]; do sleep 1; done
  export PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

warm() {  # compile one family of kernel variants (Triton caches them for the later runs)
  python3 - "$1" "$2" <<'PY'
import sys, torch
from dflash_et import kernels  # noqa: F401
from dflash_et.export import cases
vocab, dtype = int(sys.argv[1]), getattr(torch, sys.argv[2])
g = torch.Generator().manual_seed(0)
inp = {k: v.cuda() for k, v in cases.verify_case(g, vocab, 32, 8, dtype).items()}
args = [inp[k] for k in cases.VERIFY_INPUTS]
torch.ops.dflash.dflash_verify(*args)
torch.ops.dflash.dflash_verify_argmax(*args[:3])
s = {k: v.cuda() for k, v in cases.sample_case(g, vocab, 16, dtype).items()}
torch.ops.dflash.sample_rows(**s)
torch.cuda.synchronize()
print("warm", vocab, dtype)
PY
}

build_runner() {  # the CUDA C++ runner into $runner (ExecuTorch v1.2.0 sources: $ET_SRC, default .et-src)
  local start
  start=$(date +%s)
  runner=$(scripts/build-cuda-runner.sh "${ET_SRC:-.et-src}" /tmp/cuda-runner 2>"$OUT/runtime-build.log") \
    || { tail -40 "$OUT/runtime-build.log"; exit 1; }
  echo "CUDA runner built in $(( $(date +%s) - start )) s: $runner"
}

case "${1:-}" in
kernels)
  for v in 1000 32000; do for d in float32 bfloat16; do warm $v $d & done; done; wait
  # Three shards side by side (the plain-PyTorch judge is most of the time, on the host's cores;
  # one after the other, the 13 cases did not finish within one 10 min device call).
  shards=("dtype0-151936 or dtype0-262144" "dtype1-151936 or dtype1-262144")
  shards+=("not (${shards[0]} or ${shards[1]})")
  shard() { timeout 480 python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "${shards[$1]}" \
    >"$OUT/parity.$1.log" 2>&1; }
  # the two large-V shards together need more than an 80 GB H100 holds (CUDA out of memory, session 53):
  # one after the other there, beside the third
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if (( mib < 100000 )); then
    { shard 0; shard 1; } &
  else
    shard 0 & shard 1 &
  fi
  shard 2 &
  wait
  cat "$OUT"/parity.[012].log >"$OUT/parity.log"
  grep -E "V=|passed|failed|Error" "$OUT/parity.log"
  ;;
parity-small)
  DFLASH_GPU_SUITE=small timeout 400 python3 -m pytest -q -s -p no:cacheprovider \
    tests/kernels/test_kernels_gpu.py >"$OUT/parity-small.log" 2>&1
  grep -E "V=|passed|failed|Error" "$OUT/parity-small.log"
  ;;
sanitizer)
  # The small parity suite, and the sample select's crafted cases (test_cut_select.py: every
  # round of the select, lists written and read back by one program, on the GPU).
  DFLASH_GPU_SUITE=small timeout 560 compute-sanitizer --tool memcheck --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py tests/kernels/test_cut_select.py \
    -k "parity_on_gpu or cut_select" >"$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -3
  ;;
lowering)
  timeout 560 python3 -m pytest -q -s -p no:cacheprovider tests/lowering/test_lowering_gpu.py 2>&1 | tee "$OUT/lowering.log" \
    | grep -E "cuda \{|passed|failed|Error"
  ;;
dflash)
  timeout 540 python3 -m pytest -q -s -p no:cacheprovider tests/lowering/test_dflash_cuda_gpu.py 2>&1 | tee "$OUT/dflash.log" \
    | grep -E "^export|^greedy|^sampling|^float32|^bfloat16|passed|failed|Error"
  ;;
smoke)
  timeout 560 python3 benchmarks/bench_dflash_step.py --output-dir /tmp/smoke --out "$OUT/SMOKE.md" 2>&1 | tail -30
  ;;
runtime)
  build_runner
  fused=greedy-f32,greedy-f32-zeros,sampling-f32,sampling-bf16,sampling-f32-attn
  export DFLASH_RUNTIME_EXPORTS="${DFLASH_RUNTIME_EXPORTS:-$fused}"
  export DFLASH_EXPORT_JOBS="${DFLASH_EXPORT_JOBS:-3}"
  DFLASH_CUDA_RUNNER=$runner DFLASH_TIMING_OUT="$OUT/runtime-timing.yaml" DFLASH_LOG_DIR="$OUT" \
    timeout "${RUNTIME_TIMEOUT:-540}" python3 -m pytest -q -s -p no:cacheprovider tests/examples/test_cuda_runner_gpu.py "${@:2}" 2>&1 \
    | tee "$OUT/runtime.log" | grep -E "^export|^float32|zero buffers|^bfloat16|^shared|^private|^CPU|drafts identical|: exit|passed|failed|Error|_(f32|bf16) "
  ;;
runner-bench)
  build_runner
  timeout "${RUNTIME_TIMEOUT:-560}" python3 benchmarks/bench_cuda_runner.py --runner "$runner" \
    --output-dir /tmp/runner-bench --out "$OUT/RUNNER.md" "${@:2}" 2>&1 | tail -30
  ;;
profile)
  build_runner
  dir="${PROFILE_DIR:-/tmp/runner-bench}"
  [[ -f "$dir/model.pte" ]] || { echo "profile: no export in $dir: run runner-bench first, in the same call"; exit 1; }
  # prompts of PROFILE_PROMPT tokens, or drawn from PROFILE_PROMPT .. PROFILE_PROMPT_MAX (long contexts: the
  # runner's --profile-steps keeps their prefill out of the profile)
  python3 -c "
import random
new, short = ${PROFILE_NEW:-17}, ${PROFILE_PROMPT:-16}
long = max(short, ${PROFILE_PROMPT_MAX:-0})
r = random.Random(0)
for i in range(64):
    n = r.randint(short, long)
    print('prompt=' + ','.join(str(r.randrange(1000)) for _ in range(n)) + f':max_new={new}:temperature=0.0:top_k=0:top_p=1.0:seed={i}:join=0')
" >/tmp/profile.owners
  timeout "${PROFILE_TIMEOUT:-480}" ncu --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --print-units base --csv --log-file "$OUT/ncu.csv" \
    "$runner" --program "$dir/model.pte" --data "$dir/aoti_cuda_blob.ptd" --owners /tmp/profile.owners \
    --profile-steps >/dev/null 2>"$OUT/ncu.err"
  echo "ncu exit $?"; tail -3 "$OUT/ncu.err"
  python3 benchmarks/ncu_summary.py "$OUT/ncu.csv" --out "$OUT/PROFILE.md" | head -40
  python3 benchmarks/ncu_summary.py "$OUT/ncu.csv" --calls --out "$OUT/CALLS.md" | head -8  # (the step broken down)
  ;;
bench)
  out="$OUT/RESULTS.md" n=1  # (a second bench in one chain: RESULTS.2.md)
  while [[ -e "$out" ]]; do n=$((n + 1)); out="$OUT/RESULTS.$n.md"; done
  timeout 560 python3 benchmarks/bench_verify.py "${@:2}" --out "$out" 2>&1 | tail -60
  ;;
launches)
  # each launch of one dflash_verify call (64 x 16 rows, V = 151936 bf16) under Nsight Compute:
  # flat top-p 0.9, peaked top-p 0.9, peaked T 0.8 (the sample select's stages one by one)
  n=0
  for case in "+top-p 0.9|--flat" "+top-p 0.9|" "temp 0.8|"; do
    n=$((n + 1)); mode=${case%%|*}; flag=${case#*|}
    # shellcheck disable=SC2086  # ($flag: one word or none)
    timeout 170 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/launches.$n.csv" \
      python3 benchmarks/bench_verify.py --once "$mode" $flag >/dev/null 2>&1
    echo "## $mode $flag (ncu exit $?)"
    python3 benchmarks/ncu_summary.py "$OUT/launches.$n.csv" --last 9
  done | tee "$OUT/LAUNCHES.md"
  ;;
stalls)
  # the select's four launches of the first dflash_verify call (64 x 16 flat rows, V = 151936 bf16, top-p 0.9),
  # each instruction's warp-state samples; the cubins map addresses to Python lines (nvdisasm -g)
  mkdir -p "$OUT/stalls/cubin"
  cache="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
  timeout 420 ncu --clock-control none -k regex:verify_filtered_kernel -c 4 --section SourceCounters \
    --section WarpStateStats --section LaunchStats --section Occupancy --import-source yes -f -o /tmp/stalls \
    python3 benchmarks/bench_verify.py --once "+top-p 0.9" --flat > "$OUT/stalls/ncu.log" 2>&1
  echo "ncu exit $?"; tail -3 "$OUT/stalls/ncu.log"
  ncu -i /tmp/stalls.ncu-rep --csv --page details > "$OUT/stalls/details.csv" 2>&1
  for view in sass cuda,sass; do
    ncu -i /tmp/stalls.ncu-rep --csv --page source --print-source "$view" 2>&1 \
      | gzip > "$OUT/stalls/source.${view/,/-}.csv.gz"
  done
  find "$cache" -name 'verify_filtered_kernel.cubin' | while read -r f; do
    d=$(basename "$(dirname "$f")")
    cp "$f" "$OUT/stalls/cubin/$d.cubin"; cp "${f%.cubin}.json" "$OUT/stalls/cubin/$d.json"
  done
  ls -la "$OUT/stalls" "$OUT/stalls/cubin" | head -20
  grep -E "Duration|Registers|Achieved Occupancy" "$OUT/stalls/details.csv" | head -20
  ;;
phases)
  timeout 300 python3 benchmarks/select_phases.py --out "$OUT/PHASES.md" 2>&1 | tail -120
  ;;
occupancy)
  timeout 570 python3 benchmarks/select_occupancy.py "${@:2}" 2>&1 | tee "$OUT/OCCUPANCY.md" | tail -60
  ;;
attention)
  timeout 560 python3 benchmarks/bench_attention.py "${@:2}" --out "$OUT/ATTENTION.md" 2>&1 | tail -30
  ;;
count-pass)
  # the select's count pass alone, with and without its list, beside the floor; --tree DIR (a copy of
  # another commit's kernels/, e.g. under .probe/, carried) times that tree's side by side
  for dtype in bfloat16 float32; do
    timeout 200 python3 benchmarks/bench_count_pass.py --dtype "$dtype" "${@:2}"
  done 2>&1 | tee "$OUT/COUNT_PASS.md" | grep -v "^$" | tail -40
  ;;
sample-select)
  for dtype in bfloat16 float32; do
    for mode in "--top-p 0.9" "--top-p 0.99" "--top-k 1000"; do
      # shellcheck disable=SC2086  # (mode: two words)
      timeout 280 python3 benchmarks/bench_sample_select.py --dtype "$dtype" $mode "${@:2}"
    done
  done 2>&1 | tee "$OUT/SAMPLE_SELECT.md" | grep -v "^$" | tail -80
  ;;
detach)
  detached="${DETACHED:-/tmp/detached}"
  [[ -n "${2:-}" ]] || { echo "detach: give the stage and its options as one argument" >&2; exit 2; }
  if [[ -e "$detached/pid" && ! -e "$detached/rc" ]] && kill -0 "$(cat "$detached/pid")" 2>/dev/null; then
    echo "detach: a stage is still running ($(cat "$detached/stage")): scripts/gpu-checks.sh wait SECONDS" >&2; exit 1
  fi
  rm -rf "$detached"; mkdir -p "$detached/out"
  echo "$2" > "$detached/stage"
  # shellcheck disable=SC2086  # (a stage and its options: words)
  OUT="$detached/out" setsid bash -c 'bash "$0" "${@:2}" > "$1/log" 2>&1; echo $? > "$1/rc"' \
    "${BASH_SOURCE[0]}" "$detached" $2 < /dev/null > /dev/null 2>&1 &
  echo $! > "$detached/pid"
  echo "detached: $2 (pid $!, log $detached/log)"
  ;;
wait)
  detached="${DETACHED:-/tmp/detached}"
  [[ -e "$detached/stage" ]] || { echo "wait: no detached stage (scripts/gpu-checks.sh detach \"stage ...\")" >&2; exit 2; }
  budget=${2:?wait: give the seconds}
  start=$(date +%s)
  while [[ ! -e "$detached/rc" ]] && (( $(date +%s) - start < budget )); do
    kill -0 "$(cat "$detached/pid")" 2>/dev/null || break  # (gone without an exit status: killed)
    sleep 5
  done
  cp -r "$detached/out/." "$OUT/" 2>/dev/null; cp "$detached/log" "$OUT/detached.log" 2>/dev/null
  tail -40 "$detached/log" 2>/dev/null
  if [[ -e "$detached/rc" ]]; then
    rc=$(cat "$detached/rc"); echo "== detached $(cat "$detached/stage"): done, exit $rc"; exit "$rc"
  elif kill -0 "$(cat "$detached/pid")" 2>/dev/null; then
    echo "== detached $(cat "$detached/stage"): running after $(( $(date +%s) - start )) s more: wait again"
  else
    echo "== detached $(cat "$detached/stage"): gone without an exit status (killed?)"; exit 1
  fi
  ;;
chain)
  # stages one after the other within one device call: chain SECONDS "stage [options]" ...; each stage
  # bounded by the seconds left, a stage skipped (and named) when fewer than 30 are left
  budget=${2:?chain: give the seconds, then the stages}
  start=$(date +%s)
  for st in "${@:3}"; do
    left=$(( budget - ($(date +%s) - start) ))
    if (( left < 30 )); then echo "== $st: skipped ($left s left)"; continue; fi
    echo "== $st ($left s left)"
    # shellcheck disable=SC2086  # (a stage and its options: words)
    timeout "$left" bash "${BASH_SOURCE[0]}" $st 2>&1 | tail -80
  done
  echo "== chain done in $(( $(date +%s) - start )) s"
  ;;
*) echo "usage: scripts/gpu-checks.sh kernels|parity-small|sanitizer|lowering|dflash|smoke|runtime|runner-bench|profile|bench|launches|stalls|phases|occupancy|attention|count-pass|sample-select [options]" >&2
   echo "       scripts/gpu-checks.sh detach \"stage [options]\"; scripts/gpu-checks.sh wait SECONDS   (past one call)" >&2
   echo "       scripts/gpu-checks.sh chain SECONDS \"stage [options]\" ...   (stages in turn within SECONDS)" >&2; exit 2 ;;
esac
