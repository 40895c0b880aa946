#!/usr/bin/env bash
# One device sitting for the host-staged path ("ucx_staged", issue 5), within BUDGET seconds:
#   tests.log        transport_gpu_test (staged: zero-copy and forced-put paths, killed-writer
#                    slot reclaim) and daemons_gpu_test (ucx_staged: tokens == colocated)
#   transfer.log     ucx_notify_rtt (round trip of one UCX notification: the staged path's
#                    per-chunk control latency), then
#                    transfer_gpu: pinned H2D / D2H / both at once, ucx_host, ucx_staged
#                    (zero-copy), ucx_staged_put (forced UCX put), side by side in one run
#   sweep.log        transfer_gpu: zero-copy chunk sizes (2-32 MiB), credit counts, a write cut
#                    into >= 4 chunks, and forced put at 32 MiB
#   chunk.txt        the chunk size the TTFT runs use (best mean ratio of the sweep)
#   ttft/            bench/run_ttft_gpu.sh: llama-2-7b and llama-3-8b at 4096 tokens over
#                    ucx_staged (that chunk size) and cuda_ipc; ttft_put/ the same over ucx_staged
#                    with zero-copy off, when the budget allows
#   *.jsonl          one JSON line per measurement
# usage (GPU machine, repo root): OUT=... bash staged_device_run.sh <bin-dir> <libs-dir>
set -u
B=$(cd "${1:?bin dir}" && pwd)
L=${2:?libs dir}
OUT=${OUT:-out}
BUDGET=${BUDGET:-315}
R="$OUT/r"
mkdir -p "$R"
source "$L/env.sh"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# cap WANT RESERVE: a step's timeout, at most WANT, leaving RESERVE seconds for what follows.
cap() {
  local l=$(( BUDGET - $(el) - $2 ))
  (( l > $1 )) && l=$1
  (( l < 5 )) && l=5
  echo "$l"
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "cpus $(nproc) kernel $(uname -r) uid $(id -u) ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null)"
} > "$R/machine.txt" 2>&1

export KVSTREAM_LOG_LEVEL=info
{
  echo "== transport_gpu_test (staged) t=$(el)"
  KVSTREAM_EXPECT_ZERO_COPY=1 timeout -k 3 "$(cap 70 230)" "$B/transport_gpu_test" \
    --gtest_filter='*ucx_staged*:*Staged*' 2>&1
  echo "rc=$?"
} > "$R/tests.log" 2>&1

{
  echo "== ucx_notify_rtt t=$(el)"
  KVSTREAM_LOG_LEVEL=warn timeout 15 "$B/ucx_notify_rtt" --iters=3000 2>&1 | tee "$R/rtt.jsonl"
  echo "== transfer_gpu main t=$(el)"
  timeout -k 3 "$(cap 75 160)" "$B/transfer_gpu" --backends=ucx_host,ucx_staged,ucx_staged_put \
    --iters=8 --json="$R/transfer.jsonl" 2>&1
  echo "rc=$?"
} > "$R/transfer.log" 2>&1

{
  echo "== transfer_gpu sweep t=$(el)"
  timeout -k 3 "$(cap 80 120)" "$B/transfer_gpu" \
    --backends=ucx_staged:c4,ucx_staged:c16,ucx_staged:c32,ucx_staged:c16:m4,ucx_staged:c8:k12,ucx_staged:c2,ucx_staged:c8:k3,ucx_staged_put:c32 \
    --iters=5 --json="$R/sweep.jsonl" 2>&1
  echo "rc=$?"
} > "$R/sweep.log" 2>&1

# The TTFT runs use the zero-copy chunk size with the best mean ratio over every case and both
# models (8 MiB = the default, from transfer.jsonl's ucx_staged rows, competes too).
python3 - "$R" > "$R/chunk.txt" 2>&1 <<'PY'
import json, sys, collections
r = sys.argv[1]
acc = collections.defaultdict(list)
for f in ("transfer.jsonl", "sweep.jsonl"):
    try:
        lines = open(f"{r}/{f}").read().splitlines()
    except OSError:
        continue
    for l in lines:
        try:
            j = json.loads(l)
        except ValueError:
            continue
        b = j.get("backend", "")
        if j.get("path") != "zero_copy" or ":k" in b or ":m" in b or "ratio" not in j:
            continue
        mib = int(b.split(":c")[1]) if ":c" in b else 8
        acc[mib].append(j["ratio"])
