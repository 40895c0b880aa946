#!/usr/bin/env bash
# Sitting B: every GPU test of the final tree; cuda_ipc / ucx_staged transfers old vs new, interleaved.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
FINAL=$OUT; OUT=/tmp/sitting; mkdir -p $OUT
trap 'tar czf $FINAL/sitting_b.tgz -C /tmp sitting' EXIT
mkdir -p .dev/x && tar xJf .dev/bins_b.tar.xz -C .dev/x
source .dev/devlibs/env.sh
nvidia-smi -L; date -u
N=.dev/x/new/bin O=.dev/x/old/bin
export KVSTREAM_PREFILL_BIN=$PWD/$N/kvstream-prefill KVSTREAM_DECODE_BIN=$PWD/$N/kvstream-decode
for tt in kernels_paged_attention_test:90 layer_kernels_test:60 cuda_backend_test:90 scatter_copy_gpu_test:40 landed_event_gpu_test:50 transport_gpu_test:100 nccl_transport_gpu_test:20 daemons_gpu_test:150; do
  t=${tt%%:*}; lim=${tt##*:}
  timeout -k 5 $lim $N/$t > $OUT/$t.log 2>&1; rc=$?
  echo "TEST $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED' $OUT/$t.log | tr '\n' ' ') t=$((SECONDS-T0))s"
  grep -E '^\[  FAILED  \]' $OUT/$t.log | head -5
done
for round in 1 2; do
  for tag in old new; do
    B=.dev/x/$tag/bin
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
    if t!='old': continue
    o=d[(b,c,'old')]; n=d.get((b,c,'new'),[0])
    if max(o)>0: print(f"{b:18s} {c:16s} old {o} new {n} ratio(median) {statistics.median(n)/statistics.median(o):.3f}")
PY
echo "done t=$((SECONDS-T0))s"
