#!/usr/bin/env bash
# The HTTP front door against gRPC Generate at 64 concurrent streams (issue 18's targets: HTTP adds
# <= 0.3 ms p50 and <= 1 ms p99 to TTFT, <= 2% to ITL), same daemons, same run, one tool:
# `kvstream bench serve --url grpc://...` and `--url http://...` with the same flags and seeds.
# One prefill + one decode on one GPU (MODEL, default llama-3-8b preset, dummy weights; CUDA
# backend; TRANSPORT, default cuda_ipc).
#   Background: BG_GRPC (32) streams over gRPC and BG_HTTP (31) over HTTP at once (two bench serve
#   processes), PROMPT (1024) prompt ids and BG_OUT (3000) tokens out each: both paths' streams
#   share every decode step, so their inter-token latencies compare side by side.
#   Probes, while the background decodes (the 64th stream): ROUNDS (8) rounds of PROBES (16)
#   requests one at a time per path (PROMPT ids, 2 tokens out), the paths alternating and the
#   order flipping each round, the same seed for both paths within a round: their TTFT is one
#   prefill under a 63-stream decode load, so the paths' difference is what each adds.
#   BIN=build/bin OUT=/tmp/out bash bench/http_vs_grpc.sh
# Writes $OUT/window.txt (wall times of the background's start and the probes), $OUT/bg.jsonl and $OUT/probe.jsonl (bench serve's runs), $OUT/bg_requests.jsonl and
# $OUT/probe_requests.jsonl (per request), and prints bench/http_vs_grpc_summary.py's tables.
set -u
B=${BIN:-build/bin}; OUT=${OUT:-/tmp/http_vs_grpc}; T=$(mktemp -d); mkdir -p "$OUT"
MODEL=${MODEL:-llama-3-8b}; TRANSPORT=${TRANSPORT:-cuda_ipc}; BG_GRPC=${BG_GRPC:-32}; BG_HTTP=${BG_HTTP:-31}
PROMPT=${PROMPT:-1024}; BG_OUT=${BG_OUT:-3000}; ROUNDS=${ROUNDS:-8}; PROBES=${PROBES:-16}; VOCAB=${VOCAB:-128256}
here=$(cd "$(dirname "$0")" && pwd)
rm -f "$OUT"/bg*.jsonl "$OUT"/probe*.jsonl
common=(--model "$MODEL" --backend "${BACKEND:-cuda}" --transport "$TRANSPORT" --device 0 --log_level warn
        --request_timeout_ms 300000)
"$B/kvstream-prefill" "${common[@]}" --pool_blocks 2048 --listen 127.0.0.1:0 --port_file "$T/pp" > "$OUT/prefill.log" 2>&1 &
PP=$!
for _ in $(seq 1 240); do [[ -s $T/pp ]] && break; sleep 0.5; done
"$B/kvstream-decode" "${common[@]}" --pool_blocks "${POOL_BLOCKS:-18000}" --max_batch 72 --listen 127.0.0.1:0 \
  --peer "127.0.0.1:$(cat "$T/pp")" --port_file "$T/dp" --http 127.0.0.1:0 --http_port_file "$T/hp" > "$OUT/decode.log" 2>&1 &
DP=$!
for _ in $(seq 1 240); do [[ -s $T/dp && -s $T/hp ]] && break; sleep 0.5; done
echo "decode grpc $(cat "$T/dp") http $(cat "$T/hp") t=${SECONDS}s"
G=grpc://127.0.0.1:$(cat "$T/dp"); H=http://127.0.0.1:$(cat "$T/hp")
serve() {  # serve URL LABEL FLAGS...
  local url=$1 label=$2; shift 2
  timeout -k 5 "${STEP_TIMEOUT:-240}" "$B/kvstream" bench serve --url "$url" --no-progress --prompt-format ids \
    --vocab-size "$VOCAB" --ignore-eos --input-len "$PROMPT" --label "$label" "$@" > "$OUT/$label.txt" 2>&1
  echo "$label rc=$? t=${SECONDS}s"
}
serve "$G" warm_grpc --num-prompts 8 --max-concurrency 8 --output-len 16
serve "$H" warm_http --num-prompts 8 --max-concurrency 8 --output-len 16
bg=(--output-len "$BG_OUT" --seed 7 --json-out "$OUT/bg.jsonl" --requests-out "$OUT/bg_requests.jsonl")
echo "bg_start $(date +%s.%N)" > "$OUT/window.txt"
serve "$G" bg_grpc --num-prompts "$BG_GRPC" --max-concurrency "$BG_GRPC" "${bg[@]}" &
BGG=$!
serve "$H" bg_http --num-prompts "$BG_HTTP" --max-concurrency "$BG_HTTP" "${bg[@]}" &
BGH=$!
sleep "${BG_SETTLE_S:-12}"  # the 63 background prompts prefilled; every stream decoding
echo "probes start t=${SECONDS}s"; echo "probe_start $(date +%s.%N)" >> "$OUT/window.txt"
probe=(--num-prompts "$PROBES" --max-concurrency 1 --output-len 2 --json-out "$OUT/probe.jsonl"
       --requests-out "$OUT/probe_requests.jsonl")
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="grpc http"; else order="http grpc"; fi
  for p in $order; do
    if [[ $p == grpc ]]; then serve "$G" "grpc_$r" "${probe[@]}" --seed "$r"; else serve "$H" "http_$r" "${probe[@]}" --seed "$r"; fi
  done
done
echo "probe_end $(date +%s.%N)" >> "$OUT/window.txt"
echo "probes end t=${SECONDS}s (the background must still be decoding: see its end below)"
wait $BGG $BGH
kill $DP $PP; wait
rm -rf "$T"
python3 "$here/http_vs_grpc_summary.py" "$OUT"
