#!/usr/bin/env bash
# Runs every test of a build tree through ctest. GPU-labelled tests run only where a GPU is visible;
# elsewhere they are excluded and the script says so (they run on the GPU machine: docs/gpu.md).
set -euo pipefail
build=${1:-build}
args=(--test-dir "$build" --output-on-failure -j "$(nproc)")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "run-tests: GPU present: running all tests"
else
  echo "run-tests: no GPU here: excluding tests labelled 'gpu' (run them on the GPU machine, docs/gpu.md)"
  args+=(-LE gpu)
fi
exec ctest "${args[@]}"
