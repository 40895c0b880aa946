# shellcheck shell=bash
# bench/run.sh's netns suite (sourced): two network hosts on one machine. A network namespace
# joined to this one by a veth pair (iproute2's `ip`; `tc` limits its rate), the receiver /
# prefill inside it, the writer / decode outside, UCX pinned to the veth ends and restricted to
# the network path (UCX_TLS=tcp,cuda_copy: UCX stages GPU memory through host buffers itself).
# Per link rate (RATES: "unlimited 25gbit 10gbit"; a tbf qdisc on both ends):
#   - ucx_perftest tag_bw, 16 MiB, CUDA and host memory, server in the namespace (PERFTEST_BIN: the
#     CUDA-enabled UCX's bin/, e.g. from scripts/install-deps.sh --ucx-cuda), with the CPU
#     seconds of both processes;
#   - transfer_gpu across the namespaces: ucx_host (host memory, the same UCX path), ucx (CUDA
#     memory through UCX itself) and ucx_staged, one layer and whole prompts (TRANSFER_TOKENS,
#     4096), each with its CPU cost;
#   - TTFT through the daemons (TTFT_TRANSPORTS "ucx", TTFT_RATES "25gbit 10gbit unlimited",
#     LENS "4096,16384", REQUESTS 2): the prefill daemon in the namespace, pipelined,
#     non-pipelined and colocated.
# Needs root, `ip` and `tc` on PATH (the GPU machine has neither: carry Debian's iproute2
# binaries), and a kvstream built against a UCX with CUDA for the ucx rows.
NETNS_NAME=kvb$$ NETNS_IN=kvbi NETNS_OUT=kvbo NETNS_IP_IN=10.212.1.1 NETNS_IP_OUT=10.212.1.2
netns_down() { ip link del "$NETNS_OUT" 2> /dev/null; ip netns del "$NETNS_NAME" 2> /dev/null; }
netns_up() {
  netns_down
  ip netns add "$NETNS_NAME" && ip link add "$NETNS_OUT" type veth peer name "$NETNS_IN" &&
    ip link set "$NETNS_IN" netns "$NETNS_NAME" &&
    ip addr add "$NETNS_IP_OUT/24" dev "$NETNS_OUT" && ip link set "$NETNS_OUT" up &&
    ip netns exec "$NETNS_NAME" ip addr add "$NETNS_IP_IN/24" dev "$NETNS_IN" &&
    ip netns exec "$NETNS_NAME" ip link set "$NETNS_IN" up &&
    ip netns exec "$NETNS_NAME" ip link set lo up
}
# netns_rate RATE: both ends limited to RATE (tc syntax), or the limits removed ("unlimited").
netns_rate() {
  local r=$1
  if [[ $r == unlimited ]]; then
    tc qdisc del dev "$NETNS_OUT" root 2> /dev/null
    ip netns exec "$NETNS_NAME" tc qdisc del dev "$NETNS_IN" root 2> /dev/null
    return 0
  fi
  tc qdisc replace dev "$NETNS_OUT" root tbf rate "$r" burst 16mb latency 100ms &&
    ip netns exec "$NETNS_NAME" tc qdisc replace dev "$NETNS_IN" root tbf rate "$r" burst 16mb latency 100ms
}

# perftest_row MEM RATE: ucx_perftest tag_bw over the veth; one JSON line with MB/s and the CPU
# seconds (user + system) of client and server.
perftest_row() {
  local mem=$1 rate=$2 port=$(( 13500 + RANDOM % 400 )) size=16777216 n=${PERF_ITERS:-40}
  local env=(UCX_TLS=tcp,cuda_copy)
  local srv_log=$TMP/perf_srv.log cli_log=$TMP/perf_cli.log
  ip netns exec "$NETNS_NAME" env "${env[@]}" UCX_NET_DEVICES="$NETNS_IN" \
    bash -c '"$@"; times' _ timeout 60 "$PERFTEST_BIN/ucx_perftest" -p "$port" > "$srv_log" 2>&1 &
  local srv=$!
  sleep 1
  env "${env[@]}" UCX_NET_DEVICES="$NETNS_OUT" bash -c '"$@"; times' _ timeout 50 \
    "$PERFTEST_BIN/ucx_perftest" "$NETNS_IP_IN" -p "$port" -t tag_bw -m "$mem" -s "$size" -n "$n" -w 4 \
    > "$cli_log" 2>&1
  wait "$srv"
  cat "$cli_log" "$srv_log" >> "$(logf netns)"
  python3 - "$cli_log" "$srv_log" "$mem" "$rate" "$size" "$n" <<'PY' >> "$(rec netns)"
import json, re, sys
cli, srv, mem, rate, size, n = sys.argv[1:]
def cpu(path):  # bash `times`: second line = children's user and system time
    lines = [l for l in open(path) if re.match(r'^\d+m[\d.]+s \d+m[\d.]+s', l)]
    if len(lines) < 2: return None
    t = 0.0
    for m, s in re.findall(r'(\d+)m([\d.]+)s', lines[1]): t += int(m) * 60 + float(s)
    return t
final = [l for l in open(cli) if l.startswith('Final:')]
mbs = float(final[-1].split()[6]) if final else None
print(json.dumps({"step": "ucx_perftest", "mem": mem, "rate": rate, "bytes": int(size),
                  "iters": int(n), "MiB_per_s": mbs, "GB_per_s": mbs * 1048576 / 1e9 if mbs else None,
                  "client_cpu_s": cpu(cli), "server_cpu_s": cpu(srv)}))
PY
  tail -n 1 "$(rec netns)"
}

