#!/usr/bin/env bash
# Builds a real Kubernetes API server for custom resources — apiextensions-apiserver — from Debian
# unstable's Go sources, for the operator's tests (../shared/notes/kubernetes-test-server.md), and
# caches the binary. Nothing is installed system-wide: the Go toolchain and the golang-*-dev source
# packages are fetched with `apt-get download` through a private apt configuration (Debian's
# archive is the only network used) and unpacked into a scratch folder; the build runs in GOPATH
# mode with the network off. Prints the binary's path.
#
#   tools/k8s-test-server/build.sh                  (cache: $TEXTGEN_K8S_CACHE or ~/.cache/textgen/k8s)
#   tools/k8s-test-server/build.sh --print-archive  (only print the archive URI it would use)
set -euo pipefail
log() { echo "k8s-test-server: $*" >&2; }

# The package archive is the one this machine's own apt configuration names (tools/sid-apt.sh): no
# archive host name is written in this repository.
. "$(cd "$(dirname "$0")/.." && pwd)/sid-apt.sh"
if [ "${1:-}" = --print-archive ]; then archive_uri; exit; fi
cache=${TEXTGEN_K8S_CACHE:-${HOME:-/root}/.cache/textgen/k8s}
bin=$cache/apiextensions-apiserver
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d "${TMPDIR:-/tmp}/textgen-k8s-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A private apt configuration over unstable (sid), with no installed packages, so that dependency
# resolution lists everything.
sid_apt_setup "$work"
apt_dir=$work/apt

# The Go compiler sid's golang-go points at, and every golang-* package the API server's sources
# depend on, recursively.
go_pkg=$(apt-cache "${apt_opts[@]}" depends golang-go | awk '/Depends: golang-1\.[0-9]+-go$/{print $2; exit}')
[ -n "$go_pkg" ] || { log "no golang-1.N-go in sid's golang-go"; exit 1; }
go_src=${go_pkg%-go}-src
pkgs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances golang-k8s-apiextensions-apiserver-dev |
  grep -E '^golang-' | sort -u)
log "fetching $go_pkg, $go_src and $(echo "$pkgs" | wc -l) Go source packages"
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download "$go_pkg" "$go_src" $pkgs >"$work/download.log" 2>&1) ||
  { tail -20 "$work/download.log" >&2; exit 1; }
root=$work/root
mkdir -p "$root"
for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$root"; done

goroot=$(ls -d "$root"/usr/lib/go-1.* | head -n 1)
log "building k8s.io/apiextensions-apiserver with $(basename "$goroot") (GOPATH mode, no network)"
(cd "$work" && env GOROOT="$goroot" GOPATH="$root/usr/share/gocode" GO111MODULE=off GOPROXY=off \
  GOFLAGS= GOTOOLCHAIN=local CGO_ENABLED=0 GOCACHE="$work/gocache" \
  "$goroot/bin/go" build -o "$bin.tmp" k8s.io/apiextensions-apiserver) 2>&1 | tail -20 >&2
[ -x "$bin.tmp" ] || { log "build failed"; exit 1; }
mv "$bin.tmp" "$bin"
echo "$bin"
