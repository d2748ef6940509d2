// Grammar compile time and per-token mask time at a 128k vocabulary, over simulated generations:
// fill the mask, pick a random allowed token, accept it, until EOS. Prints a table, then one JSON
// line. Measures and prints; never asserts.
//
//   bench_grammar [--tokenizer DIR] [--vocab N] [--generations N]
//
// The vocabulary is the tokenizer's (default: the llama3 fixture) through Tokenizer::tokenBytes,
// padded to --vocab ids (default 128256, Llama 3's size) with tokens made by joining two of its
// tokens (seeded), so that the trie has a real tokenizer's shape at the real size.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "textgen/grammar/grammar.h"
#include "textgen/tokenizer/tokenizer.h"

namespace {

using textgen::grammar::Grammar;
using textgen::grammar::Kind;
using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::vector<int> distancesToAccept(const Grammar& g) {
  const auto n = static_cast<int32_t>(g.numStates());
  std::vector<int> dist(n, INT_MAX);
  for (int32_t s = 0; s < n; ++s) dist[s] = g.accepting(s) ? 0 : INT_MAX;
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      for (int b = 0; b < 256; ++b) {
        const int32_t t = g.next(s, static_cast<uint8_t>(b));
        if (t != Grammar::kDead && dist[t] != INT_MAX && dist[t] + 1 < dist[s]) {
          dist[s] = dist[t] + 1;
          changed = true;
        }
      }
    }
  }
  return dist;
}

struct Case {
  const char* name;
  Kind kind;
  const char* source;
};

