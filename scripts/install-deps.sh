#!/usr/bin/env bash
# Installs what kvstream needs from Debian 12 packages. Safe to run twice; installs only
# what is missing. The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected at /usr/local/cuda when
# present; without it the CPU-only configuration is built.
#
#   --ucx-cuda  also build UCX with CUDA from Debian's UCX source package into build/ucx-cuda
#               (scripts/ucx-cuda.sh; takes a while), for -DKVSTREAM_UCX_ROOT=build/ucx-cuda.
#               See docs/transports.md, "A CUDA-enabled UCX".
#   --container also what scripts/container-build.sh needs: buildah, podman, debootstrap.
set -euo pipefail
ucx_cuda=0
container=0
for arg in "$@"; do
  case $arg in
    --ucx-cuda) ucx_cuda=1 ;;
    --container) container=1 ;;
    *) echo "install-deps: unknown argument $arg (known: --ucx-cuda, --container)" >&2; exit 2 ;;
  esac
done
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev ucx-utils
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev
  libpcre2-dev libicu-dev libsentencepiece-dev  # tokenizer/: pre-tokenizer patterns, NFC, .model files
  prometheus-cpp-dev  # the daemons' metrics endpoint (core + civetweb exposer)
  prometheus          # promtool and the server, for the metrics tests (tests/daemons)
  libssl-dev  # SHA-256 of the prefix directory (kvcache/); TLS of the HTTP endpoint
  libhiredis-dev redis-server  # the L4 shared KV tier (kvcache/redis_store.h) and its tests
  libboost-dev  # frontend/: the HTTP endpoint (header-only Boost.Beast and Asio)
  curl          # the HTTP endpoint's tests and the demo
  iproute2 procps python3 openssl
  clang libclang-rt-14-dev  # the sanitizer build and libFuzzer (scripts/test-san.sh)
  yamllint python3-yaml systemd  # the deploy files' checks (tests/deploy)
  python3-jinja2  # the reference the chat template renderer is tested against (tests/frontend)
  haproxy  # the balancer in front of several decodes' HTTP endpoints (deploy/haproxy, tests/daemons)
  python3-matplotlib  # scripts/plot_bench_serve.py (kvstream bench serve's PNG; tests/cli)
  fio  # bench/disk_tier.sh: the disk tier's reads against fio --direct=1
)
# What building UCX from its Debian source needs (this system's packages only).
UCX_BUILD_PKGS=(
  dpkg-dev autoconf automake libtool make
  libnuma-dev libibverbs-dev librdmacm-dev
)
((ucx_cuda)) && PKGS+=("${UCX_BUILD_PKGS[@]}")
((container)) && PKGS+=(buildah podman debootstrap)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
# The Kubernetes schemas the deploy check validates the manifests against (tests/deploy): npm's
# kubernetes-models, pinned, into KVSTREAM_NODE_DIR, where npm is (this project's machines have
# Node.js; without it, e.g. in the container's build stage, that one check is skipped).
node_dir=${KVSTREAM_NODE_DIR:-/usr/local/lib/kvstream-node}
k8s_models=kubernetes-models@4.5.1
if ! command -v npm >/dev/null; then
  echo "install-deps: no npm: tests/deploy will skip the Kubernetes schema check"
elif [ "$(cat "$node_dir/.installed" 2>/dev/null)" != "$k8s_models" ]; then
  echo "install-deps: installing $k8s_models into $node_dir"
  $SUDO mkdir -p "$node_dir"
  $SUDO npm install --prefix "$node_dir" --no-audit --no-fund --loglevel=error "$k8s_models"
  echo "$k8s_models" | $SUDO tee "$node_dir/.installed" >/dev/null
fi
if ((ucx_cuda)); then
  "$(dirname "$0")/ucx-cuda.sh"
fi
