#!/usr/bin/env bash
# Runs Python with Debian unstable's (sid) CPU PyTorch, transformers and tokenizers on this Debian 12
# machine, for writing reference fixtures when no GPU machine is lent (float32 references only; the
# float16/bfloat16 ones need the GPU: tools/reference/make_dtype_references.py).
#
#   bash tools/reference/sid-python.sh tools/reference/make_model_fixtures.py TOKENIZER_DIR OUT [NAMES]
#
# The packages and their whole dependency closure (glibc included) are unpacked with dpkg -x into a
# private prefix, never into /, from the archive this machine's apt configuration already names (read
# from it, as tools/k8s-test-server/build.sh does). Python 3.14 then runs through sid's own dynamic
# loader with the prefix's libraries. About 300 MB downloaded, 1.4 GB unpacked, once.
set -euo pipefail
prefix=${TEXTGEN_SID_PYTHON:-${HOME:-/root}/.cache/textgen/sid-python}
root=$prefix/root
log() { echo "sid-python: $*" >&2; }
if [ ! -x "$root/usr/bin/python3.14" ]; then
  archive=$(bash "$(dirname "$0")/../k8s-test-server/build.sh" --print-archive)
  apt_dir=$prefix/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  : >"$apt_dir/status"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive sid main" >"$apt_dir/sources.list"
  opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::Status=$apt_dir/status"
    -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives"
    -o "APT::Architecture=amd64" -o "Debug::NoLocking=1" -o "APT::Get::List-Cleanup=0")
  log "reading sid's package lists from $archive"
  apt-get "${opts[@]}" update >"$prefix/update.log" 2>&1 || { cat "$prefix/update.log" >&2; exit 1; }
  log "downloading python3-transformers, python3-torch, python3-tokenizers, python3-safetensors and their dependencies"
  apt-get "${opts[@]}" install --download-only --no-install-recommends -y -q \
    python3-transformers python3-torch python3-tokenizers python3-safetensors >"$prefix/download.log" 2>&1 ||
    { tail -20 "$prefix/download.log" >&2; exit 1; }
  rm -rf "$root.tmp"
  mkdir -p "$root.tmp"
  for deb in "$apt_dir"/archives/*.deb; do dpkg -x "$deb" "$root.tmp"; done
  rm -rf "$root"
  mv "$root.tmp" "$root"
fi
lib=$root/usr/lib/x86_64-linux-gnu
export PYTHONHOME=$root/usr
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:$lib/blas:$lib/lapack:$root/usr/lib" \
  "$root/usr/bin/python3.14" "$@"
