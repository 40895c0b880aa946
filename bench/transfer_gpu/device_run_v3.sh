#!/usr/bin/env bash
# One device sitting for the third CUDA IPC pass (block-table kernel, early notifications with
# GPU-side waits); everything lands in $OUT/all.tgz. Steps run while the wall budget lasts
# (BUDGET seconds, default 285; each step's timeout is cut to what is left):
#   tests.log           transport_gpu_unit_test, scatter_copy_gpu_test, transport_gpu_test,
#                       landed_event_gpu_test (early notifications, writer SIGKILLed mid-copy),
#                       daemons_gpu_test (cuda_ipc: disaggregated tokens == colocated)
#   scatter_bench.*     the kernels alone: packed-run (param:) vs block-table (block:) vs D2D,
#                       llama-3-8b / llama-2-7b at 4k and llama-3-8b at 16k tokens
#   transfer_gpu.*      cuda_ipc (block table) vs cuda_ipc_packed (previous path) vs
#                       cuda_ipc_memcpy (vs cuda_ipc_early: early notifications, at 4k), each
#                       against cudaMemcpy D2D of the same bytes, same run
#   ttft_off/, ttft_on/ run_ttft_gpu.sh, llama-3-8b over cuda_ipc at 4k and 16k, decode with
#                       gpu_landed_wait off / on
# usage (GPU machine, repo root): bash <dir>/device_run_v3.sh <dir-with-binaries> <libs-dir>
set -u
B=${1:-.devbuild/ipc3}
L=${2:-.devlibs-ipc3}
B=$(cd "$B" && pwd)
OUT=${OUT:-out}
BUDGET=${BUDGET:-285}
mkdir -p "$OUT/r"
R=$(cd "$OUT/r" && pwd)
source "$L/env.sh"
export KVSTREAM_LOG_LEVEL=${KVSTREAM_LOG_LEVEL:-warn}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# step_t WANT: the timeout for a step that wants WANT s, or 0 when less than 10 s would be left.
step_t() { local left=$(( BUDGET - $(el) - 8 )); (( left < 10 )) && { echo 0; return; }; echo $(( left < $1 ? left : $1 )); }
run() {  # run NAME WANT cmd...: logs to $R/NAME.log
  local name=$1 want=$2; shift 2
  local t; t=$(step_t "$want")
  if [[ $t == 0 ]]; then echo "== $name: SKIPPED (budget, t=$(el)s)" | tee -a "$R/steps.log"; return; fi
  echo "== $name (timeout ${t}s, t=$(el)s)" | tee -a "$R/steps.log"
  timeout -k 3 "$t" "$@" >> "$R/$name.log" 2>&1
  echo "rc=$? (t=$(el)s)" | tee -a "$R/steps.log" | tee -a "$R/$name.log" > /dev/null
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "cpus $(nproc) kernel $(uname -r)"
} > "$R/machine.txt" 2>&1
run tests 15 "$B/transport_gpu_unit_test" --gtest_brief=1
run tests 45 "$B/scatter_copy_gpu_test" --gtest_brief=1
run tests 45 "$B/transport_gpu_test"
run landed 45 "$B/landed_event_gpu_test"
export KVSTREAM_PREFILL_BIN="$B/kvstream-prefill" KVSTREAM_DECODE_BIN="$B/kvstream-decode"
# (info level: the test looks for the decode's "prefill computes on this GPU" line)
run daemons 60 env -u KVSTREAM_LOG_LEVEL "$B/daemons_gpu_test" --gtest_filter='*cuda_ipc*'
run scatter_bench 40 "$B/scatter_bench" --iters=15 --configs=t256u8 --long-blocks=1024 \
  --json="$R/scatter_bench.jsonl"
run transfer_gpu 50 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_packed,cuda_ipc_memcpy,cuda_ipc_early \
  --iters=20 --json="$R/transfer_gpu.jsonl"
run transfer_gpu 40 "$B/transfer_gpu" --backends=cuda_ipc,cuda_ipc_packed,cuda_ipc_memcpy \
  --models=llama-3-8b --tokens=16384 --iters=10 --json="$R/transfer_gpu_16k.jsonl"
# TTFT off / on: 4k and 16k when the budget allows both runs (>= 120 s), else 4k only.
left=$(( BUDGET - $(el) - 5 ))
lens=${TTFT_LENS:-4096,16384}
(( left < 120 )) && lens=4096
for mode in off on; do
  left=$(( BUDGET - $(el) - 5 ))
  share=$left
  [[ $mode == off ]] && share=$(( left / 2 ))
  if (( share < 45 )); then echo "== ttft_$mode: SKIPPED (budget ${share}s, t=$(el)s)" | tee -a "$R/steps.log"; continue; fi
  flags=""
  [[ $mode == on ]] && flags="--gpu_landed_wait=true"
  echo "== ttft_$mode (lens $lens, budget ${share}s, t=$(el)s)" | tee -a "$R/steps.log"
  OUT="$R/ttft_$mode" SKIP_TEST=1 MODELS=llama-3-8b TRANSPORTS=cuda_ipc \
    LENS_llama_3_8b=$lens EXTRA_MODEL_FLAGS="--max-position 32768" \
    REQUESTS=${TTFT_REQUESTS:-1} EXTRA_DECODE_FLAGS="$flags" TOTAL_BUDGET=$(( share + 10 )) \
    STEP_TIMEOUT=$(( share - 12 )) timeout -k 3 $(( share + 3 )) bash "$B/run_ttft_gpu.sh" "$B" \
    >> "$R/ttft.log" 2>&1
  echo "rc=$? (t=$(el)s)" | tee -a "$R/steps.log"
done
echo "== done (t=$(el)s)" | tee -a "$R/steps.log"
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"
# Short summary for the call's output tail.
tar -xzOf "$OUT/all.tgz" r/tests.log r/landed.log r/daemons.log 2>/dev/null |
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED |^RESULT|^rc=|block-table launch capacity"
tar -xzOf "$OUT/all.tgz" r/scatter_bench.log 2>/dev/null | grep -E "^llama.*(d2d|param|block)" | head -40
tar -xzOf "$OUT/all.tgz" r/transfer_gpu.log 2>/dev/null | grep -E "^llama" | cut -c1-140
tar -xzOf "$OUT/all.tgz" r/ttft.log 2>/dev/null | grep -E "cuda_ipc|TTFT|rc=" | tail -20
tar -xzOf "$OUT/all.tgz" r/ttft_off/bench.log r/ttft_on/bench.log 2>/dev/null | grep -vE "^\s*$" | tail -30
