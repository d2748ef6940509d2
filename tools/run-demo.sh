#!/usr/bin/env bash
# `make run`: serve the bundled demo model with textgen-launcher. Until the launcher and router exist
# it names what is missing and exits non-zero — it never pretends to serve.
set -euo pipefail
build=${1:-build}
declare -A what=(
  [textgen-shard]="shard runtime (issue 4)"
  [textgen-router]="HTTP router and batching (issue 5)"
  [textgen-launcher]="launcher and the bundled demo model (issue 6)"
)
missing=()
for bin in textgen-shard textgen-router textgen-launcher; do
  [ -x "$build/$bin" ] || missing+=("$bin")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "make run: cannot serve yet; not built:" >&2
  for bin in "${missing[@]}"; do echo "  $bin — ${what[$bin]}" >&2; done
  exit 1
fi
exec "$build/textgen-launcher" "$@"
