#!/usr/bin/env bash
# Sitting C (issue 15): every GPU test of main after the trust changes; cuda_ipc / ucx_staged
# transfers before (bins_b new = main before issue 15) vs after, interleaved; TTFT through the
# daemons on the GPU (cuda_ipc with and without gpu_landed_wait, ucx_staged).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
FINAL=$OUT; OUT=/tmp/sitting; mkdir -p $OUT
trap 'tar czf $FINAL/sitting_c.tgz -C /tmp sitting' EXIT
mkdir -p .dev/x && tar xJf .dev/bins_b.tar.xz -C .dev/x && tar xJf .dev/bins_c.tar.xz -C .dev/x
source .dev/devlibs/env.sh
nvidia-smi -L; date -u
N=.dev/x/cur/bin O=.dev/x/new/bin
export KVSTREAM_PREFILL_BIN=$PWD/$N/kvstream-prefill KVSTREAM_DECODE_BIN=$PWD/$N/kvstream-decode
for tt in kernels_paged_attention_test:90 layer_kernels_test:60 cuda_backend_test:90 scatter_copy_gpu_test:40 landed_event_gpu_test:50 transport_gpu_test:100 nccl_transport_gpu_test:20 daemons_gpu_test:150; do
  t=${tt%%:*}; lim=${tt##*:}
  timeout -k 5 $lim $N/$t > $OUT/$t.log 2>&1; rc=$?
  echo "TEST $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED' $OUT/$t.log | tr '\n' ' ') t=$((SECONDS-T0))s"
  grep -E '^\[  FAILED  \]' $OUT/$t.log | head -5
done
for round in 1 2; do
  for tag in before after; do
    B=$O; [[ $tag == after ]] && B=$N
    timeout -k 5 60 $B/transfer_gpu --device=0 --rx-device=0 --backends=cuda_ipc --models=llama-3-8b --iters=30 --json=$OUT/ipc_${tag}_$round.jsonl > $OUT/ipc_${tag}_$round.log 2>&1
    timeout -k 5 60 $B/transfer_gpu --device=0 --rx-device=0 --backends=ucx_staged --models=llama-3-8b --iters=10 --json=$OUT/staged_${tag}_$round.jsonl > $OUT/staged_${tag}_$round.log 2>&1
    echo "transfer $tag round $round done t=$((SECONDS-T0))s"
  done
done
python3 - $OUT <<'PY'
import json,sys,glob,statistics,collections
d=collections.defaultdict(list)
for f in glob.glob(sys.argv[1]+'/*_?.jsonl'):
    tag=f.split('/')[-1].split('_')[1]
    for l in open(f):
        if l.startswith('{'):
            j=json.loads(l); d[(j['backend'],j['case'],tag)].append(j['gbps'])
for (b,c,t) in sorted(d):
    if t!='before': continue
    o=d[(b,c,'before')]; n=d.get((b,c,'after'),[0])
    if max(o)>0: print(f"{b:18s} {c:16s} before {o} after {n} ratio(median) {statistics.median(n)/statistics.median(o):.3f}")
PY
left=$(( 560 - (SECONDS - T0) ))
if (( left > 60 )); then
  BUDGET=$left bash bench/run.sh ttft BIN=$N OUT=$OUT/bench MODELS=llama-3-8b TRANSPORTS="cuda_ipc ucx_staged" \
    LANDED_WAIT=both LENS_llama_3_8b=1024,4096 REQUESTS=3 2>&1 | tail -40
fi
echo "done t=$((SECONDS-T0))s"
