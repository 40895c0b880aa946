#!/usr/bin/env bash
# Inter-token latency under landing KV traffic on one GPU (issue 6, end-to-end form):
# kvstream-prefill and kvstream-decode as two processes on the same GPU (CUDA backend, device
# pools, cuda_ipc), driven by `kvstream bench itl`: S steady streams decode while L clients keep
# N-token prompts landing (max_tokens 1, the same prompt each time: the prefill's prompt cache
# writes it without computing, so the prefill's compute stays off the GPU and only the KV
# traffic competes with decode). Configurations, in one call:
#   A  prefill unpaced:  phases idle and landing, alternated for ROUNDS rounds
#   B  prefill restarted with itl_target_ms = ITL_SLOWDOWN x A's idle ITL p50 (itl_idle_step_ms =
#      that p50, itl_device_bw_bytes_per_s = DEVICE_BW, itl_hbm_bytes_per_byte = ITL_K), or with
#      PACE_BYTES_PER_S when set: idle and landing again
#   D  (DECODE_TARGET=1, default) B's prefill, and the decode restarted with the same
#      itl_target_ms: landed prompts join a decode step only while it stays within the target
#   C  (when the budget allows and PACE_FRACTION > 0) prefill paced at PACE_FRACTION x the rate
#      the landing reached unpaced in A: idle and landing
# The decode daemon runs throughout A and B (it handshakes again with each restarted prefill); D
# restarts it.
#
#   usage (repo root of the GPU machine): bash bench/run_itl_gpu.sh [BIN_DIR]
#   BIN_DIR holds kvstream, kvstream-prefill, kvstream-decode.
#   Output under $OUT (default ./out): machine.txt, bench.log (the tables), itl_gpu.jsonl (every
#   JSON line, labelled pacing=off / pacing=itl / pacing=rate), daemons.log (log tails),
#   summary.txt (what ran, the paced rates, the tables).
#   Knobs (env): MODEL, TRANSPORT, DEVICE (or PREFILL_DEVICE and DECODE_DEVICE), BACKEND (cuda; cpu to try the script without a GPU),
#     STREAMS, STREAM_LEN, STREAM_MAX, LANDING_CLIENTS, LANDING_LEN, ROUNDS, PHASE_S, WARMUP_S,
#     SETTLE_MS, MAX_POSITION, ITL_SLOWDOWN, DEVICE_BW, ITL_K, PACE_BYTES_PER_S, PACE_FRACTION, DECODE_TARGET,
#     STEP_TIMEOUT (s per bench run), TOTAL_BUDGET (s for the whole script), EXTRA_DAEMON_FLAGS,
#     MPS (1: both daemons as clients of an MPS server this script starts and stops).
set -uo pipefail
B=${1:-.devbuild/itl}
MODEL=${MODEL:-llama-3-8b}
TRANSPORT=${TRANSPORT:-cuda_ipc}
DEVICE=${DEVICE:-0}
PREFILL_DEVICE=${PREFILL_DEVICE:-$DEVICE}   # two GPUs: prefill on one, decode on the other
DECODE_DEVICE=${DECODE_DEVICE:-$DEVICE}
BACKEND=${BACKEND:-cuda}
STREAMS=${STREAMS:-32}
STREAM_LEN=${STREAM_LEN:-4096}
STREAM_MAX=${STREAM_MAX:-3000}
LANDING_CLIENTS=${LANDING_CLIENTS:-4}
LANDING_LEN=${LANDING_LEN:-16384}
ROUNDS=${ROUNDS:-3}
PHASE_S=${PHASE_S:-4}
WARMUP_S=${WARMUP_S:-2}
SETTLE_MS=${SETTLE_MS:-300}
MAX_POSITION=${MAX_POSITION:-32768}
ITL_SLOWDOWN=${ITL_SLOWDOWN:-1.2}
DEVICE_BW=${DEVICE_BW:-4.3e12}   # H200 cudaMemcpy D2D, bytes read + written per s (device README)
ITL_K=${ITL_K:-2}                # HBM bytes per landed byte: a copy within one GPU
PACE_BYTES_PER_S=${PACE_BYTES_PER_S:-}
PACE_FRACTION=${PACE_FRACTION:-0}
DECODE_TARGET=${DECODE_TARGET:-1}  # D: the decode also gets itl_target_ms (join budget)
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
TOTAL_BUDGET=${TOTAL_BUDGET:-290}
PORT=${PORT:-46100}
# $B and $OUT made absolute, $TMP, MPS (bench/gpu_mps.sh), elapsed, log, $OUT/machine.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib_device.sh"

