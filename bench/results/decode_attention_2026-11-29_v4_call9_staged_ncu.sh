#!/usr/bin/env bash
set -uo pipefail
source .devlibs-kern5/env.sh
d=.devbuild/kstage; w=$OUT/kstagencu; mkdir -p $w
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
# variants' first launches: v2 main (+combine), kernel main (+combine), staged main (+combine), auto...
timeout 150 "$ncu_bin" --clock-control none -k regex:'PagedDecode' --launch-skip 0 --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  "$d/decode_attention" --models llama-3-8b --batches 64 --contexts 16384 --schedules kernel,staged --early "" \
  --distances "" --replays 1 > $w/ncu.txt 2>&1; echo "rc=$?"
grep -E "PagedDecodeKernel|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Shared Memory Config|Dynamic Shared|Stall|Warp Cycles Per Issued|Memory Throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" $w/ncu.txt | cut -c1-150 | head -90
cd $OUT && tar czf all.tgz kstagencu
