// Shared helpers of the tokenizer tests.
#pragma once

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

}  // namespace textgen::tokenizer::testing
