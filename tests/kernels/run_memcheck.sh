#!/usr/bin/env bash
# compute-sanitizer memcheck of a small decode-attention case. Exit 77 (CTest: skipped) with the
# reason when compute-sanitizer or a usable GPU is missing.
#   usage: run_memcheck.sh TEST_BINARY
set -uo pipefail
bin=${1:?usage: run_memcheck.sh TEST_BINARY}
cs=$(command -v compute-sanitizer || true)
[[ -z $cs && -x /usr/local/cuda/bin/compute-sanitizer ]] && cs=/usr/local/cuda/bin/compute-sanitizer
[[ -z $cs ]] && for f in /opt/nvidia/nsight-compute/*/compute-sanitizer/compute-sanitizer; do [[ -x $f ]] && cs=$f; done
if [[ -z $cs ]]; then echo "SKIP: compute-sanitizer not found"; exit 77; fi
"$bin" --probe-gpu
rc=$?
if [[ $rc -ne 0 ]]; then echo "SKIP: no usable GPU (probe exit $rc)"; exit 77; fi
exec "$cs" --tool memcheck --error-exitcode 1 --leak-check full "$bin" --gtest_filter='SmallCase.*'
