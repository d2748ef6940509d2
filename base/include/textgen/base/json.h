// JSON from outside the process (request bodies, config.json, tokenizer.json, RPC payloads) is
// parsed here, with its nesting bounded before any value is built: nlohmann's copies, dumps and
// destructors recurse, so unbounded nesting is a stack overflow waiting for a hostile input.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "textgen/base/status_or.h"

namespace textgen {

// Deep enough for every real document we read (tokenizer.json nests about 6 levels, request bodies
// 4); far below what the stack can take.
inline constexpr int kMaxJsonDepth = 64;

// The parsed document, or INVALID_ARGUMENT naming `what` (e.g. "config.json", "the request body")
// when the text is not JSON or nests deeper than maxDepth. Never throws.
StatusOr<nlohmann::json> parseJson(std::string_view text, std::string_view what,
                                   int maxDepth = kMaxJsonDepth);
// The key-insertion work parseOrderedJson takes: nlohmann's ordered_map looks a key up by walking
// the object's earlier keys, so an object of n keys costs n^2 / 2 comparisons (a 2 MB request
// body of one object of 205k keys took 80 s). Requests past this bound are refused: one object
// of more than kMaxOrderedObjectKeys keys, or several of thousands, where real ones have at most a
// few thousand keys in all (JSON Schemas, tools, logit_bias). A model's own files
// (tokenizer_config.json: added_tokens_decoder has tens of thousands of entries in some models)
// are read without it (boundKeys false): once, at start-up.
inline constexpr uint64_t kMaxOrderedKeyWork = uint64_t{1} << 25;
inline constexpr uint64_t kMaxOrderedObjectKeys = 8192;  // 8192 * 8191 / 2 <= kMaxOrderedKeyWork

// The same, keeping objects' keys in document order (chat messages and tools, JSON Schemas: their
// order shows in rendered templates and in the order constrained output emits properties);
// INVALID_ARGUMENT also past kMaxOrderedKeyWork when boundKeys.
StatusOr<nlohmann::ordered_json> parseOrderedJson(std::string_view text, std::string_view what,
                                                  int maxDepth = kMaxJsonDepth,
                                                  bool boundKeys = true);

}  // namespace textgen
