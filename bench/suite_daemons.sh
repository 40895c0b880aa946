# shellcheck shell=bash
# bench/run.sh's suites through the daemons (sourced): kvstream-prefill and kvstream-decode as two
# processes (CUDA backend, KV pools in device memory) on one GPU, or on two (PREFILL_DEVICE /
# DECODE_DEVICE), driven by `kvstream bench ttft` / `kvstream bench itl`. MPS=1 runs both daemons
# as clients of an MPS server started and stopped here. Daemon log tails: $OUT/daemons_<date>.log.

PORT_BASE=${PORT:-46000}
next_port() { PORT_BASE=$(( PORT_BASE + 1 )); }  # a fresh port for the next prefill, in $PORT_BASE
daemon_tails() {  # daemon_tails LABEL LOG...: the lines worth keeping of each daemon log
  local f
  [[ $DRY_RUN == 1 ]] && return
  for f in "${@:2}"; do
    [[ -f $f ]] || continue
    echo "=== $1 $(basename "$f")"
    grep -E "paced at|handshake|error|ERROR|WARN| W | E |stopped|serving|KV pool" "$f" | tail -n 30
  done >> "$OUT/daemons_$(sfx).log"
}

# ttft: per (model, transport) a daemon pair and `kvstream bench ttft` (pipelined, non-pipelined
# and colocated = the decode daemon's own copy of the model, no transfer).
# Knobs: MODELS ("llama-3-8b llama-2-7b"), TRANSPORTS ("cuda_ipc ucx_staged"), LENS_<model, - and .
# as _> (e.g. LENS_llama_3_8b=4096,16384; default within the preset's max_position), REQUESTS (3), WARMUP (1), MAX_NEW (4),
# DEVICE (0) or PREFILL_DEVICE and DECODE_DEVICE, UCX_TLS (ucx_staged), BACKEND (cuda),
# LANDED_WAIT (off | on | both: cuda_ipc runs with the decode's gpu_landed_wait off / on),
# EXTRA_DECODE_FLAGS (e.g. --first_step_after_load=false), EXTRA_MODEL_FLAGS (both daemons and
# the bench, e.g. "--max-position 32768"), STEP_TIMEOUT (100), MPS.
suite_ttft() {
  local models=${MODELS:-llama-3-8b llama-2-7b} transports=${TRANSPORTS:-cuda_ipc ucx_staged}
  local requests=${REQUESTS:-3} max_new=${MAX_NEW:-4} backend=${BACKEND:-cuda}
  local dev=${DEVICE:-0}; local pdev=${PREFILL_DEVICE:-$dev} ddev=${DECODE_DEVICE:-$dev}
  local LENS_llama_3_8b=${LENS_llama_3_8b:-1024,4096,$(( 8192 - max_new ))}
  local LENS_llama_2_7b=${LENS_llama_2_7b:-1024,2048,$(( 4096 - max_new ))}
  if [[ ${SMOKE:-0} == 1 ]]; then
    models=llama-3-8b transports=cuda_ipc requests=1 LENS_llama_3_8b=4096
  fi
  # shellcheck disable=SC2206
  local mx=(${EXTRA_MODEL_FLAGS:-}) dx=(${EXTRA_DECODE_FLAGS:-})
  mps_start
  local model tr mode lens_var lens maxlen blocks port
  for model in $models; do
    lens_var="LENS_${model//[^A-Za-z0-9]/_}"; lens=${!lens_var:-1024,4096}
    maxlen=$(tr ',' '\n' <<< "$lens" | sort -n | tail -1)
    blocks=$(( (maxlen + max_new + 15) / 16 + 8 ))  # the longest prompt, its new tokens, a margin
    for tr in $transports; do
      local modes=off
      [[ $tr == cuda_ipc ]] && case ${LANDED_WAIT:-off} in on) modes=on ;; both) modes="off on" ;; esac
      for mode in $modes; do
        local tag="$model/$tr" lw=()
        [[ $mode == on ]] && tag+="/landed_wait" && lw=(--gpu_landed_wait=true)
        if [[ $DRY_RUN != 1 ]] && (( $(budget_left) < 40 )); then say "ttft $tag: skipped (budget)"; continue; fi
        next_port; port=$PORT_BASE
        [[ $DRY_RUN == 1 ]] || rm -f "$TMP"/*.port
        local common=(--model "$model" --backend "$backend" --transport "$tr" --pool_blocks "$blocks"
                      --log_level warn --request_timeout_ms 120000 "${mx[@]}")
        [[ $tr == ucx_staged && -n ${UCX_TLS:-} ]] && common+=(--ucx_tls "$UCX_TLS")
        spawn "$TMP/prefill.log" "$BIN/kvstream-prefill" "${common[@]}" --device "$pdev" \
          --listen "127.0.0.1:$port" --port_file "$TMP/prefill.port"
        local pp=$SPAWNED
        spawn "$TMP/decode.log" "$BIN/kvstream-decode" "${common[@]}" --device "$ddev" "${dx[@]}" "${lw[@]}" \
          --listen 127.0.0.1:0 --peer "127.0.0.1:$port" --port_file "$TMP/decode.port"
        local dp=$SPAWNED
        if wait_port "$TMP/prefill.port" "$pp" && wait_port "$TMP/decode.port" "$dp"; then
          local j; j=$(jtmp "ttft_$tag")
          step "ttft $tag" ttft_gpu "${STEP_TIMEOUT:-100}" "$j" "$BIN/kvstream" bench ttft \
            --decode "127.0.0.1:$PORT_READ" --prefill "127.0.0.1:$port" --model "$model" "${mx[@]}" \
            --backend "$backend" --device "$ddev" --prompt-lens "$lens" --requests "$requests" \
            --warmup "${WARMUP:-1}" --max-new-tokens "$max_new" --modes pipelined,non-pipelined,colocated \
            --deadline-ms 60000 --json-out "$j"
        else
          say "ttft $tag: the daemons did not come up (tails in $OUT/daemons_$(sfx).log)"
        fi
        stop_pid "$dp"; stop_pid "$pp"
        daemon_tails "ttft $tag" "$TMP/prefill.log" "$TMP/decode.log"
        [[ $DRY_RUN == 1 ]] || rm -f "$TMP/prefill.log" "$TMP/decode.log"
      done
    done
  done
  mps_stop
  [[ $DRY_RUN == 1 ]] || grep -E "^(TTFT / ITL|(pipelined|non-pipelined|colocated) +[0-9]| *[0-9]+ \| )" \
    "$(logf ttft_gpu)" 2> /dev/null | tail -n 30
}

# itl: S steady streams decode while L clients keep N-token prompts landing (max_tokens 1, the
# same prompt: the prefill's prompt cache writes it without computing, so only the KV traffic
# competes with decode), phases idle and landing alternated. Configurations, in one go:
#   A  prefill unpaced
#   B  prefill restarted with itl_target_ms = ITL_SLOWDOWN x A's idle ITL p50 (itl_idle_step_ms =
#      that p50, itl_device_bw_bytes_per_s = DEVICE_BW, itl_hbm_bytes_per_byte = ITL_K), or with
#      --pace_bytes_per_s PACE_BYTES_PER_S when set
#   D  (DECODE_TARGET=1) B's prefill, the decode restarted with the same itl_target_ms (join budget)
#   C  (PACE_FRACTION > 0) prefill paced at PACE_FRACTION x the rate A's landing reached
# Knobs: MODEL (llama-3-8b), TRANSPORT (cuda_ipc), DEVICE / PREFILL_DEVICE / DECODE_DEVICE,
# BACKEND, STREAMS (32), STREAM_LEN (4096), STREAM_MAX (3000), LANDING_CLIENTS (4), LANDING_LEN
# (16384), ROUNDS (3), PHASE_S (4), WARMUP_S (2), SETTLE_MS (300), MAX_POSITION (32768),
# ITL_SLOWDOWN (1.2), DEVICE_BW (4.3e12), ITL_K (2; 1 across GPUs), PACE_BYTES_PER_S,
# PACE_FRACTION (0), DECODE_TARGET (1), STEP_TIMEOUT (120), EXTRA_DAEMON_FLAGS, MPS, PORT.
suite_itl() {
  local model=${MODEL:-llama-3-8b} streams=${STREAMS:-32} slen=${STREAM_LEN:-4096} smax=${STREAM_MAX:-3000}
  local lc=${LANDING_CLIENTS:-4} llen=${LANDING_LEN:-16384} rounds=${ROUNDS:-3} phase=${PHASE_S:-4}
  local warm=${WARMUP_S:-2} dtarget=${DECODE_TARGET:-1} pfrac=${PACE_FRACTION:-0}
  [[ ${SMOKE:-0} == 1 ]] && streams=8 smax=600 lc=2 rounds=1 phase=2 warm=1 dtarget=0 pfrac=0
  local dev=${DEVICE:-0}; local pdev=${PREFILL_DEVICE:-$dev} ddev=${DECODE_DEVICE:-$dev}
  blocks_of() { echo $(( ($1 + 15) / 16 )); }
  # Pools: decode holds every stream's prompt + max tokens and every landing prompt at once; the
  # prefill caches the streams' and the landing prompt.
  local dpool=$(( streams * $(blocks_of $((slen + smax))) + lc * $(blocks_of $((llen + 1))) + 64 ))
  local cache=$(( $(blocks_of "$slen") + $(blocks_of "$llen") + 8 ))
  local ppool=$(( cache + $(blocks_of "$llen") + 64 )) pport; next_port; pport=$PORT_BASE
  # shellcheck disable=SC2206
  local common=(--model "$model" --backend "${BACKEND:-cuda}" --transport "${TRANSPORT:-cuda_ipc}"
                --max_position "${MAX_POSITION:-32768}" --request_timeout_ms 600000 ${EXTRA_DAEMON_FLAGS:-})
  itl_prefill() {  # itl_prefill CONFIG FLAGS...: (re)starts the prefill; 1 if it did not come up
    stop_pid "${PP:-}"; [[ $DRY_RUN == 1 ]] || rm -f "$TMP/prefill.port"
    spawn "$TMP/prefill_$1.log" "$BIN/kvstream-prefill" "${common[@]}" --device "$pdev" --pool_blocks "$ppool" \
      --prompt_cache_blocks "$cache" --log_level info "${@:2}" --listen "127.0.0.1:$pport" \
      --port_file "$TMP/prefill.port"
    PP=$SPAWNED; wait_port "$TMP/prefill.port" "$PP"
  }
  itl_decode() {  # itl_decode FLAGS...: (re)starts the decode; its port in $DPORT
    stop_pid "${DP:-}"; [[ $DRY_RUN == 1 ]] || rm -f "$TMP/decode.port"
    spawn "$TMP/decode.log" "$BIN/kvstream-decode" "${common[@]}" --device "$ddev" --pool_blocks "$dpool" \
      --max_batch $(( streams + lc + 8 )) --log_level warn --listen 127.0.0.1:0 --peer "127.0.0.1:$pport" \
      --port_file "$TMP/decode.port" "$@"
    DP=$SPAWNED; wait_port "$TMP/decode.port" "$DP" && DPORT=$PORT_READ
  }
  itl_bench() {  # itl_bench LABEL: one `kvstream bench itl` run; its JSON lines also in $TMP/last.jsonl
    local need; need=$(awk "BEGIN{print int(15 + $warm + 2 * $rounds * $phase)}")
    if [[ $DRY_RUN != 1 ]] && (( $(budget_left) - 10 < need )); then say "itl $1: skipped (needs ${need}s)"; return 1; fi
    local j; j=$(jtmp "itl_$1")
    step "itl $1" itl_gpu "${STEP_TIMEOUT:-120}" "$j" "$BIN/kvstream" bench itl --decode "127.0.0.1:$DPORT" \
      --prefill "127.0.0.1:$pport" --streams "$streams" --stream-prompt-len "$slen" --stream-max-tokens "$smax" \
      --stream-mode pipelined --stream-same-prompt --landing-clients "$lc" --landing-prompt-len "$llen" \
      --rounds "$rounds" --phase-s "$phase" --settle-ms "${SETTLE_MS:-300}" --warmup-s "$warm" \
      --label "$1" --json-out "$j"
    [[ $DRY_RUN == 1 ]] || cp "$j" "$TMP/last.jsonl" 2> /dev/null
  }
  itl_field() {  # itl_field PHASE EXPR: EXPR of the itl_phase line of PHASE in $TMP/last.jsonl
    if [[ $DRY_RUN == 1 ]]; then echo "<$1 $2 of the last run>"; return; fi
    python3 -c "
import json
for l in open('$TMP/last.jsonl'):
    j = json.loads(l)
    if j.get('kind') == 'itl_phase' and j.get('phase') == '$1': print($2); break" 2> /dev/null
  }
  mps_start
  say "itl $model: $streams streams x $slen (+$smax), $lc landing x $llen; pools decode $dpool, prefill $ppool (cache $cache)"
  PP="" DP=""
  if ! itl_prefill A || ! itl_decode; then
    say "itl: the daemons did not come up"
  else
    itl_bench pacing=off
    local p50 gbps target label=pacing=itl pflags
    p50=$(itl_field idle "j['itl_ms']['p50']"); gbps=$(itl_field landing "j['landing_gbps']")
    say "A: idle ITL p50 ${p50:-?} ms, unpaced landing ${gbps:-?} GB/s"
    if [[ ${SMOKE:-0} != 1 && -n $p50 && $p50 != nan ]]; then
      target=$(awk "BEGIN{print ${ITL_SLOWDOWN:-1.2} * $p50}" 2> /dev/null || echo "<target>")
      if [[ -n ${PACE_BYTES_PER_S:-} ]]; then label=pacing=rate pflags=(--pace_bytes_per_s "$PACE_BYTES_PER_S")
      else pflags=(--itl_target_ms "$target" --itl_idle_step_ms "$p50"
                   --itl_device_bw_bytes_per_s "${DEVICE_BW:-4.3e12}" --itl_hbm_bytes_per_byte "${ITL_K:-2}"); fi
      itl_prefill B "${pflags[@]}" && itl_bench "$label"
      if [[ $dtarget == 1 ]] && itl_decode --itl_target_ms "$target"; then itl_bench "$label+join"; fi
      if [[ $pfrac != 0 && -n $gbps && $gbps != nan ]]; then
        local rate; rate=$(awk "BEGIN{printf \"%d\", $pfrac * $gbps * 1e9}" 2> /dev/null || echo "<rate>")
        itl_prefill C --pace_bytes_per_s "$rate" && itl_bench pacing=rate
      fi
    fi
  fi
  stop_pid "${DP:-}"; stop_pid "${PP:-}"
  daemon_tails "itl" "$TMP"/prefill_*.log "$TMP/decode.log"
  mps_stop
  [[ $DRY_RUN == 1 ]] || grep -E "^(=== |ITL of|phase |idle |landing |landing / idle)" "$(logf itl_gpu)" 2> /dev/null | tail -n 30
}

# auth: what the control plane's authentication costs a request (issue 15's target: at most 2%
# of the CPU demo's TTFT p50 on loopback). Three daemon pairs that differ only in their
# credentials, CPU backend and the tiny preset as in the demo: plain (no credential), plain2
# (a second identical pair: the difference between two pairs that differ in nothing), token
# (peer token between the daemons, client token from the client) and mtls (certificates made
# here by the openssl CLI, both hops). auth_overhead interleaves their requests round by round
# and prints each mode's TTFT p50 against plain's with a 95% confidence interval.
# Knobs: AUTH_RUNS (600), AUTH_PROMPT_LEN (64), AUTH_THREADS (1 per daemon), UCX_TLS (tcp).
suite_auth() {
  local runs=${AUTH_RUNS:-600} plen=${AUTH_PROMPT_LEN:-64} th=${AUTH_THREADS:-1}
  [[ ${SMOKE:-0} == 1 ]] && runs=20
  local d=$TMP/auth mode port pp dp modes=()
  if [[ $DRY_RUN != 1 ]]; then
    mkdir -p "$d" && (
      cd "$d" || exit 1
      openssl rand -hex 32 > peer.token && openssl rand -hex 32 > client.token && chmod 600 ./*.token
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
        -keyout ca.key -out ca.pem 2> /dev/null
      for n in prefill decode client; do
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$n" -keyout $n.key \
          -out $n.csr 2> /dev/null
        printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\n' $n > $n.ext
        openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile $n.ext \
          -out $n.pem 2> /dev/null
      done
      chmod 600 ./*.key
    ) || { say "auth: could not make the credentials (openssl)"; return; }
  fi
  local common=(--model tiny --backend cpu --threads "$th" --ucx_tls "${UCX_TLS:-tcp}" --log_level warn
                --drain_delay_ms 0)
  for mode in plain plain2 token mtls; do
    local pa=() da=() ca=""
    case $mode in
      token) pa=(--peer_token_file "$d/peer.token")
             da=(--peer_token_file "$d/peer.token" --client_token_file "$d/client.token")
             ca=",token=$d/client.token" ;;
      mtls) pa=(--tls_cert "$d/prefill.pem" --tls_key "$d/prefill.key" --tls_ca "$d/ca.pem" --tls_peer_names decode)
            da=(--tls_cert "$d/decode.pem" --tls_key "$d/decode.key" --tls_ca "$d/ca.pem")
            ca=",ca=$d/ca.pem,cert=$d/client.pem,key=$d/client.key" ;;
    esac
    next_port; port=$PORT_BASE
    spawn "$TMP/prefill_$mode.log" "$BIN/kvstream-prefill" "${common[@]}" "${pa[@]}" \
      --listen "127.0.0.1:$port" --port_file "$TMP/prefill_$mode.port"
    pp=$SPAWNED
    spawn "$TMP/decode_$mode.log" "$BIN/kvstream-decode" "${common[@]}" "${da[@]}" --listen 127.0.0.1:0 \
      --peer "127.0.0.1:$port" --port_file "$TMP/decode_$mode.port"
    dp=$SPAWNED
    if ! wait_port "$TMP/prefill_$mode.port" "$pp" || ! wait_port "$TMP/decode_$mode.port" "$dp"; then
      say "auth: the $mode daemons did not come up"
      daemon_tails "auth $mode" "$TMP/prefill_$mode.log" "$TMP/decode_$mode.log"
      return
    fi
    modes+=(--mode "$mode=127.0.0.1:$PORT_READ$ca")
  done
  local j; j=$(jtmp auth)
  step "auth overhead" auth_cpu "${STEP_TIMEOUT:-280}" "$j" "$BIN/auth_overhead" "${modes[@]}" \
    --runs "$runs" --warmup 10 --prompt-len "$plen" --max-new-tokens 1 --json-out "$j"
  for p in "${DAEMON_PIDS[@]}"; do stop_pid "$p"; done
  daemon_tails "auth" "$TMP"/prefill_*.log "$TMP"/decode_*.log
  [[ $DRY_RUN == 1 ]] || grep -E "^(auth_overhead|mode|plain|plain2|token|mtls) " "$(logf auth_cpu)" 2> /dev/null
}

# metrics: what the Prometheus endpoint costs (issue 19's target: at most 1% of decode throughput
# at 64 streams and of the CPU demo's TTFT, metrics on against off). Three daemon pairs, CPU
# backend and the tiny preset, that differ only in --metrics: off, off2 (a second identical pair:
# the difference between two pairs that differ in nothing) and on (--metrics on both daemons,
# scraped every 0.5 s by a loop here throughout). TTFT: auth_overhead interleaves the three
# pairs' requests round by round (p50 against off's, 95% confidence interval). Throughput:
# `kvstream bench itl` with 64 steady streams and nothing landing, one short run per pair per
# round, the pairs' order rotated each round; bench/metrics_overhead.py prints each pair's
# tokens/s median and spread and on/off per round. Before them, metrics_cost measures the same
# cost in-process (ns per histogram observation, us per scrape), which a noisy machine cannot blur.
# Knobs: METRICS_RUNS (600 TTFT rounds), METRICS_ROUNDS (8 throughput rounds), METRICS_PHASE_S
# (4), METRICS_STREAMS (64), METRICS_PROMPT_LEN (64), UCX_TLS (tcp).
suite_metrics() {
  local runs=${METRICS_RUNS:-600} rounds=${METRICS_ROUNDS:-8} phase=${METRICS_PHASE_S:-4}
  local streams=${METRICS_STREAMS:-64} plen=${METRICS_PROMPT_LEN:-64}
  [[ ${SMOKE:-0} == 1 ]] && { runs=20; rounds=1; phase=1; }
  local common=(--model tiny --backend cpu --threads 1 --ucx_tls "${UCX_TLS:-tcp}" --log_level warn
                --drain_delay_ms 0)
  local mode port pp dp modes=() decodes=() mports=()
  for mode in off off2 on; do
    local ma=() pa=()
    [[ $mode == on ]] && {
      pa=(--metrics 127.0.0.1:0 --metrics_port_file "$TMP/prefill_$mode.mport")
      ma=(--metrics 127.0.0.1:0 --metrics_port_file "$TMP/decode_$mode.mport"); }
    next_port; port=$PORT_BASE
    spawn "$TMP/prefill_$mode.log" "$BIN/kvstream-prefill" "${common[@]}" "${pa[@]}" \
      --listen "127.0.0.1:$port" --port_file "$TMP/prefill_$mode.port"
    pp=$SPAWNED
    spawn "$TMP/decode_$mode.log" "$BIN/kvstream-decode" "${common[@]}" "${ma[@]}" \
      --max_batch $(( streams + 8 )) --pool_blocks $(( streams * 24 + 256 )) \
      --listen 127.0.0.1:0 --peer "127.0.0.1:$port" --port_file "$TMP/decode_$mode.port"
    dp=$SPAWNED
    if ! wait_port "$TMP/prefill_$mode.port" "$pp" || ! wait_port "$TMP/decode_$mode.port" "$dp"; then
      say "metrics: the $mode daemons did not come up"
      daemon_tails "metrics $mode" "$TMP/prefill_$mode.log" "$TMP/decode_$mode.log"
      return
    fi
    modes+=(--mode "$mode=127.0.0.1:$PORT_READ")
    decodes+=("$mode=127.0.0.1:$PORT_READ")
  done
  if [[ $DRY_RUN != 1 ]]; then
    wait_port "$TMP/decode_on.mport" "$dp" && mports+=("$PORT_READ")
    wait_port "$TMP/prefill_on.mport" "$pp" && mports+=("$PORT_READ")
  fi
  # The scraper: both "on" endpoints every 0.5 s (Prometheus' default is 15 s).
  local IFS_=$IFS; IFS=,
  spawn "$TMP/scraper.log" python3 "$BENCH/metrics_overhead.py" --scrape "${mports[*]}"
  IFS=$IFS_
  local j; j=$(jtmp metrics)
  # In-process first (no daemon, no network): ns per observation, us per scrape.
  have metrics_cost && step "metrics cost in-process" metrics_cpu 120 - "$BIN/metrics_cost"
  step "metrics TTFT on/off" metrics_cpu "${STEP_TIMEOUT:-280}" "$j" "$BIN/auth_overhead" "${modes[@]}" \
    --runs "$runs" --warmup 10 --prompt-len "$plen" --max-new-tokens 1 --json-out "$j"
  local jt r k; jt=$(jtmp metrics_tput)
  local order=("${decodes[@]}")
  for (( r = 0; r < rounds; r++ )); do
    for (( k = 0; k < ${#order[@]}; k++ )); do
      local md=${order[$(( (k + r) % ${#order[@]} ))]}
      step "metrics tokens/s ${md%%=*} round $r" metrics_cpu 120 "$jt.$r.${md%%=*}" \
        "$BIN/kvstream" bench itl --decode "${md#*=}" --streams "$streams" --stream-prompt-len 16 \
        --stream-max-tokens 256 --landing-clients 0 --phases idle --rounds 1 --phase-s "$phase" \
        --warmup-s 1 --settle-ms 0 --label "metrics=${md%%=*}" --json-out "$jt.$r.${md%%=*}"
      [[ $DRY_RUN == 1 ]] || cat "$jt.$r.${md%%=*}" >> "$jt" 2> /dev/null
    done
  done
  for p in "${DAEMON_PIDS[@]}"; do stop_pid "$p"; done
  daemon_tails "metrics" "$TMP"/prefill_*.log "$TMP"/decode_*.log "$TMP/scraper.log"
  [[ $DRY_RUN == 1 ]] && { echo "python3 $BENCH/metrics_overhead.py $j $jt"; return; }
  grep -E "^(metrics_cost|auth_overhead|mode|off|off2|on) " "$(logf metrics_cpu)" 2> /dev/null
  python3 "$BENCH/metrics_overhead.py" "$j" "$jt" | tee -a "$(logf metrics_cpu)"
}
