#!/usr/bin/env bash
# sanitized.sh COMMAND [ARGS...] — runs a test on ASan+UBSan binaries: the first finding stops the
# process that hit it (halt_on_error; UBSan is built with -fno-sanitize-recover), leaks are
# reported at exit, and every report goes to a file rather than stderr, so that reports from child
# processes (the router and shard an integration test starts) are seen too. Fails when the command
# fails or any report was written; prints the reports.
set -uo pipefail
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$reports/asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
# Tests that bound compute time scale the bound by this (tests/integration/router_test.py).
export TEXTGEN_TEST_SLOWDOWN="${TEXTGEN_TEST_SLOWDOWN:-4}"
here=$(cd "$(dirname "$0")" && pwd)
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
"$@"
rc=$?
found=0
for f in "$reports"/*; do
  [ -s "$f" ] || continue  # the runtimes may leave an empty log behind
  found=1
  echo "==== sanitizer report $(basename "$f") ===="
  cat "$f"
done
if [ "$found" -ne 0 ]; then
  echo "sanitized: sanitizer reports above (command exit $rc)"
  exit 1
fi
exit "$rc"
