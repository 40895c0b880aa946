#!/usr/bin/env bash
# Sitting A: transport GPU tests of the reorganised tree, then old vs new smoke benches side by side.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
FINAL=$OUT; OUT=/tmp/sitting; mkdir -p $OUT
trap 'tar czf $FINAL/sitting_a.tgz -C /tmp sitting' EXIT
mkdir -p .dev/x && tar xJf .dev/bins.tar.xz -C .dev/x
source .dev/devlibs/env.sh
nvidia-smi -L; date -u
export KVSTREAM_PREFILL_BIN=$PWD/.dev/x/new/bin/kvstream-prefill KVSTREAM_DECODE_BIN=$PWD/.dev/x/new/bin/kvstream-decode
for tt in scatter_copy_gpu_test:40 landed_event_gpu_test:50 transport_gpu_test:100 nccl_transport_gpu_test:20; do
  t=${tt%%:*}; lim=${tt##*:}
  timeout -k 5 $lim .dev/x/new/bin/$t > $OUT/$t.log 2>&1; rc=$?
  echo "TEST $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)|tests ran' $OUT/$t.log | tr '\n' ' ') $(grep -c '^\[  FAILED' $OUT/$t.log) failed-lines  t=$((SECONDS-T0))s"
done
for tag in old new; do
  bash bench/run.sh transfer ttft decode SMOKE=1 BIN=.dev/x/$tag/bin OUT=$OUT/bench --tag $tag BUDGET=165 > $OUT/bench_$tag.txt 2>&1
  echo "== bench $tag done t=$((SECONDS-T0))s"; tail -40 $OUT/bench_$tag.txt
done
