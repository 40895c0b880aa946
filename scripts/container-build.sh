#!/usr/bin/env bash
# Builds deploy/docker/Dockerfile with Debian's buildah, as root, without a daemon, on a base
# image made here from Debian packages (debootstrap), since registries of images are out of
# reach; then runs the image's programs. The CUDA twin of the same file is built with Docker on
# NVIDIA's base images (deploy/README.md).
#
#   scripts/container-build.sh [TAG]      (default TAG localhost/kvstream:latest)
#
# State (the base image, layers) lives in KVSTREAM_CONTAINER_DIR (/var/cache/kvstream-container):
# the base is made once, and unchanged layers (install-deps.sh) are reused by later builds;
# KVSTREAM_CONTAINER_PRUNE=1 removes the built image and every layer not under a tagged image
# at the end (the base stays).
# Storage: overlay where this process may mount an overlayfs there (root on a kernel with
# overlayfs, as in this project's CI container: layers share files), else vfs (every layer a
# whole copy, ~4x the disk); KVSTREAM_CONTAINER_STORAGE=vfs|overlay forces one. Isolation:
# chroot (no user namespaces needed: works inside a container). Prints how long each part took.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-localhost/kvstream:latest}
dir=${KVSTREAM_CONTAINER_DIR:-/var/cache/kvstream-container}
base=localhost/kvstream-base:bookworm
mirror=${KVSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
for tool in buildah podman debootstrap; do
  command -v $tool >/dev/null || { echo "container-build: $tool missing (scripts/install-deps.sh --container)" >&2; exit 1; }
done
mkdir -p "$dir"
overlay_works() {  # can this process mount an overlayfs under $dir?
  local t
  t=$(mktemp -d "$dir/overlay-probe.XXXXXX") || return 1
  mkdir "$t/l" "$t/u" "$t/w" "$t/m"
  local rc=1
  if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
    umount "$t/m" && rc=0
  fi
  rm -rf "$t"
  return $rc
}
driver=${KVSTREAM_CONTAINER_STORAGE:-}
if [[ -z $driver ]]; then
  if overlay_works; then driver=overlay; else driver=vfs; fi
fi
[[ $driver == overlay || $driver == vfs ]] ||
  { echo "container-build: KVSTREAM_CONTAINER_STORAGE=$driver (overlay or vfs)" >&2; exit 2; }
# One store per driver: containers/storage refuses a store made by another driver.
store=(--root "$dir/storage-$driver" --runroot "$dir/run-$driver" --storage-driver "$driver")
echo "container-build: storage driver $driver in $dir/storage-$driver"
t0=$SECONDS
if ! buildah "${store[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  rootfs=$(mktemp -d "$dir/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
    { tail -20 "$dir/debootstrap.log" >&2; exit 1; }
  tar -C "$rootfs" -c . | podman "${store[@]}" import - "$base" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  echo "container-build: base image $base made with debootstrap in $((SECONDS - t0)) s"
fi
t1=$SECONDS
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
buildah "${store[@]}" bud --isolation chroot --layers -f "$root/deploy/docker/Dockerfile" \
  --build-arg BASE="$base" --build-arg KVSTREAM_GIT_COMMIT="$commit" \
  --build-arg KVSTREAM_JOBS="${KVSTREAM_JOBS:-$(nproc)}" -t "$tag" "$root"
echo "container-build: image $tag built in $((SECONDS - t1)) s"
# The image's programs run in it: --version of each, the decode's --help. As root: under chroot
# isolation with vfs storage the image's root directory is the store's 0700 directory, which
# the image's USER (kvstream) cannot enter (on a real runtime it can).
ctr=$(buildah "${store[@]}" from "$tag")
trap 'buildah "${store[@]}" rm "$ctr" >/dev/null' EXIT
for p in kvstream-prefill kvstream-decode kvstream; do
  buildah "${store[@]}" run --isolation chroot --user root "$ctr" -- /usr/local/bin/$p --version
done
buildah "${store[@]}" run --isolation chroot --user root "$ctr" -- /usr/local/bin/kvstream-decode --help >/dev/null
echo "container-build: the image's programs run ($((SECONDS - t0)) s in all)"
echo "container-build: storage $(du -sh "$dir/storage-$driver" 2>/dev/null | cut -f1) in $dir/storage-$driver"
if [[ ${KVSTREAM_CONTAINER_PRUNE:-0} != 0 ]]; then
  buildah "${store[@]}" rm "$ctr" >/dev/null && trap - EXIT
  buildah "${store[@]}" rmi -f "$tag" >/dev/null
  buildah "${store[@]}" rmi --prune >/dev/null
  echo "container-build: pruned; storage $(du -sh "$dir/storage-$driver" 2>/dev/null | cut -f1) left"
fi