# Pools: decode holds every stream's prompt + max_tokens and every landing prompt at once
# (2 MiB per block for llama-3-8b); the prefill caches the streams' and the landing prompt.
blocks() { echo $(( ($1 + 15) / 16 )); }
DECODE_POOL=$(( STREAMS * $(blocks $((STREAM_LEN + STREAM_MAX))) + LANDING_CLIENTS * $(blocks $((LANDING_LEN + 1))) + 64 ))
CACHE_BLOCKS=$(( $(blocks "$STREAM_LEN") + $(blocks "$LANDING_LEN") + 8 ))
PREFILL_POOL=$(( CACHE_BLOCKS + $(blocks "$LANDING_LEN") + 64 ))
MAX_BATCH=$(( STREAMS + LANDING_CLIENTS + 8 ))
# shellcheck disable=SC2206
extra=(${EXTRA_DAEMON_FLAGS:-})
common=(--model "$MODEL" --backend "$BACKEND" --device "$DEVICE" --transport "$TRANSPORT"
        --max_position "$MAX_POSITION" --request_timeout_ms 600000 "${extra[@]}")

PID_P=""
PID_D=""
stop_pid() {
  local p=$1
  [[ -z "$p" ]] && return
  kill -TERM "$p" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null
  wait "$p" 2>/dev/null
}
wait_port() {  # file pid
  for _ in $(seq 1 600); do
    [[ -s "$1" ]] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
spawn_prefill() {  # tag, extra flags...
  local tag=$1
  shift
  rm -f "$TMP/prefill.port"
  "$B/kvstream-prefill" "${common[@]}" --device "$PREFILL_DEVICE" --pool_blocks "$PREFILL_POOL" \
    --prompt_cache_blocks "$CACHE_BLOCKS" --log_level info "$@" \
    --listen "127.0.0.1:$PORT" --port_file "$TMP/prefill.port" > "$TMP/prefill_$tag.log" 2>&1 &
  PID_P=$!
}
start_prefill() { spawn_prefill "$@"; wait_port "$TMP/prefill.port" "$PID_P"; }
run_bench() {  # label
  local label=$1 left step
  left=$(( TOTAL_BUDGET - $(elapsed) - 10 ))
  step=$(( left < STEP_TIMEOUT ? left : STEP_TIMEOUT ))
  # A run needs the prime, the streams' start and every phase: do not start one that cannot end.
  local need
  need=$(python3 -c "print(int(15 + $WARMUP_S + 2 * $ROUNDS * $PHASE_S))")
  if (( step < need )); then
    log "bench itl $label: skipped, ${step}s left of the ${need}s it needs"
    return 1
  fi
  log "bench itl $label (timeout ${step}s)"
  echo "=== $label ===" >> "$OUT/bench.log"
  timeout -k 5 "$step" "$B/kvstream" bench itl --decode "127.0.0.1:$DPORT" --prefill "127.0.0.1:$PORT" \
    --streams "$STREAMS" --stream-prompt-len "$STREAM_LEN" --stream-max-tokens "$STREAM_MAX" \
    --stream-mode pipelined --stream-same-prompt --landing-clients "$LANDING_CLIENTS" \
    --landing-prompt-len "$LANDING_LEN" --rounds "$ROUNDS" --phase-s "$PHASE_S" \
    --settle-ms "$SETTLE_MS" --warmup-s "$WARMUP_S" --label "$label" \
    --json-out "$TMP/run.jsonl" >> "$OUT/bench.log" 2> "$TMP/bench_$label.err"
  local rc=$?
  tail -n 4 "$TMP/bench_$label.err" >> "$OUT/bench.log"
  echo "rc=$rc" >> "$OUT/bench.log"
  [[ -f "$TMP/run.jsonl" ]] && cat "$TMP/run.jsonl" >> "$OUT/itl_gpu.jsonl"
  cp "$TMP/run.jsonl" "$TMP/last.jsonl" 2>/dev/null
  rm -f "$TMP/run.jsonl"
  log "bench itl $label rc=$rc"
  return $rc
}
field() {  # jsonl phase python-expression-on-j
  python3 -c "
import json,sys
for l in open('$1'):
    j=json.loads(l)
    if j.get('kind')=='itl_phase' and j.get('phase')=='$2':
        print($3); break" 2>/dev/null
}
collect_logs() {
  for f in "$TMP"/prefill_*.log "$TMP/decode.log"; do
    [[ -f "$f" ]] || continue
    echo "=== $(basename "$f") ==="
    grep -E "paced at|handshake|error|ERROR|WARN| W | E |stopped|serving|KV pool" "$f" | tail -n 40
  done > "$OUT/daemons.log"
}

mps_start

log "$MODEL/$TRANSPORT: $STREAMS streams x $STREAM_LEN (+$STREAM_MAX), $LANDING_CLIENTS landing x $LANDING_LEN;"\
" pools decode $DECODE_POOL, prefill $PREFILL_POOL (cache $CACHE_BLOCKS) blocks; max_batch $MAX_BATCH"
spawn_decode() {  # extra flags...
  rm -f "$TMP/decode.port"
  "$B/kvstream-decode" "${common[@]}" --device "$DECODE_DEVICE" --pool_blocks "$DECODE_POOL" --max_batch "$MAX_BATCH" \
    --log_level warn --listen 127.0.0.1:0 --peer "127.0.0.1:$PORT" --port_file "$TMP/decode.port" "$@" \
    >> "$TMP/decode.log" 2>&1 &
  PID_D=$!
}
spawn_prefill A
spawn_decode
if ! wait_port "$TMP/prefill.port" "$PID_P" || ! wait_port "$TMP/decode.port" "$PID_D"; then
  log "daemons did not come up"
  collect_logs
  stop_pid "$PID_D"; stop_pid "$PID_P"
  exit 1
fi
DPORT=$(cat "$TMP/decode.port")
log "serving: prefill :$PORT (pid $PID_P), decode :$DPORT (pid $PID_D)"

run_bench pacing=off
idle_p50=$(field "$TMP/last.jsonl" idle "j['itl_ms']['p50']")
land_gbps=$(field "$TMP/last.jsonl" landing "j['landing_gbps']")
log "A: idle ITL p50 ${idle_p50:-?} ms, unpaced landing ${land_gbps:-?} GB/s"

if [[ -n "$idle_p50" && "$idle_p50" != "nan" ]]; then
  stop_pid "$PID_P"
  target=$(python3 -c "print(round($ITL_SLOWDOWN * $idle_p50, 4))")  # also D's decode target
  B_LABEL=pacing=itl
  [[ -n "$PACE_BYTES_PER_S" ]] && B_LABEL=pacing=rate
  if [[ -n "$PACE_BYTES_PER_S" ]]; then
    pflags=(--pace_bytes_per_s "$PACE_BYTES_PER_S")
  else
    pflags=(--itl_target_ms "$target" --itl_idle_step_ms "$idle_p50"
            --itl_device_bw_bytes_per_s "$DEVICE_BW" --itl_hbm_bytes_per_byte "$ITL_K")
  fi
  log "B: prefill restarted with ${pflags[*]}"
  if start_prefill B "${pflags[@]}"; then
    log "B: $(grep -o 'KV writes paced at [^(]*([^)]*)' "$TMP/prefill_B.log" | head -1)"
    run_bench "$B_LABEL"
  else
    log "B: prefill did not come up: $(tail -n 3 "$TMP/prefill_B.log")"
  fi
fi

# D: the same paced prefill, and the decode restarted with the same itl_target_ms: landed
# prompts join a step only while it stays within the target (decode/join_budget.h).
if [[ -n "${target:-}" && "$DECODE_TARGET" == 1 ]] && (( TOTAL_BUDGET - $(elapsed) > 60 )); then
  stop_pid "$PID_D"
  spawn_decode --itl_target_ms "$target"
  if wait_port "$TMP/decode.port" "$PID_D"; then
    DPORT=$(cat "$TMP/decode.port")
    log "D: decode restarted with --itl_target_ms $target (join budget), prefill as in B"
    run_bench "$B_LABEL+join"
  else
    log "D: decode did not come up: $(tail -n 3 "$TMP/decode.log")"
  fi
fi

if [[ -n "$land_gbps" && "$land_gbps" != "nan" && "$PACE_FRACTION" != 0 ]] &&
   (( TOTAL_BUDGET - $(elapsed) > 90 )); then
  rate=$(python3 -c "print(int($PACE_FRACTION * $land_gbps * 1e9))")
  stop_pid "$PID_P"
  log "C: prefill restarted with --pace_bytes_per_s $rate ($PACE_FRACTION x unpaced)"
  if start_prefill C --pace_bytes_per_s "$rate"; then
    log "C: $(grep -o 'KV writes paced at [^(]*([^)]*)' "$TMP/prefill_C.log" | head -1)"
    run_bench pacing=rate
  fi
else
  log "C: skipped ($(( TOTAL_BUDGET - $(elapsed) ))s left)"
fi

stop_pid "$PID_D"
stop_pid "$PID_P"
collect_logs
log "done in $(elapsed)s"
grep -E "^(=== |rc=|ITL of|phase |idle |landing |landing / idle)" "$OUT/bench.log" | tee -a "$OUT/summary.txt"
