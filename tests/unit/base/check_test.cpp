#include "textgen/base/check.h"

#include <gtest/gtest.h>

namespace {

TEST(CheckTest, PassingCheckDoesNothing) {
  int evaluations = 0;
  TG_CHECK(++evaluations == 1);
  TG_CHECK(evaluations == 1, "evaluated {} times", evaluations);
  EXPECT_EQ(evaluations, 1);  // the condition is evaluated exactly once
}

TEST(CheckDeathTest, FailingCheckNamesFileLineAndExpression) {
  EXPECT_DEATH(TG_CHECK(1 + 1 == 3), R"(check_test\.cpp:[0-9]+: check failed: 1 \+ 1 == 3)");
}

TEST(CheckDeathTest, FailingCheckFormatsMessage) {
  const int blocks = 4;
  EXPECT_DEATH(TG_CHECK(blocks > 8, "need {} blocks, have {}", 9, blocks),
               "check failed: blocks > 8: need 9 blocks, have 4");
}

}  // namespace