const Case kCases[] = {
    {"flat_object_5", Kind::kJsonSchema,
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string","format":"email"},"active":{"type":"boolean"},"score":{"type":"number"}},"required":["name","age","email","active","score"]})"},
    {"nested_array", Kind::kJsonSchema,
     R"({"type":"object","properties":{"order":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"}},"required":["sku","qty"]}}},"required":["id","items"]},"note":{"type":"string"}},"required":["order"]})"},
    {"enum", Kind::kJsonSchema, R"({"enum":["positive","negative","neutral","mixed","unknown"]})"},
    {"tool_call", Kind::kJsonSchema,
     R"({"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},"required":["location","unit"]}},"required":["name","arguments"]})"},
    {"any_json", Kind::kJsonSchema, "{}"},
    {"regex_phone", Kind::kRegex, R"(\(\d{3}\) \d{3}-\d{4}( ext\. \d{1,5})?)"},
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(TEXTGEN_TOKENIZER_FIXTURES) + "/llama3";
  size_t vocabSize = 128256;
  int generations = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--vocab")) vocabSize = std::stoul(argv[i + 1]);
    if (!std::strcmp(argv[i], "--generations")) generations = std::stoi(argv[i + 1]);
  }
  auto tok = textgen::tokenizer::Tokenizer::fromDirectory(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_grammar: %s\n", tok.status().toString().c_str());
    return 1;
  }
  std::vector<std::optional<std::string>> bytes((*tok)->vocabSize());
  std::vector<std::string> real;
  for (uint32_t id = 0; id < bytes.size(); ++id) {
    bytes[id] = (*tok)->tokenBytes(id);
    if (bytes[id] && !bytes[id]->empty()) real.push_back(*bytes[id]);
  }
  const size_t realSize = bytes.size();
  std::set<std::string> seen(real.begin(), real.end());
  std::mt19937 rng(1234);
  while (bytes.size() < vocabSize) {
    std::string s = real[rng() % real.size()] + real[rng() % real.size()];
    if (seen.insert(s).second) bytes.push_back(std::move(s));
  }
  std::vector<uint32_t> eos;
  if (auto e = (*tok)->eosTokenId()) eos.push_back(*e);
  auto vocab = textgen::grammar::Vocabulary::create(std::move(bytes), eos);
  {
    // Build the shared trie outside the timings (it is built once per vocabulary).
    auto g = Grammar::compile(Kind::kRegex, "a");
    const auto t0 = Clock::now();
    textgen::grammar::TokenIndex warm(*g, vocab);
    std::vector<uint32_t> w(vocab->maskWords());
    warm.fillMask(warm.grammar().start(), w);
    std::printf(
        "vocabulary: %zu ids (%zu from %s, the rest joined pairs); trie + first mask %.1f ms\n",
        vocab->size(), realSize, dir.c_str(), micros(Clock::now() - t0) / 1000);
  }
  std::printf("%-14s %9s %7s %10s %8s %9s %9s %9s %9s %10s\n", "grammar", "regex_B", "states",
              "compile_ms", "tokens", "p50_us", "p99_us", "first_p50", "first_p99", "cached_p50");
  nlohmann::json results = nlohmann::json::array();
  std::vector<double> allP50;
  for (const Case& c : kCases) {
    const auto t0 = Clock::now();
    auto g = Grammar::compile(c.kind, c.source);
    const double compileMs = micros(Clock::now() - t0) / 1000;
    if (!g.ok()) {
      std::fprintf(stderr, "bench_grammar: %s: %s\n", c.name, g.status().toString().c_str());
      continue;
    }
    size_t regexBytes = std::strlen(c.source);
    if (c.kind == Kind::kJsonSchema)
      regexBytes = textgen::grammar::jsonSchemaToRegex(c.source)->size();
    auto index = std::make_shared<const textgen::grammar::TokenIndex>(*g, vocab);
    const auto dist = distancesToAccept(**g);
    std::vector<uint32_t> words(vocab->maskWords());
    std::vector<double> all, first, cached;
    std::vector<bool> visited((*g)->numStates(), false);
    std::vector<uint32_t> allowed;
    size_t tokens = 0;
    for (int gen = 0; gen < generations; ++gen) {
      textgen::grammar::Matcher m(index);
      for (int step = 0; step < 400 && !m.ended(); ++step) {
        const auto s0 = Clock::now();
        m.fillMask(words);
        const double us = micros(Clock::now() - s0);
        all.push_back(us);
        (visited[m.state()] ? cached : first).push_back(us);
        visited[m.state()] = true;
        allowed.clear();
        for (size_t w = 0; w < words.size(); ++w) {
          for (uint32_t x = words[w]; x; x &= x - 1)
            allowed.push_back(static_cast<uint32_t>(w * 32 + __builtin_ctz(x)));
        }
        uint32_t pick = allowed[rng() % allowed.size()];
        // Past a few dozen tokens, steer towards the end: EOS when allowed, else the best of a
        // few random candidates by distance to acceptance.
        if (step > 48) {
          int best = INT_MAX;
          for (int k = 0; k < 16; ++k) {
            const uint32_t cand = allowed[rng() % allowed.size()];
            const int32_t t = index->advance(m.state(), cand);
            const int d = index->isEos(cand) ? -1 : dist[t];
            if (d < best) best = d, pick = cand;
          }
        }
        if (!m.accept(pick).ok()) break;
        ++tokens;
      }
    }
    const double p50 = percentile(all, 0.5), p99 = percentile(all, 0.99);
    allP50.push_back(p50);
    std::printf("%-14s %9zu %7zu %10.2f %8zu %9.2f %9.2f %9.1f %9.1f %10.2f\n", c.name, regexBytes,
                (*g)->numStates(), compileMs, tokens, p50, p99, percentile(first, 0.5),
                percentile(first, 0.99), percentile(cached, 0.5));
    results.push_back({{"grammar", c.name},
                       {"regex_bytes", regexBytes},
                       {"dfa_states", (*g)->numStates()},
                       {"compile_ms", compileMs},
                       {"tokens", tokens},
                       {"mask_p50_us", p50},
                       {"mask_p99_us", p99},
                       {"first_visit_p50_us", percentile(first, 0.5)},
                       {"first_visit_p99_us", percentile(first, 0.99)},
                       {"cached_p50_us", percentile(cached, 0.5)},
                       {"cached_p99_us", percentile(cached, 0.99)}});
  }
  const double worstP50 = allP50.empty() ? 0 : *std::max_element(allP50.begin(), allP50.end());
  nlohmann::json line{{"bench", "grammar_mask"},     {"vocab", vocab->size()},
                      {"generations", generations},  {"results", results},
                      {"goal_mask_p50_us", 50},      {"worst_mask_p50_us", worstP50},
                      {"goal_met", worstP50 <= 50.0}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