best, best_mean = 8, -1.0
for mib, v in sorted(acc.items()):
    m = sum(v) / len(v)
    print(f"chunk {mib} MiB: mean ratio {m:.3f} over {len(v)} rows")
    if len(v) >= 8 and m > best_mean:
        best, best_mean = mib, m
print(f"CHUNK {best}")
PY
CHUNK=$(awk '/^CHUNK/ {print $2}' "$R/chunk.txt")
CHUNK=${CHUNK:-8}

# The daemons log at their default level: daemons_gpu_test looks for an info line of theirs
# (KVSTREAM_LOG_LEVEL=warn here made it fail on the 2026-11-29 15:50 run, tokens equal).
unset KVSTREAM_LOG_LEVEL
{
  echo "== daemons_gpu_test (ucx_staged) t=$(el)"
  KVSTREAM_PREFILL_BIN="$B/kvstream-prefill" KVSTREAM_DECODE_BIN="$B/kvstream-decode" \
    timeout -k 3 "$(cap 45 100)" "$B/daemons_gpu_test" --gtest_filter='*ucx_staged*' 2>&1
  echo "rc=$?"
} >> "$R/tests.log" 2>&1

echo "== ttft (chunk $CHUNK MiB) t=$(el)" >> "$R/tests.log"
KVSTREAM_STAGED_CHUNK_MIB=$CHUNK OUT="$R/ttft" SKIP_TEST=1 MODELS="llama-2-7b llama-3-8b" \
  TRANSPORTS="ucx_staged cuda_ipc" LENS_llama_2_7b=4096 LENS_llama_3_8b=4096 \
  EXTRA_MODEL_FLAGS="--max-position 32768" REQUESTS=2 STEP_TIMEOUT=45 \
  TOTAL_BUDGET=$(( BUDGET - $(el) - 10 )) bash "$B/run_ttft_gpu.sh" "$B" > "$R/ttft.log" 2>&1
if (( BUDGET - $(el) > 70 )); then
  echo "== ttft, zero-copy off t=$(el)" >> "$R/tests.log"
  KVSTREAM_STAGED_ZERO_COPY=0 KVSTREAM_STAGED_CHUNK_MIB=$CHUNK OUT="$R/ttft_put" SKIP_TEST=1 \
    MODELS="llama-2-7b llama-3-8b" TRANSPORTS="ucx_staged" LENS_llama_2_7b=4096 LENS_llama_3_8b=4096 \
    EXTRA_MODEL_FLAGS="--max-position 32768" REQUESTS=2 STEP_TIMEOUT=40 \
    TOTAL_BUDGET=$(( BUDGET - $(el) - 8 )) bash "$B/run_ttft_gpu.sh" "$B" > "$R/ttft_put.log" 2>&1
fi
echo "== done t=$(el)" >> "$R/tests.log"
tar -C "$OUT" -czf "$OUT/all.tgz" r && rm -rf "$R"
tar -xzOf "$OUT/all.tgz" r/tests.log | grep -E "^\[  (PASSED|FAILED)|^rc=|FAILED |^== |path|round"
tar -xzOf "$OUT/all.tgz" r/chunk.txt
tar -xzOf "$OUT/all.tgz" r/transfer.log | grep -E "^(llama|rc=|== )"
tar -xzOf "$OUT/all.tgz" r/sweep.log | grep -E "^(llama|rc=|== )" | grep -v pinned
tar -xzOf "$OUT/all.tgz" r/ttft/summary.txt 2>/dev/null | tail -30
tar -xzOf "$OUT/all.tgz" r/ttft_put/summary.txt 2>/dev/null | tail -12
