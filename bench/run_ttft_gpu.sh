#!/usr/bin/env bash
# TTFT on GPUs: kvstream-prefill and kvstream-decode as two processes on the same GPU, or on two
# (PREFILL_DEVICE / DECODE_DEVICE) (CUDA backend, KV pools in device memory), driven by
# `kvstream bench ttft`, which runs pipelined,
# non-pipelined and colocated (its own in-process copy of the model, no transfer) side by side.
# One daemon pair per (model, transport); the GPU integration test first (unless SKIP_TEST=1).
#
#   usage (repo root of the GPU machine): bash bench/run_ttft_gpu.sh [BIN_DIR]
#   BIN_DIR holds kvstream, kvstream-prefill, kvstream-decode (and daemons_gpu_test).
#   Output under $OUT (default ./out), at most 6 files:
#     machine.txt, gpu_test.log, bench.log (the tables), ttft_gpu.jsonl (every JSON line, one
#     bench run after another), daemons.log (tails of the daemon logs), summary.txt.
#   Knobs (env): MODELS, TRANSPORTS, REQUESTS, WARMUP, MAX_NEW, LENS_<model with _ for ->,
#     STEP_TIMEOUT (s per bench run), TEST_TIMEOUT, TOTAL_BUDGET, MPS (1: both daemons as clients
#     of an MPS server started and stopped here, bench/gpu_mps.sh), DEVICE (or PREFILL_DEVICE and
#     DECODE_DEVICE for two GPUs), UCX_TLS (for ucx_staged),
#     BACKEND (cuda; cpu only to try the script on a machine without a GPU),
#     EXTRA_DECODE_FLAGS (e.g. "--first_step_after_load=false"; the default auto waits for the
#     whole load when both daemons share the GPU),
#     EXTRA_MODEL_FLAGS (given to both daemons and to the bench, e.g. "--max-position 32768" to run
#     prompts past a preset's own limit).
set -uo pipefail
B=${1:-.devbuild/gpuint}
MODELS=${MODELS:-"llama-3-8b llama-2-7b"}
TRANSPORTS=${TRANSPORTS:-"cuda_ipc ucx_staged"}
REQUESTS=${REQUESTS:-3}
WARMUP=${WARMUP:-1}
MAX_NEW=${MAX_NEW:-4}
DEVICE=${DEVICE:-0}
# Prefill and decode on different GPUs of the host (the bench's colocated model uses DECODE_DEVICE).
PREFILL_DEVICE=${PREFILL_DEVICE:-$DEVICE}
DECODE_DEVICE=${DECODE_DEVICE:-$DEVICE}
BACKEND=${BACKEND:-cuda}
STEP_TIMEOUT=${STEP_TIMEOUT:-100}
TEST_TIMEOUT=${TEST_TIMEOUT:-100}
# Wall-time budget of the whole script (s): a step starts only with >= 40 s left and its
# timeout is cut to what is left (minus time to stop the daemons).
TOTAL_BUDGET=${TOTAL_BUDGET:-270}
# Prompt lengths stay within each preset's max_position (llama-3-8b 8192, llama-2-7b 4096)
# minus the new tokens.
LENS_llama_3_8b=${LENS_llama_3_8b:-1024,4096,$((8192 - MAX_NEW))}
LENS_llama_2_7b=${LENS_llama_2_7b:-1024,2048,$((4096 - MAX_NEW))}
# $B and $OUT made absolute, $TMP, MPS (bench/gpu_mps.sh), elapsed, log, $OUT/machine.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib_device.sh"

mps_start

if [[ "${SKIP_TEST:-0}" != 1 && -x "$B/daemons_gpu_test" ]]; then
  log "daemons_gpu_test (timeout ${TEST_TIMEOUT}s)"
  KVSTREAM_PREFILL_BIN="$B/kvstream-prefill" KVSTREAM_DECODE_BIN="$B/kvstream-decode" \
    timeout -k 5 "$TEST_TIMEOUT" "$B/daemons_gpu_test" > "$OUT/gpu_test.log" 2>&1
  rc=$?
  echo "rc=$rc" >> "$OUT/gpu_test.log"
  log "daemons_gpu_test rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/gpu_test.log" | tr '\n' ' ')"
fi

PID_P=""
PID_D=""
stop_daemons() {
  for p in $PID_D $PID_P; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 1 100); do
    local alive=0
    for p in $PID_D $PID_P; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in $PID_D $PID_P; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  PID_P=""
  PID_D=""
}

