#include "token_trie.h"

#include <algorithm>
#include <string_view>

namespace textgen::grammar {

TokenTrie TokenTrie::build(const std::vector<std::optional<std::string>>& tokenBytes,
                           const std::vector<uint8_t>& skip) {
  std::vector<uint32_t> ids;
  for (uint32_t id = 0; id < tokenBytes.size(); ++id) {
    if (tokenBytes[id] && !tokenBytes[id]->empty() && !(id < skip.size() && skip[id]))
      ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) {
    return *tokenBytes[a] < *tokenBytes[b] || (*tokenBytes[a] == *tokenBytes[b] && a < b);
  });
  TokenTrie t;
  // path[d] = node index at depth d+1 along the current string.
  std::vector<uint32_t> path;
  std::vector<std::vector<uint32_t>> nodeTokens;
  std::string_view prev;
  for (uint32_t id : ids) {
    const std::string_view s = *tokenBytes[id];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    // Close the nodes of the previous string below the common prefix.
    while (path.size() > common) {
      t.subtreeEnd[path.back()] = static_cast<uint32_t>(t.byte.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(t.byte.size()));
      t.byte.push_back(static_cast<uint8_t>(s[d]));
      t.depth.push_back(static_cast<uint32_t>(d + 1));
      t.subtreeEnd.push_back(0);
      nodeTokens.emplace_back();
    }
    nodeTokens[path.back()].push_back(id);
    t.maxDepth = std::max<uint32_t>(t.maxDepth, static_cast<uint32_t>(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    t.subtreeEnd[path.back()] = static_cast<uint32_t>(t.byte.size());
    path.pop_back();
  }
  t.tokenBegin.reserve(nodeTokens.size() + 1);
  for (const auto& v : nodeTokens) {
    t.tokenBegin.push_back(static_cast<uint32_t>(t.tokens.size()));
    t.tokens.insert(t.tokens.end(), v.begin(), v.end());
  }
  t.tokenBegin.push_back(static_cast<uint32_t>(t.tokens.size()));
  return t;
}

}  // namespace textgen::grammar
