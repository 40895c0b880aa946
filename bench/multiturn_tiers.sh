#!/usr/bin/env bash
# Multi-turn conversations per KV tier (issue 16 item 7 and its multi-turn target: TTFT p50 of
# turns >= 2 at least 5x better than with the cache off, with a host tier of 8-10x the GPU prefix
# pool). One prefill + one decode on one GPU (llama-3-8b preset, dummy weights, CUDA backend,
# cuda_ipc), restarted for each configuration in CONFIGS (default "off gpu host"):
#   off   --prompt_cache_blocks 0
#   gpu   --prompt_cache_blocks GPU_BLOCKS (default 512 = 8192 tokens = 1 GiB of llama-3-8b KV)
#   host  gpu + --kv_host_tier_mb HOST_MB (default 10240: 10x the GPU prefix pool)
#   disk  host + a disk tier of DISK_MB under a temporary directory
#   store host + a shared store (a redis-server this script starts on a Unix socket, AUTH
#         required; redis-server must be on PATH) on both daemons: the decode writes finished
#         conversations down to it (through its own DECODE_HOST_MB pinned tier) and loads the
#         prefixes it finds there itself, the prefill writing only the rest (docs/kv_tiers.md)
#   store-noload  store with --kv_decode_loads_prefix=false (the prefill writes every block);
#         store sets it true (its default, auto, is off over cuda_ipc and nccl)
# TRANSPORT (default cuda_ipc) is the data plane, e.g. ucx_staged (host staging, as across nodes).
# Workload (kvstream bench serve --dataset multiturn): CONV (16) conversations x TURNS (6) turns,
# a shared system prompt of SYSTEM (4096) ids, each turn adding a USER_LEN (256)-id message to the
# conversation so far (earlier messages and answers), OUT_LEN (32) tokens out, CONC (4) in flight.
#   BIN=build/bin OUT=/tmp/mt bash bench/multiturn_tiers.sh
# Writes $OUT/multiturn.jsonl (bench serve's runs), $OUT/<config>.txt and $OUT/<config>_stats.json
# (the prefill's Stats after the run), and prints first/later-turn TTFT per configuration and the
# later-turn p50 of off over each other configuration.
set -u
B=${BIN:-build/bin}; OUT=${OUT:-/tmp/multiturn_tiers}; mkdir -p "$OUT"
CONFIGS=${CONFIGS:-off gpu host}; GPU_BLOCKS=${GPU_BLOCKS:-512}; HOST_MB=${HOST_MB:-10240}
DISK_MB=${DISK_MB:-20480}; DECODE_HOST_MB=${DECODE_HOST_MB:-10240}; CONV=${CONV:-16}; TURNS=${TURNS:-6}; SYSTEM=${SYSTEM:-4096}
USER_LEN=${USER_LEN:-256}; OUT_LEN=${OUT_LEN:-32}; CONC=${CONC:-4}; MODEL=${MODEL:-llama-3-8b}
common=(--model "$MODEL" --backend cuda --transport "${TRANSPORT:-cuda_ipc}" --device 0 --log_level warn
        --request_timeout_ms 300000)
