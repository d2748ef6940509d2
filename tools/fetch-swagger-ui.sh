#!/usr/bin/env bash
# Fetches Swagger UI (npm's swagger-ui-dist, pinned below) for the router's API page at /docs into
# a project-local cache, and keeps only the files the page loads. The tarball comes from `npm pack`
# (npm's own configuration names the registry, so no host name is written here; nothing is
# installed and no package script runs) and must match the sha512 integrity pinned below, the
# value npm's lockfiles record. Idempotent: when the cache holds this version's files it does no
# network work. Prints the directory (CMake's TEXTGEN_SWAGGER_UI_DIR, whose default is this cache);
# building textgen-router copies its files next to the binary (<build>/swagger-ui/).
#
#   tools/fetch-swagger-ui.sh    (cache: $TEXTGEN_SWAGGER_UI_CACHE, else
#                                 ${TEXTGEN_CACHE:-~/.cache/textgen}/swagger-ui-dist-<version>)
#
# To move to another version: change both pins (`npm view swagger-ui-dist@<v> dist.integrity`);
# router/CMakeLists.txt reads `version=` from here for the cache's path and the page's URLs.
set -euo pipefail
log() { echo "fetch-swagger-ui: $*" >&2; }

version=5.35.0
integrity=sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==
# What the page loads (router/src/app/docs_page.cpp serves exactly these), and the licence.
files=(swagger-ui-bundle.js swagger-ui.css favicon-32x32.png favicon-16x16.png LICENSE NOTICE)

cache=${TEXTGEN_SWAGGER_UI_CACHE:-${TEXTGEN_CACHE:-${HOME:-/root}/.cache/textgen}/swagger-ui-dist-$version}
complete() {
  [ "$(cat "$cache/INTEGRITY" 2>/dev/null)" = "$integrity" ] || return 1
  for f in "${files[@]}"; do [ -s "$cache/$f" ] || return 1; done
}
if complete; then
  echo "$cache"
  exit 0
fi

command -v npm >/dev/null || { log "npm is needed (tools/install-deps.sh installs it)"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/textgen-swagger-ui.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack "swagger-ui-dist@$version" --ignore-scripts --silent >"$work/pack.log" 2>&1) ||
  { tail -20 "$work/pack.log" >&2; log "npm pack swagger-ui-dist@$version failed"; exit 1; }
tarball=$work/swagger-ui-dist-$version.tgz
[ -f "$tarball" ] || { log "npm pack wrote no $(basename "$tarball")"; exit 1; }
got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$got" != "$integrity" ]; then
  log "swagger-ui-dist@$version: integrity $got, expected $integrity; refusing it"
  exit 1
fi
mkdir -p "$work/x"
tar -xzf "$tarball" -C "$work/x" --no-same-owner --no-same-permissions "${files[@]/#/package/}"

# Swap the new files in whole, so that an interrupted run never leaves half a cache.
mkdir -p "$(dirname "$cache")"
rm -rf "$cache.tmp"
mkdir "$cache.tmp"
for f in "${files[@]}"; do
  [ -f "$work/x/package/$f" ] && [ ! -L "$work/x/package/$f" ] || { log "the tarball has no package/$f"; exit 1; }
  cp "$work/x/package/$f" "$cache.tmp/$f"
  chmod 0644 "$cache.tmp/$f"
done
echo "$version" >"$cache.tmp/VERSION"
echo "$integrity" >"$cache.tmp/INTEGRITY"
rm -rf "$cache"
mv "$cache.tmp" "$cache"
log "swagger-ui-dist@$version ($integrity) -> $cache"
echo "$cache"