port=46000
for model in $MODELS; do
  lens_var="LENS_${model//-/_}"
  lens=${!lens_var:-1024,4096}
  # Blocks for the longest prompt plus the new tokens, and a little more.
  maxlen=$(echo "$lens" | tr ',' '\n' | sort -n | tail -1)
  blocks=$(( (maxlen + MAX_NEW + 15) / 16 + 8 ))
  for tr in $TRANSPORTS; do
    tag="$model/$tr"
    left=$(( TOTAL_BUDGET - $(elapsed) - 15 ))
    if (( left < 40 )); then
      log "$tag: skipped, ${left}s of the budget left"
      continue
    fi
    step_timeout=$(( left < STEP_TIMEOUT ? left : STEP_TIMEOUT ))
    port=$((port + 1))
    rm -f "$TMP"/*.port
    common=(--model "$model" --backend "$BACKEND" --device "$DEVICE" --transport "$tr"
            --pool_blocks "$blocks" --log_level warn --request_timeout_ms 120000)
    # shellcheck disable=SC2206
    model_extra=(${EXTRA_MODEL_FLAGS:-})
    common+=("${model_extra[@]}")
    [[ $tr == ucx_staged && -n "${UCX_TLS:-}" ]] && common+=(--ucx_tls "$UCX_TLS")
    log "$tag: starting daemons (pool $blocks blocks each, prompts $lens)"
    "$B/kvstream-prefill" "${common[@]}" --device "$PREFILL_DEVICE" --listen "127.0.0.1:$port" \
      --port_file "$TMP/prefill.port" > "$TMP/prefill.log" 2>&1 &
    PID_P=$!
    # shellcheck disable=SC2086
    "$B/kvstream-decode" "${common[@]}" --device "$DECODE_DEVICE" ${EXTRA_DECODE_FLAGS:-} --listen 127.0.0.1:0 --peer "127.0.0.1:$port" \
      --port_file "$TMP/decode.port" > "$TMP/decode.log" 2>&1 &
    PID_D=$!
    ok=0
    for _ in $(seq 1 400); do
      [[ -s "$TMP/prefill.port" && -s "$TMP/decode.port" ]] && { ok=1; break; }
      kill -0 "$PID_P" 2>/dev/null && kill -0 "$PID_D" 2>/dev/null || break
      sleep 0.1
    done
    if [[ $ok != 1 ]]; then
      log "$tag: daemons did not come up"
    else
      dport=$(cat "$TMP/decode.port")
      log "$tag: serving (prefill :$port, decode :$dport); bench ttft (timeout ${step_timeout}s)"
      echo "=== $tag ===" >> "$OUT/bench.log"
      timeout -k 5 "$step_timeout" "$B/kvstream" bench ttft --decode "127.0.0.1:$dport" \
        --prefill "127.0.0.1:$port" --model "$model" "${model_extra[@]}" --backend "$BACKEND" --device "$DECODE_DEVICE" \
        --prompt-lens "$lens" --requests "$REQUESTS" --warmup "$WARMUP" \
        --max-new-tokens "$MAX_NEW" --modes pipelined,non-pipelined,colocated \
        --deadline-ms 60000 --json-out "$TMP/run.jsonl" >> "$OUT/bench.log" 2> "$TMP/bench.err"
      rc=$?
      tail -n 3 "$TMP/bench.err" | tr '\r' '\n' | tail -n 3 >> "$OUT/bench.log"
      echo "rc=$rc" >> "$OUT/bench.log"
      [[ -f "$TMP/run.jsonl" ]] && cat "$TMP/run.jsonl" >> "$OUT/ttft_gpu.jsonl"
      rm -f "$TMP/run.jsonl"
      log "$tag: bench rc=$rc"
    fi
    stop_daemons
    {
      echo "=== $tag prefill ==="
      tail -n 15 "$TMP/prefill.log"
      echo "=== $tag decode ==="
      tail -n 15 "$TMP/decode.log"
    } >> "$OUT/daemons.log"
  done
done
log "done in $(elapsed)s"
grep -E "^(=== |rc=|TTFT / ITL|(pipelined|non-pipelined|colocated) +[0-9]| *[0-9]+ \| )" "$OUT/bench.log" \
  | tee -a "$OUT/summary.txt"
