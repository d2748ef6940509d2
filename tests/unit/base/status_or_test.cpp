#include "textgen/base/status_or.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace textgen {
namespace {

StatusOr<int> parsePositive(int v) {
  if (v <= 0) return invalidArgumentError("must be positive, got " + std::to_string(v));
  return v;
}

StatusOr<int> doubled(int v) {
  TG_ASSIGN_OR_RETURN(int x, parsePositive(v));
  return 2 * x;
}

TEST(StatusOrTest, HoldsValue) {
  StatusOr<std::string> s = std::string("hello");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s.status().ok());
  EXPECT_EQ(*s, "hello");
  EXPECT_EQ(s->size(), 5u);
}

TEST(StatusOrTest, HoldsError) {
  StatusOr<int> s = parsePositive(-1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "must be positive, got -1");
  EXPECT_EQ(s.valueOr(7), 7);
}

TEST(StatusOrTest, AssignOrReturnPropagates) {
  EXPECT_EQ(*doubled(21), 42);
  StatusOr<int> bad = doubled(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "must be positive, got 0");
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> s = std::make_unique<int>(5);
  ASSERT_TRUE(s.ok());
  std::unique_ptr<int> p = std::move(s).value();
  EXPECT_EQ(*p, 5);
}

TEST(StatusOrTest, ConvertingConstruction) {
  StatusOr<std::vector<int>> s = std::vector<int>{1, 2, 3};
  EXPECT_EQ(s->size(), 3u);
  StatusOr<std::string> t = "literal";
  EXPECT_EQ(*t, "literal");
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> s = notFoundError("gone");
  EXPECT_DEATH((void)s.value(), "StatusOr has no value: NOT_FOUND: gone");
}

TEST(StatusOrDeathTest, OkStatusIsRejected) {
  EXPECT_DEATH({ StatusOr<int> s = okStatus(); }, "StatusOr constructed from an OK status");
}

}  // namespace
}  // namespace textgen
