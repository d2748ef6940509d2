// Shared helpers of the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace textgen::tokenizer::testing {

inline const std::string kFixtures = TEXTGEN_TOKENIZER_FIXTURES;

inline std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const char* kFamilies[] = {"gpt2",
                                  "gpt-neox",
                                  "bloom",
                                  "falcon",
                                  "opt",
                                  "opt-slow",
                                  "starcoder",
                                  "gpt2-splits-a",
                                  "gpt2-splits-b",
                                  "llama2",
                                  "mistral",
                                  "llama3",
                                  "t5",
                                  "unigram-byte-fallback",
                                  "wordlevel",
                                  "wordlevel-whitespace",
                                  "bpe-suffix"};

// gtest parameter names: "gpt2-splits-a" -> "gpt2_splits_a".
inline std::string familyTestName(const ::testing::TestParamInfo<const char*>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

}  // namespace textgen::tokenizer::testing
