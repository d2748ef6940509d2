// Shared helpers of the grammar tests: random walks through a compiled grammar.
#pragma once

#include <climits>
#include <random>
#include <string>
#include <vector>

#include "textgen/grammar/grammar.h"

namespace textgen::grammar::testing {

// Per state, the fewest bytes to an accepting state.
inline std::vector<int> distancesToAccept(const Grammar& g) {
  const auto n = static_cast<int32_t>(g.numStates());
  std::vector<int> dist(n, INT_MAX);
  for (int32_t s = 0; s < n; ++s) {
    if (g.accepting(s)) dist[s] = 0;
  }
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

// A random string the grammar accepts: random live bytes up to about `softMax` bytes, then bytes
// that bring acceptance closer, stopping at accepting states now and then.
inline std::string randomWalk(const Grammar& g, const std::vector<int>& dist, std::mt19937& rng,
                              size_t softMax = 60) {
  std::string out;
  int32_t s = g.start();
  std::vector<uint8_t> choices;
  while (true) {
    if (g.accepting(s)) {
      const double stop = out.size() >= softMax ? 1.0 : 0.15;
      if (std::uniform_real_distribution<double>(0, 1)(rng) < stop) return out;
    }
    choices.clear();
    for (int b = 0; b < 256; ++b) {
      const int32_t t = g.next(s, static_cast<uint8_t>(b));
      if (t == Grammar::kDead) continue;
      if (out.size() >= softMax && dist[t] >= dist[s]) continue;
      choices.push_back(static_cast<uint8_t>(b));
    }
    if (choices.empty()) return out;  // accepting (the grammar is trimmed)
    const uint8_t b = choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)];
    out.push_back(static_cast<char>(b));
    s = g.next(s, b);
  }
}

inline std::string randomWalk(const Grammar& g, std::mt19937& rng, size_t softMax = 60) {
  return randomWalk(g, distancesToAccept(g), rng, softMax);
}

}  // namespace textgen::grammar::testing
