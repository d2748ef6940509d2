#!/usr/bin/env bash
# `make run`: serve the bundled demo model with textgen-launcher. Until the launcher, shard and router
# exist it lists what is missing and exits non-zero — it never pretends to serve.
set -euo pipefail
build=${1:-build}
missing=()
for bin in textgen-launcher textgen-shard textgen-router; do
  [ -x "$build/$bin" ] || missing+=("$bin")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "make run: cannot serve yet; not built: ${missing[*]}" >&2
  echo "  textgen-shard    — shard runtime (issue 4)" >&2
  echo "  textgen-router   — HTTP router and batching (issue 5)" >&2
  echo "  textgen-launcher — launcher and the bundled demo model (issue 6)" >&2
  exit 1
fi
exec "$build/textgen-launcher" "$@"
