#!/usr/bin/env bash
# Fails when a C++/CUDA source of the project is not clang-formatted (.clang-format).
# Usage: tools/check-format.sh [clang-format]   — run from anywhere; fix with tools/format.sh.
set -euo pipefail
cf=${1:-clang-format}
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.h' '*.cpp' '*.cu' '*.cuh' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find . -path ./build -prune -o -path ./.gpu -prune -o \
    \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
[ ${#files[@]} -gt 0 ] || { echo "check-format: no sources found" >&2; exit 1; }
if "$cf" --dry-run --Werror "${files[@]}"; then
  echo "check-format: ${#files[@]} files formatted"
else
  echo "check-format: run tools/format.sh" >&2
  exit 1
fi
