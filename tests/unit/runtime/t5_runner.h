// Greedy decoding of T5 fixtures through the Model interface (tests/reference/models/t5-*,
// docs/t5.md): each prompt encodes in the step it joins (ForwardBatch::encoderTokenIds, its cross
// blocks), then every step feeds each sequence's last token (the start token first) at its decoder
// position. Block tables are scattered over the pool (cross and self blocks interleaved between
// sequences). Shared by t5_test and the tensor-parallel tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "textgen/runtime/model.h"

namespace textgen::runtime::t5test {

constexpr int64_t kT5BlockSize = 4;
constexpr uint32_t kT5Blocks = 512;

struct T5Trace {
  std::vector<std::vector<std::vector<float>>> logits;  // [sequence][step][vocab]
  std::vector<std::vector<uint32_t>> tokens;            // [sequence][step]
  std::string error;                                    // a failed forward's status
};

inline nlohmann::json readT5Reference(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  return nlohmann::json::parse(in);
}

inline std::vector<std::vector<uint32_t>> t5Prompts(const nlohmann::json& ref) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& p : ref["prompts"]) out.push_back(p["input_ids"].get<std::vector<uint32_t>>());
  return out;
}

// `join[i]`: the step at which prompt i starts (empty: all at step 0).
inline T5Trace runT5Greedy(Model& model, Backend& backend,
                           const std::vector<std::vector<uint32_t>>& prompts, int steps,
                           std::vector<int> join = {}) {
  T5Trace t;
  const int64_t bs = kT5BlockSize;
  auto cache = KvCache::create(backend, model.kvShape(), kT5Blocks, bs, model.dtype());
  if (!cache.ok()) {
    t.error = cache.status().toString();
    return t;
  }
  const size_t n = prompts.size();
  if (join.empty()) join.assign(n, 0);
  // Blocks handed out round-robin from the end of the pool: every table is scattered.
  std::vector<std::vector<uint32_t>> cross(n), self(n);
  uint32_t next = kT5Blocks - 1;
  bool more = true;
  while (more) {
    more = false;
    for (size_t i = 0; i < n; ++i) {
      const size_t wantCross = (prompts[i].size() + bs - 1) / bs, wantSelf = (steps + bs - 1) / bs;
      if (cross[i].size() < wantCross) cross[i].push_back(next--), more = true;
      if (self[i].size() < wantSelf) self[i].push_back(next--), more = true;
    }
  }
  t.logits.resize(n);
  t.tokens.resize(n);
  const int64_t vocab = model.config().vocabSize;
  const uint32_t start = model.config().decoderStartTokenId;
  for (int stepNo = 0;; ++stepNo) {
    ForwardBatch b;
    std::vector<size_t> rows;
    for (size_t i = 0; i < n; ++i) {
      const auto pos = static_cast<int64_t>(t.tokens[i].size());
      if (join[i] > stepNo || pos >= steps) continue;
      rows.push_back(i);
      b.sequences.push_back({.firstRow = static_cast<int64_t>(b.tokenIds.size()),
                             .numRows = 1,
                             .startPos = pos,
                             .blocks = self[i]});
      b.tokenIds.push_back(pos == 0 ? start : t.tokens[i].back());
      b.slots.push_back(self[i][pos / bs] * bs + pos % bs);
      b.logitRows.push_back(static_cast<int64_t>(b.tokenIds.size()) - 1);
      b.cross.push_back({.encoderLen = static_cast<int64_t>(prompts[i].size()),
                         .encode = pos == 0,
                         .blocks = cross[i]});
      if (pos == 0)
        b.encoderTokenIds.insert(b.encoderTokenIds.end(), prompts[i].begin(), prompts[i].end());
    }
    if (rows.empty()) break;
    auto logits = model.forward(b, **cache);
    if (!logits.ok()) {
      t.error = logits.status().toString();
      return t;
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* row = logits->data() + r * vocab;
      t.logits[rows[r]].emplace_back(row, row + vocab);
      t.tokens[rows[r]].push_back(static_cast<uint32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  return t;
}

}  // namespace textgen::runtime::t5test
