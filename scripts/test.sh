#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest.
# GPU tests (label gpu) report "skipped" with the reason where no GPU is present.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${KVSTREAM_BUILD_DIR:-$root/build}
cd "$build"
ctest --output-on-failure -j "${KVSTREAM_TEST_JOBS:-2}" --timeout 900 "$@"
