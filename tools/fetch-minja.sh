#!/usr/bin/env bash
# Fetches Google's minja (the header-only Jinja subset that llama.cpp uses for chat templates) from
# Debian unstable's libminja-dev into a project-local cache, for router/src/chat/. Nothing is
# installed system-wide: the .deb is fetched with `apt-get download` through a private apt
# configuration over sid (the archive is the one this machine's own apt configuration names, so no
# host name is written here) and unpacked with `dpkg -x`. Idempotent: when the headers are already
# in the cache it does no network work. Prints the include directory (CMake's
# TEXTGEN_MINJA_INCLUDE_DIR, whose default is this cache).
#
#   tools/fetch-minja.sh          (cache: $TEXTGEN_MINJA_CACHE, else ${TEXTGEN_CACHE:-~/.cache/textgen}/minja)
set -euo pipefail
log() { echo "fetch-minja: $*" >&2; }

cache=${TEXTGEN_MINJA_CACHE:-${TEXTGEN_CACHE:-${HOME:-/root}/.cache/textgen}/minja}
include=$cache/include
if [ -f "$include/minja/minja.hpp" ] && [ -f "$include/minja/chat-template.hpp" ]; then
  echo "$include"
  exit 0
fi

. "$(cd "$(dirname "$0")" && pwd)/sid-apt.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/textgen-minja.XXXXXX")
trap 'rm -rf "$work"' EXIT
sid_apt_setup "$work"
apt_dir=$work/apt
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download libminja-dev >"$work/download.log" 2>&1) ||
  { tail -20 "$work/download.log" >&2; exit 1; }
deb=$(ls "$apt_dir"/debs/libminja-dev_*.deb)
dpkg -x "$deb" "$work/root"
[ -f "$work/root/usr/include/minja/minja.hpp" ] || { log "$(basename "$deb") has no usr/include/minja/minja.hpp"; exit 1; }

# Swap the new tree in whole, so that an interrupted run never leaves half a cache.
mkdir -p "$cache"
rm -rf "$cache/include.tmp"
cp -r "$work/root/usr/include" "$cache/include.tmp"
cp "$work/root/usr/share/doc/libminja-dev/copyright" "$cache/copyright" 2>/dev/null || true  # MIT
basename "$deb" >"$cache/VERSION"
rm -rf "$include"
mv "$cache/include.tmp" "$include"
log "$(basename "$deb") -> $include"
echo "$include"
