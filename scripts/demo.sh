#!/usr/bin/env bash
# The README's demo: installs what is missing (apt), builds, then
#  1. colocated generation in one process (CPU backend, tiny preset);
#  2. the two daemons as two processes on loopback: kvstream-prefill and kvstream-decode, the
#     KV moving over UCX (TCP by default; KVSTREAM_DEMO_UCX_TLS=sm for shared memory), a few
#     prompts through `kvstream generate --decode` checked token for token against colocated
#     generation, then the TTFT table (pipelined, non-pipelined, colocated) from
#     `kvstream bench ttft`, which also checks that every mode produced the same tokens, and
#     what the daemons report (`kvstream stats`);
#  3. what layer-by-layer streaming buys where the link is slow relative to the model (on
#     loopback the tiny model's KV moves in microseconds, so step 2 shows pipelined ~
#     non-pipelined): an 8-layer variant of tiny (`kvstream bench make-model`), its prefill
#     timed in this process, then a second pair of daemons whose KV writes are paced
#     (`--pace_bytes_per_s`, docs/pacing.md) so that moving a prompt's KV takes about as long as
#     computing it; `kvstream bench ttft` runs pipelined and non-pipelined requests alternately,
#     and the TTFT saved and the share of the transfer hidden are printed side by side
#     (KVSTREAM_DEMO_SLOW_LINK=0 skips this step);
#  4. stops the daemons (SIGTERM; they report every KV block free) — also on error or ^C.
# Safe to run twice. Set KVSTREAM_DEMO_LLAMA=1 to add a llama-2-7b-shaped 2-layer colocated run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build=${KVSTREAM_BUILD_DIR:-$root/build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  # The demo needs no GPU code; skipping nvcc keeps the first build short on small machines.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVSTREAM_WITH_CUDA=OFF
fi
cmake --build "$build" -j "${KVSTREAM_JOBS:-$(nproc)}" --target kvstream kvstream-prefill kvstream-decode
kv="$build/bin/kvstream"
tls=${KVSTREAM_DEMO_UCX_TLS:-tcp}

work=$(mktemp -d /tmp/kvstream-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

echo
echo "== 1. colocated: kvstream generate, tiny preset, CPU backend =="
"$kv" generate --model tiny --prompt-tokens 1,2,3,4,5,6,7,8 --max-new-tokens 16
if [ "${KVSTREAM_DEMO_LLAMA:-0}" = 1 ]; then
  echo
  echo "== llama-2-7b shapes, first 2 layers (dummy weights; slow on a small CPU) =="
  "$kv" generate --model llama-2-7b --layers 2 --prompt-len 32 --max-new-tokens 4
fi

echo
echo "== 2. two daemons on loopback (UCX_TLS=$tls) =="
wait_port() {  # file pid
  for _ in $(seq 1 600); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "daemon exited; its log:"; cat "${1%.port}.log" 2>/dev/null; return 1; }
    sleep 0.1
  done
  echo "timed out waiting for $1"; return 1
}
logs=()
# start_pair TAG MODEL_FLAGS... [-- PREFILL_FLAGS...]: a prefill daemon and a decode daemon that
# loads from it, one compute thread each; sets pport and dport.
start_pair() {
  local tag=$1 margs=() pargs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do margs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  pargs=("$@")
  "$build/bin/kvstream-prefill" "${margs[@]}" --listen 127.0.0.1:0 --port_file "$work/prefill$tag.port" \
    --ucx_tls "$tls" --threads 1 "${pargs[@]}" 2>"$work/prefill$tag.log" &
  pids+=($!)
  wait_port "$work/prefill$tag.port" "$!"
  pport=$(cat "$work/prefill$tag.port")
  "$build/bin/kvstream-decode" "${margs[@]}" --listen 127.0.0.1:0 --port_file "$work/decode$tag.port" \
    --peer "127.0.0.1:$pport" --ucx_tls "$tls" --threads 1 \
    --http 127.0.0.1:0 --http_port_file "$work/http$tag.port" 2>"$work/decode$tag.log" &
  pids+=($!)
  wait_port "$work/decode$tag.port" "$!"
  dport=$(cat "$work/decode$tag.port")
  logs+=("$work/decode$tag.log" "$work/prefill$tag.log")
}
model=(--model tiny)
start_pair "" "${model[@]}"
echo "prefill pid ${pids[0]} on 127.0.0.1:$pport, decode pid ${pids[1]} on 127.0.0.1:$dport"

echo
echo "-- a few prompts through the daemons, each checked against colocated generation --"
for spec in "--prompt-tokens 1,2,3,4,5,6,7,8" "--prompt-len 40" "--prompt-len 300"; do
  remote=$("$kv" generate --decode "127.0.0.1:$dport" $spec --max-new-tokens 12 --json)
  local_json=$("$kv" generate "${model[@]}" $spec --max-new-tokens 12 --json --threads 1)
  rt=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$remote")
  lt=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$local_json")
  ttft=$(python3 -c 'import json,sys; print("%.2f" % (json.loads(sys.argv[1])["ttft_s"]*1e3))' "$remote")
  if [ "$rt" = "$lt" ]; then verdict="== colocated"; else verdict="DIFFERS from colocated $lt"; fi
  echo "prompt [$spec]: TTFT ${ttft} ms, tokens $rt $verdict"
  [ "$rt" = "$lt" ] || exit 1
done

