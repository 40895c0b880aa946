#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest; then the CPU suites again
# under AddressSanitizer + UndefinedBehaviorSanitizer with the fuzz targets (scripts/test-san.sh;
# KVSTREAM_SANITIZE_TESTS=0 skips that part). Arguments go to both ctest runs.
# GPU tests (label gpu) report "skipped" with the reason where no GPU is present.
# Then the container file is built with buildah on a debootstrap base and its programs run
# (scripts/container-build.sh; what it costs: deploy/README.md); KVSTREAM_CONTAINER_TEST=0 skips
# that part. The built image and its intermediate layers are removed afterwards (the base image
# and the store stay for the next run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
phase_start=$SECONDS
phase() {  # phase NAME: prints how long the phase that just ended took
  echo "test.sh: $1 took $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}
disk() {  # disk WHEN: free space where the build trees live (a full run needs ~5 GiB)
  echo "test.sh: free disk $1: $(df -h --output=avail "$root" | tail -1 | tr -d ' ')"
}
disk "at the start"
container=${KVSTREAM_CONTAINER_TEST:-1}
if [[ $container != 0 ]]; then "$root/scripts/install-deps.sh" --container; else "$root/scripts/install-deps.sh"; fi
phase "install-deps"
"$root/scripts/build.sh"
phase "build"
build=${KVSTREAM_BUILD_DIR:-$root/build}
rc=0
(cd "$build" && ctest --output-on-failure -j "${KVSTREAM_TEST_JOBS:-2}" --timeout 900 "$@") || rc=$?
phase "tests"
if [[ ${KVSTREAM_SANITIZE_TESTS:-1} != 0 ]]; then
  "$root/scripts/test-san.sh" "$@" || rc=$?
  phase "sanitizer build and tests (fuzzing included)"
fi
if [[ $container != 0 ]]; then
  KVSTREAM_CONTAINER_PRUNE=1 "$root/scripts/container-build.sh" localhost/kvstream:test || rc=$?
  phase "container build (buildah, debootstrap base)"
fi
disk "at the end"
exit $rc
