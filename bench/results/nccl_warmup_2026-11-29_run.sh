#!/usr/bin/env bash
# ---- ncclwarm: NCCL warm-up at Connect (helper-22's snippet) ----
set -uo pipefail
source .devlibs-ncclwarm/env.sh
export NCCL_NVLS_ENABLE=0
W=.devbuild/ncclwarm; L=$OUT/ncclwarm; mkdir -p $L
date -u > $L/gpus.txt; nvidia-smi -L >> $L/gpus.txt 2>&1
timeout 240 $W/nccl_transport_gpu_test > $L/nccl_transport_gpu_test.log 2>&1; echo "rc=$?" >> $L/nccl_transport_gpu_test.log
KVSTREAM_NCCL_TRACE=1 timeout 90 $W/nccl_transport_gpu_test --gtest_filter='*FirstWriteAfterConnectIsFast' > $L/first_write_trace.log 2>&1; echo "rc=$?" >> $L/first_write_trace.log
KVSTREAM_PREFILL_BIN=$PWD/$W/kvstream-prefill KVSTREAM_DECODE_BIN=$PWD/$W/kvstream-decode timeout 200 $W/daemons_gpu_test --gtest_filter='TwoGpus/DaemonsGpuTest.*/nccl:*.GpuLandedWaitTokensEqualColocated/*' > $L/daemons_gpu_test.log 2>&1; echo "rc=$?" >> $L/daemons_gpu_test.log
grep -hE '^\[(direct|pack)|PASSED|FAILED|SKIP|rc=|Failure' $L/*.log
tar -C $OUT -czf $OUT/all.tgz ncclwarm
