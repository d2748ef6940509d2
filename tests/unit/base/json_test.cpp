// parseJson / parseOrderedJson: nesting and the ordered parse's key bound refused with a message,
// syntax errors located, documents within the bounds parsed as they are.
#include "textgen/base/json.h"

#include <gtest/gtest.h>

#include <string>

namespace textgen {
namespace {

std::string objectOfKeys(int n, const std::string& prefix = "") {
  std::string s = "{";
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += "\"" + prefix + std::to_string(i) + "\":0";
  }
  return s + "}";
}

TEST(Json, ParsesWithinTheBoundsKeepingKeyOrder) {
  auto j = parseOrderedJson(R"({"b":1,"a":[{"z":null,"y":"x"}]})", "doc");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->begin().key(), "b");
  EXPECT_EQ((*j)["a"][0].begin().key(), "z");
  auto k = parseOrderedJson(objectOfKeys(static_cast<int>(kMaxOrderedObjectKeys)), "doc");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->size(), kMaxOrderedObjectKeys);
}

TEST(Json, RefusesNestingPastTheBound) {
  const std::string deep = std::string(65, '[') + std::string(65, ']');
  for (bool ordered : {false, true}) {
    const Status s =
        ordered ? parseOrderedJson(deep, "doc").status() : parseJson(deep, "doc").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("nests deeper than 64"), std::string::npos) << s;
  }
}

TEST(Json, LocatesSyntaxErrors) {
  const Status s = parseOrderedJson(R"({"inputs":)", "the request body").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the request body is not valid JSON (at byte"), std::string::npos)
      << s;
}

// One object of many keys (quadratic to insert in document order: 205k keys took 80 s), many
// objects of a few thousand, and long keys of one length are refused by the check, before any
// value is built; the unordered parse takes them (its map finds a key in log time).
TEST(Json, OrderedParseRefusesObjectsOfTooManyKeys) {
  const std::string one = objectOfKeys(200000);
  std::string several = "[";
  for (int i = 0; i < 8; ++i) several += (i ? "," : "") + objectOfKeys(4000);
  several += "]";
  // Long keys of one length: each comparison walks a long common prefix.
  const std::string longKeys = objectOfKeys(3000, std::string(300, 'k'));
  for (const std::string* doc : {&one, static_cast<const std::string*>(&several), &longKeys}) {
    const Status s = parseOrderedJson(*doc, "the request body").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("has objects of too many keys"), std::string::npos) << s;
    EXPECT_TRUE(parseJson(*doc, "doc").ok());
  }
  // A model's own files (tokenizer_config.json's added_tokens_decoder) are read without the bound.
  auto file = parseOrderedJson(objectOfKeys(20000), "tokenizer_config.json", kMaxJsonDepth,
                               /*boundKeys=*/false);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 20000u);
}

}  // namespace
}  // namespace textgen