suite_netns() {
  if [[ $DRY_RUN == 1 ]]; then echo "# netns: ip netns add $NETNS_NAME; veth $NETNS_OUT/$NETNS_IN; per rate: ucx_perftest, transfer_gpu, ttft"; return 0; fi
  command -v ip > /dev/null && command -v tc > /dev/null || { say "netns: ip / tc not on PATH, skipped"; return 0; }
  netns_up || { say "netns: the veth pair could not be made"; netns_down; return 0; }
  say "netns: $NETNS_NAME ($NETNS_IN $NETNS_IP_IN) <-> ($NETNS_OUT $NETNS_IP_OUT)"
  local rate tr
  for rate in ${RATES:-unlimited 25gbit 10gbit}; do
    netns_rate "$rate" || { say "netns: tc could not limit the link to $rate: skipped"; continue; }
    if [[ -x ${PERFTEST_BIN:-}/ucx_perftest ]]; then
      for mem in cuda host; do perftest_row "$mem" "$rate"; done
    fi
    if have transfer_gpu; then
      local j; j=$(jtmp "transfer_netns_$rate")
      UCX_TLS=tcp,cuda_copy step "transfer_gpu netns $rate" netns "${TRANSFER_TIMEOUT:-120}" "$j" \
        "$BIN/transfer_gpu" --device=0 --rx-device=0 --models=llama-3-8b \
        --tokens="${TRANSFER_TOKENS:-4096}" --iters="${TRANSFER_ITERS:-5}" --cpu-ms=0 \
        --backends="${TRANSFER_BACKENDS:-ucx_host,ucx,ucx_staged}" \
        --rx-netns="/run/netns/$NETNS_NAME" --ucx-net-devices="$NETNS_OUT" \
        --rx-ucx-net-devices="$NETNS_IN" --json="$j"
    fi
    if [[ " ${TTFT_RATES-25gbit 10gbit unlimited} " == *" $rate "* ]]; then
      for tr in ${TTFT_TRANSPORTS:-ucx}; do netns_ttft "$tr" "$rate"; done
    fi
  done
  netns_rate unlimited
  netns_down
  grep -hE '^llama' "$(logf netns)" 2> /dev/null | cut -c1-150 | tail -n 30
}

# netns_ttft TRANSPORT RATE: a daemon pair across the namespaces and `kvstream bench ttft`.
netns_ttft() {
  local tr=$1 rate=$2 model=${TTFT_MODEL:-llama-3-8b} lens=${LENS:-4096,16384} max_new=4
  local maxlen; maxlen=$(tr ',' '\n' <<< "$lens" | sort -n | tail -1)
  local blocks=$(( (maxlen + max_new + 15) / 16 + 8 ))
  (( $(budget_left) < 60 )) && { say "ttft netns $tr $rate: skipped (budget)"; return 0; }
  next_port
  local port=$PORT_BASE
  rm -f "$TMP"/*.port
  local common=(--model "$model" --backend cuda --transport "$tr" --pool_blocks "$blocks"
                --log_level warn --request_timeout_ms 120000 --insecure --ucx_tls tcp,cuda_copy
                --max_position 32768)
  spawn "$TMP/prefill.log" ip netns exec "$NETNS_NAME" "$BIN/kvstream-prefill" "${common[@]}" \
    --device 0 --ucx_net_devices "$NETNS_IN" --listen "$NETNS_IP_IN:$port" --port_file "$TMP/prefill.port"
  local pp=$SPAWNED
  spawn "$TMP/decode.log" "$BIN/kvstream-decode" "${common[@]}" --device 0 --ucx_net_devices "$NETNS_OUT" \
    --listen 127.0.0.1:0 --peer "$NETNS_IP_IN:$port" --port_file "$TMP/decode.port"
  local dp=$SPAWNED
  if wait_port "$TMP/prefill.port" "$pp" && wait_port "$TMP/decode.port" "$dp"; then
    local j; j=$(jtmp "ttft_netns_${tr}_$rate")
    step "ttft netns $tr $rate" netns "${TTFT_TIMEOUT:-200}" "$j" "$BIN/kvstream" bench ttft \
      --decode "127.0.0.1:$PORT_READ" --prefill "$NETNS_IP_IN:$port" --model "$model" \
      --max-position 32768 --backend cuda --device 0 --prompt-lens "$lens" \
      --requests "${REQUESTS:-2}" --warmup 1 --max-new-tokens "$max_new" \
      --modes pipelined,non-pipelined,colocated --deadline-ms 90000 --json-out "$j"
  else
    say "ttft netns $tr $rate: the daemons did not come up"
  fi
  stop_pid "$dp"; stop_pid "$pp"
  daemon_tails "ttft netns $tr $rate" "$TMP/prefill.log" "$TMP/decode.log"
  rm -f "$TMP/prefill.log" "$TMP/decode.log"
}
