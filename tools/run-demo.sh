#!/usr/bin/env bash
# `make run`: serve the bundled demo model (models/demo) with textgen-launcher on port 3000. If a part
# is missing from the build it names it and exits non-zero — it never pretends to serve.
set -euo pipefail
# Usage: tools/run-demo.sh [BUILD_DIR [LAUNCHER FLAGS...]] (the Makefile passes $(BUILD_DIR) $(ARGS)).
build=${1:-build}
if [ $# -gt 0 ]; then shift; fi  # the rest goes to the launcher
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
# The demo model on port 3000 (override with `make run ARGS="--port 8080"`); the launcher prints a
# curl command that works.
exec "$build/textgen-launcher" --port 3000 "$@"
