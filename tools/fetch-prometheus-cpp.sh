#!/usr/bin/env bash
# Builds prometheus-cpp's core library (the router's metrics registry) from Debian unstable's source
# package: Debian 12 has no prometheus-cpp. The orig tarball is fetched with `apt-get source
# --download-only` through a private apt configuration over sid (tools/sid-apt.sh: no host name is
# written here), checked against the SHA-256 of sid's signed Sources index, and built with CMake
# (core only: no pull/push servers, no compression, no tests; static, position-independent) into a
# project-local cache. Nothing is installed system-wide. Idempotent: when the cache holds the
# library it does no network work. Prints the install prefix (CMake's TEXTGEN_PROMETHEUS_CPP_PREFIX,
# whose default is this cache).
#
#   tools/fetch-prometheus-cpp.sh   (cache: $TEXTGEN_PROMETHEUS_CPP_CACHE, else
#                                    ${TEXTGEN_CACHE:-~/.cache/textgen}/prometheus-cpp)
set -euo pipefail
log() { echo "fetch-prometheus-cpp: $*" >&2; }

cache=${TEXTGEN_PROMETHEUS_CPP_CACHE:-${TEXTGEN_CACHE:-${HOME:-/root}/.cache/textgen}/prometheus-cpp}
prefix=$cache/prefix
if [ -f "$prefix/lib/cmake/prometheus-cpp/prometheus-cpp-config.cmake" ]; then
  echo "$prefix"
  exit 0
fi

. "$(cd "$(dirname "$0")" && pwd)/sid-apt.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/textgen-prometheus-cpp.XXXXXX")
trap 'rm -rf "$work"' EXIT
sid_apt_setup "$work" deb-src

# The orig tarball named in sid's Sources record, with its SHA-256 there (the Sources index is
# covered by the suite's signed InRelease). apt-get source may fail on the other parts of the
# source package (the .dsc or debian.tar.xz of a version can be missing from the pool while the
# orig tarball is there): only the orig tarball is needed, and it is checked here.
record=$(apt-cache "${apt_opts[@]}" showsrc prometheus-cpp)
read -r sha size orig < <(awk '/^Checksums-Sha256:/{s=1; next} s && /^ /{ if ($3 ~ /\.orig\.tar\./) {print $1, $2, $3; exit} next } {s=0}' <<<"$record")
[ -n "${orig:-}" ] || { log "no orig tarball in sid's prometheus-cpp source record"; exit 1; }
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only prometheus-cpp >"$work/source.log" 2>&1) || true
[ -f "$work/$orig" ] || { tail -20 "$work/source.log" >&2; log "could not fetch $orig"; exit 1; }
echo "$sha  $work/$orig" | sha256sum -c --quiet - ||
  { log "$orig does not match the SHA-256 of sid's Sources index"; exit 1; }
log "building the core of $orig ($size bytes)"

mkdir -p "$work/src"
tar -xf "$work/$orig" -C "$work/src" --strip-components=1
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DENABLE_PULL=OFF -DENABLE_PUSH=OFF \
  -DENABLE_COMPRESSION=OFF -DENABLE_TESTING=OFF -DUSE_THIRDPARTY_LIBRARIES=OFF \
  -DGENERATE_PKGCONFIG=OFF -DCMAKE_INSTALL_PREFIX="$cache/prefix.tmp" >"$work/cmake.log" 2>&1 ||
  { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }

# Swap the new prefix in whole, so that an interrupted run never leaves half a cache.
mkdir -p "$cache"
rm -rf "$cache/prefix.tmp"
cmake --install "$work/build" >"$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
cp "$work/src/LICENSE" "$cache/prefix.tmp/LICENSE" 2>/dev/null || true  # MIT
echo "$orig" >"$cache/prefix.tmp/VERSION"
rm -rf "$prefix"
mv "$cache/prefix.tmp" "$prefix"
log "$orig -> $prefix"
echo "$prefix"
