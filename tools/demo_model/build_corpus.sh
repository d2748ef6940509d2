#!/usr/bin/env bash
# The demo model's training corpus: the reStructuredText sources of the Python 3.11 documentation
# from Debian 12's python3.11-doc package (Python Software Foundation License Version 2).
# Writes OUT/corpus.txt (one document per file, separated by a form feed line) and OUT/LICENSE.
# Usage: tools/demo_model/build_corpus.sh OUT   (nothing is installed system-wide)
set -euo pipefail
out=${1:?usage: build_corpus.sh OUT}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
(cd "$work" && apt-get download python3.11-doc >/dev/null)
dpkg -x "$work"/python3.11-doc_*.deb "$work/root"
: > "$out/corpus.txt"
find "$work/root/usr/share/doc/python3.11/html/_sources" -name '*.txt' | LC_ALL=C sort | while read -r f; do
  printf '\f %s\n' "${f#"$work"/root/usr/share/doc/python3.11/html/_sources/}" >> "$out/corpus.txt"
  cat "$f" >> "$out/corpus.txt"
  printf '\n' >> "$out/corpus.txt"
done
cp "$work/root/usr/share/doc/python3.11-doc/copyright" "$out/LICENSE"
dpkg-deb -f "$work"/python3.11-doc_*.deb Version > "$out/VERSION"
echo "corpus: $(wc -c < "$out/corpus.txt") bytes from $(grep -c $'^\f' "$out/corpus.txt") documents (python3.11-doc $(cat "$out/VERSION"))"
