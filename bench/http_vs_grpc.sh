#!/usr/bin/env bash
# The HTTP front door against gRPC Generate at 64 concurrent streams (issue 18's targets: HTTP adds
# <= 0.3 ms p50 and <= 1 ms p99 to TTFT, <= 2% to ITL), same daemons, same run, one tool:
# `kvstream bench serve --url grpc://...` and `--url http://...` with the same flags and seeds.
# One prefill + one decode on one GPU (MODEL, default llama-3-8b preset, dummy weights; CUDA
# backend; TRANSPORT, default cuda_ipc). Closed loop: CONC (64) in flight, REQUESTS (256) of
# PROMPT (1024) prompt ids and OUT_LEN (256) x [0.1, 1.9] tokens out (ignore_eos), so that after the
# first CONC (sent at once) every request starts while CONC-1 others decode. ROUNDS (2), the order
# of the paths alternating, the same seed for both paths within a round.
#   BIN=build/bin OUT=/tmp/out bash bench/http_vs_grpc.sh
# Writes $OUT/c64.jsonl (bench serve's runs), $OUT/c64_requests.jsonl (per request) and prints
# bench/http_vs_grpc_summary.py's table (the steady part: requests after the first CONC).
set -u
B=${BIN:-build/bin}; OUT=${OUT:-/tmp/http_vs_grpc}; T=$(mktemp -d); mkdir -p "$OUT"
MODEL=${MODEL:-llama-3-8b}; TRANSPORT=${TRANSPORT:-cuda_ipc}; CONC=${CONC:-64}; REQUESTS=${REQUESTS:-256}
PROMPT=${PROMPT:-1024}; OUT_LEN=${OUT_LEN:-256}; ROUNDS=${ROUNDS:-2}; VOCAB=${VOCAB:-128256}
here=$(cd "$(dirname "$0")" && pwd)
common=(--model "$MODEL" --backend "${BACKEND:-cuda}" --transport "$TRANSPORT" --device 0 --log_level warn
        --request_timeout_ms 300000)
"$B/kvstream-prefill" "${common[@]}" --pool_blocks 2048 --listen 127.0.0.1:0 --port_file "$T/pp" > "$OUT/prefill.log" 2>&1 &
PP=$!
for _ in $(seq 1 240); do [[ -s $T/pp ]] && break; sleep 0.5; done
"$B/kvstream-decode" "${common[@]}" --pool_blocks "${POOL_BLOCKS:-11000}" --max_batch $((CONC + 8)) --listen 127.0.0.1:0 \
  --peer "127.0.0.1:$(cat "$T/pp")" --port_file "$T/dp" --http 127.0.0.1:0 --http_port_file "$T/hp" > "$OUT/decode.log" 2>&1 &
DP=$!
for _ in $(seq 1 240); do [[ -s $T/dp && -s $T/hp ]] && break; sleep 0.5; done
echo "decode grpc $(cat "$T/dp") http $(cat "$T/hp") t=${SECONDS}s"
G=grpc://127.0.0.1:$(cat "$T/dp"); H=http://127.0.0.1:$(cat "$T/hp")
serve() {  # serve URL LABEL FLAGS...
  local url=$1 label=$2; shift 2
  timeout -k 5 "${STEP_TIMEOUT:-120}" "$B/kvstream" bench serve --url "$url" --no-progress --prompt-format ids \
    --vocab-size "$VOCAB" --ignore-eos --max-concurrency "$CONC" --input-len "$PROMPT" --label "$label" "$@" \
    > "$OUT/$label.txt" 2>&1
  echo "$label rc=$? t=${SECONDS}s"
}
serve "$G" warm_grpc --num-prompts "$CONC" --output-len 16
serve "$H" warm_http --num-prompts "$CONC" --output-len 16
run=(--num-prompts "$REQUESTS" --output-len "$OUT_LEN" --range-ratio 0.9 --json-out "$OUT/c64.jsonl"
     --requests-out "$OUT/c64_requests.jsonl")
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="grpc http"; else order="http grpc"; fi
  for p in $order; do
    if [[ $p == grpc ]]; then serve "$G" "grpc_$r" "${run[@]}" --seed "$r"; else serve "$H" "http_$r" "${run[@]}" --seed "$r"; fi
  done
done
kill $DP $PP; wait
rm -rf "$T"
python3 "$here/http_vs_grpc_summary.py" "$OUT/c64_requests.jsonl" "$OUT/c64.jsonl"
