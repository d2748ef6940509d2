// Every fixture written by Hugging Face tokenizers (tools/reference/make_tokenizer_fixtures.py)
// must be reproduced exactly: ids, tokens, byte offsets, ids without special tokens, and decodes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::tokenizer {
namespace {

using nlohmann::json;

const std::string& kFixtures = testing::kFixtures;

std::vector<json> readJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(json::parse(line));
  return rows;
}

std::string show(const std::vector<uint32_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str() + "]";
}

// Names the string, both lists, and the first position where they differ.
template <typename T>
::testing::AssertionResult sameList(const std::string& what, const std::string& text,
                                    const std::vector<T>& got, const std::vector<T>& want,
                                    const std::vector<uint32_t>& gotIds,
                                    const std::vector<uint32_t>& wantIds) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return ::testing::AssertionFailure()
         << what << " differ for " << json(text).dump() << "\n  first difference at position " << i
         << "\n  textgen: " << show(gotIds) << "\n  HF:      " << show(wantIds);
}

class FixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FixtureTest, EncodesExactly) {
  const std::string dir = kFixtures + "/" + std::string(GetParam());
  auto tok = Tokenizer::fromDirectory(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto rows = readJsonl(dir + "/cases.jsonl");
  ASSERT_GT(rows.size(), 300u);
  int failures = 0;
  for (const json& row : rows) {
    if (failures >= 5) break;  // enough to diagnose; keep the log readable
    const std::string text = row["text"];
    auto e = (*tok)->encode(text, true);
    ASSERT_TRUE(e.ok()) << e.status();
    const auto wantIds = row["ids"].get<std::vector<uint32_t>>();
    bool ok = true;
    auto check = [&](::testing::AssertionResult r) {
      if (!r) {
        ADD_FAILURE() << r.message();
        ok = false;
      }
    };
    check(sameList("ids", text, e->ids, wantIds, e->ids, wantIds));
    if (ok)
      check(sameList("tokens", text, e->tokens, row["tokens"].get<std::vector<std::string>>(),
                     e->ids, wantIds));
    if (ok) {
      std::vector<std::vector<uint32_t>> offsets;
      for (auto [s, t] : e->offsets) offsets.push_back({s, t});
      check(sameList("offsets", text, offsets,
                     row["offsets"].get<std::vector<std::vector<uint32_t>>>(), e->ids, wantIds));
    }
    auto plain = (*tok)->encode(text, false);
    ASSERT_TRUE(plain.ok());
    const auto wantPlain = row["ids_no_special"].get<std::vector<uint32_t>>();
    check(
        sameList("ids without special tokens", text, plain->ids, wantPlain, plain->ids, wantPlain));
    if (ok) {
      std::vector<std::vector<uint32_t>> offsets;
      for (auto [s, t] : plain->offsets) offsets.push_back({s, t});
      check(sameList("offsets without special tokens", text, offsets,
                     row["offsets_no_special"].get<std::vector<std::vector<uint32_t>>>(),
                     plain->ids, wantPlain));
    }
    const std::string decoded = (*tok)->decode(wantIds, false);
    if (decoded != row["decode"].get<std::string>()) {
      ADD_FAILURE() << "decode of " << show(wantIds) << " (text " << json(text).dump()
                    << ")\n  textgen: " << json(decoded).dump()
                    << "\n  HF:      " << row["decode"].dump();
      ok = false;
    }
    const std::string skipped = (*tok)->decode(wantIds, true);
    if (skipped != row["decode_skip_special"].get<std::string>()) {
      ADD_FAILURE() << "decode (skip special) of " << show(wantIds)
                    << "\n  textgen: " << json(skipped).dump()
                    << "\n  HF:      " << row["decode_skip_special"].dump();
      ok = false;
    }
    failures += ok ? 0 : 1;
  }
}

TEST_P(FixtureTest, DecodesRandomIdsExactly) {
  const std::string dir = kFixtures + "/" + std::string(GetParam());
  auto tok = Tokenizer::fromDirectory(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  int failures = 0;
  for (const json& row : readJsonl(dir + "/decode_random.jsonl")) {
    const auto ids = row["ids"].get<std::vector<uint32_t>>();
    for (bool skip : {false, true}) {
      const std::string want = row[skip ? "decode_skip_special" : "decode"];
      const std::string got = (*tok)->decode(ids, skip);
      if (got != want && failures++ < 5) {
        ADD_FAILURE() << "decode" << (skip ? " (skip special)" : "") << " of " << show(ids)
                      << "\n  textgen: "
                      << json(got).dump(-1, ' ', false, json::error_handler_t::replace)
                      << "\n  HF:      " << json(want).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, FixtureTest, ::testing::ValuesIn(testing::kFamilies),
                         testing::familyTestName);

}  // namespace
}  // namespace textgen::tokenizer
