// The vocabulary's byte trie, flattened in preorder so that a walk through an automaton is a loop
// that skips whole subtrees where the automaton dies. Built once per Vocabulary and shared by every
// TokenIndex over it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace textgen::grammar {

struct TokenTrie {
  // Node i (preorder, the root excluded): the byte on its edge, its depth (1 = child of the root),
  // one past the last node of its subtree, and the tokens whose bytes end exactly there.
  std::vector<uint8_t> byte;
  std::vector<uint32_t> depth;
  std::vector<uint32_t> subtreeEnd;
  std::vector<uint32_t> tokenBegin;  // [numNodes + 1]: tokens[tokenBegin[i] .. tokenBegin[i+1])
  std::vector<uint32_t> tokens;
  uint32_t maxDepth = 0;

  size_t numNodes() const { return byte.size(); }

  // Tokens with bytes, non-empty, and not in `skip` (EOS ids) are inserted.
  static TokenTrie build(const std::vector<std::optional<std::string>>& tokenBytes,
                         const std::vector<uint8_t>& skip);
};

}  // namespace textgen::grammar
