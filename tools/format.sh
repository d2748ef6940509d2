#!/usr/bin/env bash
# Formats every C++/CUDA source of the project in place.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files --cached --others --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh' |
  xargs -r clang-format -i
