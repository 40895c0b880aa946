#!/usr/bin/env bash
# Builds UCX with CUDA support from Debian's own UCX source package and installs it under the
# build folder (default build/ucx-cuda). Run through `scripts/install-deps.sh --ucx-cuda`, which
# first installs the build dependencies from this system's (Debian 12) packages. Then build
# kvstream against it: `scripts/build.sh -DKVSTREAM_UCX_ROOT=$PWD/build/ucx-cuda`.
#
# The source comes through a private apt state (deb-src lines for the suites below, lists and
# downloads under the work folder): the system's apt sources are left as they are, and no binary
# package of another release is installed. Safe to run twice: a finished install is kept.
#
# Settings (environment):
#   KVSTREAM_UCX_VERSION  Debian source version, e.g. 1.13.1-1; "auto" (default): the newest
#                         release (no ~rc) in KVSTREAM_UCX_SUITES whose source downloads
#   KVSTREAM_UCX_SUITES   Debian suites to look in (default "trixie bookworm")
#   KVSTREAM_UCX_PREFIX   install prefix (default ${KVSTREAM_BUILD_DIR:-build}/ucx-cuda)
#   KVSTREAM_DEBIAN_MIRROR  default http://deb.debian.org/debian
#   CUDA_HOME             CUDA toolkit (default /usr/local/cuda)
#   KVSTREAM_JOBS         make -j (default nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVSTREAM_BUILD_DIR:-$root/build}
prefix=${KVSTREAM_UCX_PREFIX:-$build/ucx-cuda}
work=$prefix.work
want=${KVSTREAM_UCX_VERSION:-auto}
suites=${KVSTREAM_UCX_SUITES:-trixie bookworm}
mirror=${KVSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=${KVSTREAM_JOBS:-$(nproc)}
stamp=$prefix/.kvstream-ucx-cuda

say() { echo "ucx-cuda: $*"; }
die() { echo "ucx-cuda: error: $*" >&2; exit 1; }

# ---- already done? ----------------------------------------------------------------------------
if [[ -f $stamp && -x $prefix/bin/ucx_info ]]; then
  have=$(sed -n 's/^version=//p' "$stamp")
  if [[ $want == auto || $want == "$have" ]]; then
    say "UCX $have with CUDA already installed in $prefix (remove it to rebuild)"
    exit 0
  fi
  say "installed UCX $have differs from KVSTREAM_UCX_VERSION=$want: rebuilding"
  rm -rf "$prefix"
fi

# ---- what it needs ----------------------------------------------------------------------------
[[ -f $cuda/include/cuda.h ]] || die "no CUDA toolkit at $cuda (set CUDA_HOME)"
for tool in apt-get apt-cache dpkg-source autoreconf libtoolize make gcc g++ pkg-config; do
  command -v "$tool" >/dev/null ||
    die "$tool is missing: run scripts/install-deps.sh --ucx-cuda (it installs the build dependencies)"
done
for hdr in numa.h infiniband/verbs.h rdma/rdma_cma.h; do
  [[ -f /usr/include/$hdr ]] ||
    die "/usr/include/$hdr is missing: run scripts/install-deps.sh --ucx-cuda"
done

# ---- the source, through a private apt state ----------------------------------------------------
apt_dir=$work/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
cat > "$apt_dir/sources.list.d/ucx-src.sources" <<EOF
Types: deb-src
URIs: $mirror
Suites: $suites
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
       -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
       -o APT::Sandbox::User=root)
lists_stamp=$apt_dir/lists.suites
if [[ ! -f $lists_stamp || $(cat "$lists_stamp") != "$mirror $suites" ||
      -n $(find "$lists_stamp" -mmin +1440) ]]; then
  say "fetching the source lists of: $suites"
  apt-get "${apt_o[@]}" -qq update || die "apt-get update of the deb-src lists failed (mirror $mirror)"
  echo "$mirror $suites" > "$lists_stamp"
fi