rm -f "$OUT/multiturn.jsonl"
for cfg in $CONFIGS; do
  T=$(mktemp -d); dflags=(); RP=
  case $cfg in
    off) flags=(--prompt_cache_blocks 0) ;;
    gpu) flags=(--prompt_cache_blocks "$GPU_BLOCKS") ;;
    host) flags=(--prompt_cache_blocks "$GPU_BLOCKS" --kv_host_tier_mb "$HOST_MB") ;;
    disk) head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/secret"; chmod 600 "$T/secret"
          flags=(--prompt_cache_blocks "$GPU_BLOCKS" --kv_host_tier_mb "$HOST_MB" --kv_disk_tier_dir "$T/disk"
                 --kv_disk_tier_mb "$DISK_MB" --kv_tier_secret_file "$T/secret") ;;
    store|store-noload)
          command -v redis-server > /dev/null || { echo "redis-server is not on PATH"; exit 2; }
          head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/secret"; chmod 600 "$T/secret"
          pw=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'); echo "$pw" > "$T/redis.auth"
          chmod 600 "$T/redis.auth"
          redis-server --port 0 --unixsocket "$T/redis.sock" --unixsocketperm 700 --requirepass "$pw" \
            --save "" --appendonly no --dir "$T" > "$OUT/${cfg}_redis.log" 2>&1 &
          RP=$!
          for _ in $(seq 1 100); do [[ -S $T/redis.sock ]] && break; sleep 0.1; done
          store=(--kv_tier_secret_file "$T/secret" --kv_store_redis "unix:$T/redis.sock"
                 --kv_store_auth_file "$T/redis.auth")
          flags=(--prompt_cache_blocks "$GPU_BLOCKS" --kv_host_tier_mb "$HOST_MB" "${store[@]}")
          dflags=("${store[@]}" --kv_host_tier_mb "$DECODE_HOST_MB")
          if [[ $cfg == store-noload ]]; then dflags+=(--kv_decode_loads_prefix=false)
          else dflags+=(--kv_decode_loads_prefix=true); fi ;;
    *) echo "unknown config $cfg"; exit 2 ;;
  esac
  "$B/kvstream-prefill" "${common[@]}" --pool_blocks "${PREFILL_BLOCKS:-2048}" "${flags[@]}" --listen 127.0.0.1:0 \
    --port_file "$T/pp" > "$OUT/${cfg}_prefill.log" 2>&1 &
  PP=$!
  for _ in $(seq 1 240); do [[ -s $T/pp ]] && break; sleep 0.5; done
  "$B/kvstream-decode" "${common[@]}" --pool_blocks "${DECODE_BLOCKS:-8000}" --max_batch 16 "${dflags[@]}" --listen 127.0.0.1:0 \
    --peer "127.0.0.1:$(cat "$T/pp")" --port_file "$T/dp" --http 127.0.0.1:0 --http_port_file "$T/hp" \
    > "$OUT/${cfg}_decode.log" 2>&1 &
  DP=$!
  for _ in $(seq 1 240); do [[ -s $T/dp && -s $T/hp ]] && break; sleep 0.5; done
  timeout -k 5 "${STEP_TIMEOUT:-240}" "$B/kvstream" bench serve --url "http://127.0.0.1:$(cat "$T/hp")" --no-progress \
    --dataset multiturn --conversations "$CONV" --turns "$TURNS" --system-len "$SYSTEM" --input-len "$USER_LEN" \
    --output-len "$OUT_LEN" --max-concurrency "$CONC" --request-rate inf --prompt-format ids --vocab-size 128256 \
    --ignore-eos --seed 1 --label "$cfg" --json-out "$OUT/multiturn.jsonl" > "$OUT/$cfg.txt" 2>&1
  echo "$cfg rc=$? t=${SECONDS}s"
  "$B/kvstream" stats --decode "127.0.0.1:$(cat "$T/dp")" --prefill "127.0.0.1:$(cat "$T/pp")" --json > "$OUT/${cfg}_stats.json" 2>&1
  kill $DP $PP; wait $DP $PP
  [[ -n $RP ]] && { kill $RP; wait $RP; }
  rm -rf "$T"
done
python3 - "$OUT/multiturn.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| config | first turns p50 ms | first p99 | later turns p50 ms | later p99 | req/s | failed | off/config later p50 |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
off = next((r for r in rows if r["label"] == "off"), None)
for r in rows:
    ratio = off["median_ttft_later_turns_ms"] / r["median_ttft_later_turns_ms"] if off else float("nan")
    print(f"| {r['label']} | {r['median_ttft_first_turn_ms']:.2f} | {r['p99_ttft_first_turn_ms']:.2f} | "
          f"{r['median_ttft_later_turns_ms']:.2f} | {r['p99_ttft_later_turns_ms']:.2f} | "
          f"{r.get('request_throughput', float('nan')):.2f} | {r.get('failed', '?')} | {ratio:.2f}x |")
PY