echo
echo "-- the same daemons through the OpenAI-compatible HTTP endpoint (docs/http.md) --"
hport=$(cat "$work/http.port")
body='{"model":"tiny","prompt":[1,2,3,4,5,6,7,8],"max_tokens":12,"temperature":0,"return_token_ids":true}'
echo "curl http://127.0.0.1:$hport/v1/completions -H 'Content-Type: application/json' -d '$body'"
curl -sS "http://127.0.0.1:$hport/v1/completions" -H 'Content-Type: application/json' -d "$body"
echo

echo
echo "-- TTFT: pipelined vs non-pipelined vs colocated (kvstream bench ttft) --"
"$kv" bench ttft --decode "127.0.0.1:$dport" --prefill "127.0.0.1:$pport" "${model[@]}" --threads 1 \
  --requests "${KVSTREAM_DEMO_REQUESTS:-5}" --prompt-lens 16,256,1024 --max-new-tokens 8 \
  --json-out "$work/bench.jsonl"

echo
echo "-- what the daemons report (kvstream stats) --"
"$kv" stats --decode "127.0.0.1:$dport" --prefill "127.0.0.1:$pport"

if [ "${KVSTREAM_DEMO_SLOW_LINK:-1}" != 0 ]; then
  echo
  echo "== 3. the same over a slow link: moving the KV takes about as long as computing it =="
  slow_len=${KVSTREAM_DEMO_SLOW_PROMPT:-256}
  "$kv" bench make-model --out "$work/deep8" --layers 8 --name tiny-deep8 >/dev/null
  # The prefill's compute time on this machine (in this process, one thread like the daemons;
  # the median of 3 runs), and the KV it writes: layers x KV heads x head size x 2 (K, V) x
  # the KV element's bytes per token. The link's rate is set from these two.
  rate=$(for _ in 1 2 3; do
           "$kv" generate --model "$work/deep8" --prompt-len "$slow_len" --max-new-tokens 1 --json --threads 1
         done | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
cfg = json.load(open(sys.argv[1] + "/config.json"))
elem = {"f16": 2, "bf16": 2, "f32": 4}[runs[0]["kv_dtype"]]
kv_bytes = int(sys.argv[2]) * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * elem
prefill = statistics.median(r["prefill_s"] for r in runs)
print(int(kv_bytes / prefill))
print("prefill of %d tokens here: %.0f ms (median of 3); its KV: %d KiB -> link paced to %.2f MB/s" %
      (int(sys.argv[2]), prefill * 1e3, kv_bytes // 1024, kv_bytes / prefill / 1e6), file=sys.stderr)
' "$work/deep8" "$slow_len")
  deep=(--model "$work/deep8")
  # A small burst: the bucket starts (nearly) empty, so no part of a prompt skips the rate.
  start_pair 2 "${deep[@]}" -- --pace_bytes_per_s "$rate" --pace_burst_bytes 4096
  "$kv" bench ttft --decode "127.0.0.1:$dport" --prefill "127.0.0.1:$pport" "${deep[@]}" --threads 1 \
    --modes pipelined,non-pipelined --requests "${KVSTREAM_DEMO_SLOW_REQUESTS:-3}" --warmup 1 \
    --prompt-lens "$slow_len" --max-new-tokens 4 --json-out "$work/slow.jsonl" >"$work/slow.txt"
  python3 - "$work/slow.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s = {r["mode"]: r for r in rows if r["kind"] == "summary"}
c = next(r for r in rows if r["kind"] == "comparison")
p, n = s["pipelined"], s["non-pipelined"]
print()
print("%-26s %14s %14s" % ("8 layers, %d-token prompt" % c["prompt_len"], "non-pipelined", "pipelined"))
print("%-26s %14.1f %14.1f" % ("TTFT p50, ms", n["ttft_ms"]["p50"], p["ttft_ms"]["p50"]))
print("%-26s %14.1f %14.1f" % ("prefill compute p50, ms", n["prefill_compute_ms_p50"], p["prefill_compute_ms_p50"]))
print("%-26s %14.1f %14s" % ("KV transfer p50, ms", c["transfer_ms_non_pipelined_p50"], "(overlapped)"))
print("%-26s %14.1f %14.1f" % ("transfer after prefill, ms", n["transfer_exposed_ms_p50"],
                                 p["transfer_exposed_ms_p50"]))
print("KV per prompt: %d KiB; transfer / prefill: %.2f (both measured, non-pipelined)" %
      (n["kv_bytes"] // 1024, c["transfer_share_of_prefill"]))
print("TTFT saved by pipelining: %.1f ms (%.0f%% of the non-pipelined TTFT)" %
      (c["ttft_saved_ms"], 100 * c["ttft_saved_ms"] / n["ttft_ms"]["p50"]))
print("share of the transfer hidden: %.2f (TTFT saved / transfer time; %.2f seen inside the prefill)" %
      (c["transfer_hidden_fraction"], c["transfer_hidden_fraction_prefill"]))
print("tokens identical across modes: %s" % ("yes" if c["tokens_identical_across_modes"] else "NO"))
PY
fi

echo
echo "== 4. stopping the daemons (SIGTERM) =="
# Every decode daemon first, then the prefills (pids holds prefill, decode, prefill, decode).
for first in 1 0; do
  for ((i = first; i < ${#pids[@]}; i += 2)); do kill -TERM "${pids[$i]}"; done
  for ((i = first; i < ${#pids[@]}; i += 2)); do wait "${pids[$i]}" || true; done
done
pids=()
grep -h "stopped;" "${logs[@]}" | sed 's/^/  /'
