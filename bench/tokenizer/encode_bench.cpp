// Single-thread encode throughput of textgen's tokenizer on a file of documents (one JSON string
// per line), per fixture family; with --hf RESULTS.json (from
// tools/reference/tokenizer_bench_hf.py, same documents, same machine) it prints Hugging Face's
// numbers beside ours. Prints a table and one JSON line. Usage:
//   bench_tokenizer --fixtures DIR --docs DOCS.jsonl [--hf HF.json] [--families a,b,...]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "textgen/tokenizer/tokenizer.h"

namespace {

using nlohmann::json;
using textgen::tokenizer::Tokenizer;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: bench_tokenizer --fixtures DIR --docs DOCS.jsonl [--hf HF.json] [--families a,b]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string fixtures, docsPath, hfPath;
  std::vector<std::string> families{"gpt2",      "llama2",    "mistral",
                                    "llama3",    "t5",        "unigram-byte-fallback",
                                    "wordlevel", "bpe-suffix"};
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--fixtures") && more) {
      fixtures = argv[++i];
    } else if (!std::strcmp(argv[i], "--docs") && more) {
      docsPath = argv[++i];
    } else if (!std::strcmp(argv[i], "--hf") && more) {
      hfPath = argv[++i];
    } else if (!std::strcmp(argv[i], "--families") && more) {
      families = split(argv[++i], ',');
    } else {
      return usage();
    }
  }
  if (fixtures.empty() || docsPath.empty()) return usage();
  std::vector<std::string> docs;
  {
    std::ifstream in(docsPath);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", docsPath.c_str());
      return 1;
    }
    std::string line;
    while (std::getline(in, line)) docs.push_back(json::parse(line).get<std::string>());
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  json hf;
  if (!hfPath.empty()) {
    std::ifstream in(hfPath);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", hfPath.c_str());
      return 1;
    }
    hf = json::parse(in);
  }

  std::printf("encode, single thread, %zu documents, %.2f MB\n", docs.size(), bytes / 1e6);
  std::printf("%-22s %10s %12s %10s %12s %8s\n", "family", "MB/s", "Mtokens/s", "HF MB/s",
              "HF Mtok/s", "vs HF");
  json results = json::array();
  for (const std::string& family : families) {
    auto tok = Tokenizer::fromDirectory(fixtures + "/" + family);
    if (!tok.ok()) {
      std::fprintf(stderr, "bench_tokenizer: %s: %s\n", family.c_str(),
                   tok.status().toString().c_str());
      return 1;
    }
    size_t tokens = 0;
    for (const auto& d : docs) tokens += (*tok)->encode(d)->size();  // warm-up (and caches)
    double best = std::numeric_limits<double>::infinity();
    for (int pass = 0; pass < 3; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& d : docs) {
        auto e = (*tok)->encode(d);
        if (!e.ok()) return 1;
      }
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double mbps = bytes / best / 1e6, mtps = tokens / best / 1e6;
    json row{{"family", family}, {"mb_per_s", mbps}, {"mtokens_per_s", mtps}, {"tokens", tokens}};
    if (hf.contains("families") && hf["families"].contains(family)) {
      const double hs = hf["families"][family]["seconds"].get<double>();
      const double hfMbps = hf["bytes"].get<double>() / hs / 1e6;
      const double hfMtps = hf["families"][family]["tokens"].get<double>() / hs / 1e6;
      row["hf_mb_per_s"] = hfMbps;
      row["hf_mtokens_per_s"] = hfMtps;
      row["speedup"] = mbps / hfMbps;
      row["same_token_count"] = hf["families"][family]["tokens"].get<size_t>() == tokens;
      std::printf("%-22s %10.2f %12.2f %10.2f %12.2f %7.2fx\n", family.c_str(), mbps, mtps, hfMbps,
                  hfMtps, mbps / hfMbps);
    } else {
      std::printf("%-22s %10.2f %12.2f %10s %12s %8s\n", family.c_str(), mbps, mtps, "-", "-", "-");
    }
    results.push_back(row);
  }
  json line{
      {"bench", "tokenizer_encode"}, {"bytes", bytes}, {"docs", docs.size()}, {"results", results}};
  if (hf.contains("tokenizers")) line["hf_tokenizers"] = hf["tokenizers"];
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