# Versions Debian carries, newest first (dpkg's order).
mapfile -t carried < <(apt-cache "${apt_o[@]}" showsrc ucx 2>/dev/null | sed -n 's/^Version: //p' | sort -u)
((${#carried[@]})) || die "no ucx source package in suites: $suites"
sorted=()
for v in "${carried[@]}"; do
  i=0
  while ((i < ${#sorted[@]})) && dpkg --compare-versions "${sorted[i]}" gt "$v"; do i=$((i + 1)); done
  sorted=("${sorted[@]:0:i}" "$v" "${sorted[@]:i}")
done
say "Debian carries ucx ${sorted[*]} (suites: $suites)"

if [[ $want == auto ]]; then
  candidates=()
  for v in "${sorted[@]}"; do [[ $v == *'~'* ]] || candidates+=("$v"); done
else
  printf '%s\n' "${sorted[@]}" | grep -qxF -- "$want" ||
    die "ucx $want is not in suites $suites (they carry: ${sorted[*]})"
  candidates=("$want")
fi

version=""
for v in "${candidates[@]}"; do
  dl=$work/dl-$v
  if [[ -d $dl && -n $(ls "$dl"/*.dsc 2>/dev/null) ]] && [[ -f $dl/.complete ]]; then
    version=$v; break
  fi
  rm -rf "$dl"; mkdir -p "$dl"
  if (cd "$dl" && apt-get "${apt_o[@]}" -qq source --download-only "ucx=$v" > "$dl.log" 2>&1); then
    touch "$dl/.complete"; version=$v; break
  fi
  say "ucx $v: the source did not download ($(grep -m1 -o 'Failed to fetch.*' "$dl.log" || tail -1 "$dl.log"))"
done
[[ -n $version ]] || die "no ucx source could be downloaded from $mirror (tried: ${candidates[*]})"
say "building UCX $version with CUDA from $cuda"

upstream=${version%-*}; upstream=${upstream%+ds}; upstream=${upstream#*:}
src=$work/ucx-$version
if [[ ! -f $src/.extracted ]]; then
  rm -rf "$src"
  # dpkg-source applies Debian's patches (debian/patches) as the Debian build does.
  (cd "$work" && dpkg-source -x "$work/dl-$version"/ucx_*.dsc "$src" > "$work/extract-$version.log") ||
    die "dpkg-source -x failed (see $work/extract-$version.log)"
  touch "$src/.extracted"
fi
# kvstream's own patches for building with a newer CUDA (scripts/ucx-cuda-patches): each one is
# applied where it applies cleanly to this version, and said so.
for p in "$root"/scripts/ucx-cuda-patches/*.patch; do
  [[ -f $p ]] || continue
  name=$(basename "$p")
  [[ -f $src/.patched-$name ]] && continue
  if patch -d "$src" -p1 --forward --dry-run -s < "$p" > /dev/null 2>&1; then
    patch -d "$src" -p1 --forward -s < "$p" || die "patch $name failed"
    touch "$src/.patched-$name"
    say "applied $name"
  else
    say "$name does not apply to ucx $version: left out"
  fi
done
if [[ ! -x $src/configure ]]; then
  say "autogen.sh"
  # GIT_CEILING_DIRECTORIES: UCX stamps its version with `git rev-parse`; the source sits inside
  # kvstream's checkout, whose revision it would take.
  (cd "$src" && GIT_CEILING_DIRECTORIES=$work ./autogen.sh > "$work/autogen-$version.log" 2>&1) ||
    die "autogen.sh failed (see $work/autogen-$version.log)"
fi

# ---- NVML (nvml.h, libnvidia-ml) ------------------------------------------------------------------
# UCX's CUDA transports need NVML's header and library to build; at run time the GPU host's driver
# provides libnvidia-ml.so.1. A toolkit from NVIDIA's installers has both; one without them (as
# here, from NVIDIA's wheels) gets them from this Debian release's non-free libnvidia-ml-dev and
# libnvidia-ml1, unpacked under the work folder (not installed).
nvml_flags=()
have_nvml_h=0; have_nvml_so=0
for d in "$cuda/include" /usr/include; do [[ -f $d/nvml.h ]] && have_nvml_h=1; done
for d in "$cuda/lib64/stubs" "$cuda/lib/stubs" "$cuda/lib64" /usr/lib/x86_64-linux-gnu; do
  [[ -e $d/libnvidia-ml.so ]] && have_nvml_so=1
done
if ((!have_nvml_h || !have_nvml_so)); then
  nvml=$work/nvml
  if [[ ! -f $nvml/.complete ]]; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:?}")
    say "NVML: not in $cuda; taking it from Debian $codename non-free (libnvidia-ml-dev, libnvidia-ml1)"
    rm -rf "$nvml"
    mkdir -p "$nvml/apt/sources.list.d" "$nvml/apt/lists/partial" "$nvml/apt/cache/archives/partial" \
      "$nvml/deb" "$nvml/lib"
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: non-free\nSigned-By: %s\n' "$mirror" \
      "$codename" /usr/share/keyrings/debian-archive-keyring.gpg > "$nvml/apt/sources.list.d/nvml.sources"
    nvml_o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$nvml/apt/sources.list.d"
            -o "Dir::State::Lists=$nvml/apt/lists" -o "Dir::Cache=$nvml/apt/cache"
            -o APT::Sandbox::User=root)
    apt-get "${nvml_o[@]}" -qq update || die "apt-get update of $codename non-free failed"
    (cd "$nvml/deb" && apt-get "${nvml_o[@]}" -qq download libnvidia-ml-dev libnvidia-ml1) ||
      die "could not download libnvidia-ml-dev and libnvidia-ml1 from $codename non-free"
    for deb in "$nvml"/deb/*.deb; do dpkg-deb -x "$deb" "$nvml/root"; done
    so=$(find "$nvml/root" -name 'libnvidia-ml.so.[0-9]*.*' | head -1)
    [[ -n $so && -f $nvml/root/usr/include/nvml.h ]] || die "the NVML packages held no nvml.h or libnvidia-ml.so"
    ln -sf "$so" "$nvml/lib/libnvidia-ml.so"
    ln -sf "$so" "$nvml/lib/libnvidia-ml.so.1"
    touch "$nvml/.complete"
  fi
  nvml_flags=(CPPFLAGS="-I$nvml/root/usr/include" LDFLAGS="-L$nvml/lib")
fi

# ---- configure, build, install ------------------------------------------------------------------
obj=$work/obj-$version
mkdir -p "$obj"
# As Debian's rules (mt, cma, verbs, numa), plus CUDA; rdmacm so GPUDirect RDMA can work on hosts
# with RDMA NICs. gdr_copy needs gdrcopy, which Debian does not package: configure leaves it out.
conf=(--prefix="$prefix" --with-cuda="$cuda" --with-verbs --with-rdmacm --enable-mt --enable-cma
      --disable-backtrace-detail --without-java --without-go --disable-doxygen-doc "${nvml_flags[@]}")
if [[ ! -f $obj/config.status || $(cat "$obj/.conf" 2>/dev/null) != "${conf[*]}" ]]; then
  say "configure ${conf[*]}"
  (cd "$obj" && "$src/configure" "${conf[@]}" > "$work/configure-$version.log" 2>&1) ||
    die "configure failed (see $work/configure-$version.log and $obj/config.log)"
  echo "${conf[*]}" > "$obj/.conf"
fi
grep -q '^#define HAVE_CUDA 1' "$obj/config.h" ||
  die "configure did not enable CUDA (see $work/configure-$version.log: cuda.h / libcuda found?)"
say "make -j$jobs (log: $work/make-$version.log)"
make -C "$obj" -j"$jobs" > "$work/make-$version.log" 2>&1 ||
  { grep -m5 -B2 -A3 'error:' "$work/make-$version.log" >&2 || true
    die "make failed (see $work/make-$version.log)"; }
make -C "$obj" install > "$work/install-$version.log" 2>&1 ||
  die "make install failed (see $work/install-$version.log)"
[[ -f $prefix/lib/ucx/libuct_cuda.so.0 ]] ||
  die "installed, but the CUDA transports (lib/ucx/libuct_cuda.so.0) were not built"
printf 'version=%s\nupstream=%s\ncuda=%s\nconfigure=%s\n' "$version" "$upstream" "$cuda" "${conf[*]}" > "$stamp"
say "UCX $version with CUDA installed in $prefix"
say "next: scripts/build.sh -DKVSTREAM_UCX_ROOT=$prefix"
