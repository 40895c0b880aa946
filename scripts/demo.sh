#!/usr/bin/env bash
# The README's demo: installs what is missing (apt), builds, then
#  1. colocated generation in one process (CPU backend, tiny preset);
#  2. the two daemons as two processes on loopback: kvstream-prefill and kvstream-decode, the
#     KV moving over UCX (TCP by default; KVSTREAM_DEMO_UCX_TLS=sm for shared memory), a few
#     prompts through `kvstream generate --decode` checked token for token against colocated
#     generation, then the TTFT table (pipelined, non-pipelined, colocated) from
#     `kvstream bench ttft`, which also checks that every mode produced the same tokens, and
#     what the daemons report (`kvstream stats`);
#  3. stops both daemons (SIGTERM; they report every KV block free) — also on error or ^C.
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
    kill -0 "$2" 2>/dev/null || { echo "daemon exited; its log:"; cat "$1.log" 2>/dev/null; return 1; }
    sleep 0.1
  done
  echo "timed out waiting for $1"; return 1
}
model=(--model tiny)
"$build/bin/kvstream-prefill" "${model[@]}" --listen 127.0.0.1:0 --port_file "$work/prefill.port" \
  --ucx_tls "$tls" --threads 1 2>"$work/prefill.log" &
pids+=($!)
wait_port "$work/prefill.port" "${pids[0]}"
pport=$(cat "$work/prefill.port")
"$build/bin/kvstream-decode" "${model[@]}" --listen 127.0.0.1:0 --port_file "$work/decode.port" \
  --peer "127.0.0.1:$pport" --ucx_tls "$tls" --threads 1 2>"$work/decode.log" &
pids+=($!)
wait_port "$work/decode.port" "${pids[1]}"
dport=$(cat "$work/decode.port")
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
echo "-- TTFT: pipelined vs non-pipelined vs colocated (kvstream bench ttft) --"
"$kv" bench ttft --decode "127.0.0.1:$dport" --prefill "127.0.0.1:$pport" "${model[@]}" --threads 1 \
  --requests "${KVSTREAM_DEMO_REQUESTS:-5}" --prompt-lens 16,256,1024 --max-new-tokens 8 \
  --json-out "$work/bench.jsonl"

echo
echo "-- what the daemons report (kvstream stats) --"
"$kv" stats --decode "127.0.0.1:$dport" --prefill "127.0.0.1:$pport"

echo
echo "== 3. stopping both daemons (SIGTERM) =="
kill -TERM "${pids[1]}"; wait "${pids[1]}" || true
kill -TERM "${pids[0]}"; wait "${pids[0]}" || true
pids=()
grep -h "stopped;" "$work/decode.log" "$work/prefill.log" | sed 's/^/  /'
