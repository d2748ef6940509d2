#include "textgen/base/log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace textgen::log {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void initWith(Format format, spdlog::level::level_enum level = spdlog::level::info) {
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    init({.component = "router", .level = level, .format = format, .sink = sink_});
  }
  void TearDown() override { init({}); }

  std::ostringstream out_;
  spdlog::sink_ptr sink_;
};

TEST_F(LogTest, JsonRecordIsOneObjectPerLine) {
  initWith(Format::kJson);
  spdlog::info("queued {} tokens", 12);
  const std::string line = out_.str();
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  EXPECT_NE(line.find(R"("level":"INFO")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("target":"router")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("message":"queued 12 tokens")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("timestamp":"20)"), std::string::npos) << line;
  EXPECT_EQ(line.find("fields"), std::string::npos) << line;
}

TEST_F(LogTest, JsonEscapesMessage) {
  initWith(Format::kJson);
  spdlog::warn("quote \" backslash \\ newline \n tab \t bell \x07");
  EXPECT_NE(out_.str().find(R"("message":"quote \" backslash \\ newline \n tab \t bell \u0007")"),
            std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find(R"("level":"WARN")"), std::string::npos);
}

TEST_F(LogTest, JsonCarriesScopedFieldsInnermostWins) {
  initWith(Format::kJson);
  {
    ScopedField request("request_id", "42");
    ScopedField batch("batch_id", "7");
    {
      ScopedField inner("request_id", "43");
      spdlog::info("inner");
    }
    spdlog::info("outer");
  }
  spdlog::info("none");
  std::istringstream lines(out_.str());
  std::string inner, outer, none;
  std::getline(lines, inner);
  std::getline(lines, outer);
  std::getline(lines, none);
  EXPECT_NE(inner.find(R"("fields":{"batch_id":"7","request_id":"43"})"), std::string::npos)
      << inner;
  EXPECT_NE(outer.find(R"("fields":{"request_id":"42","batch_id":"7"})"), std::string::npos)
      << outer;
  EXPECT_EQ(none.find("fields"), std::string::npos) << none;
}

TEST_F(LogTest, TextModeAppendsFields) {
  initWith(Format::kText);
  ScopedField request("request_id", "9");
  spdlog::error("shard failed");
  EXPECT_NE(out_.str().find("router: shard failed request_id=9"), std::string::npos) << out_.str();
}

TEST_F(LogTest, LevelFilters) {
  initWith(Format::kText, spdlog::level::warn);
  spdlog::info("hidden");
  spdlog::warn("shown");
  EXPECT_EQ(out_.str().find("hidden"), std::string::npos);
  EXPECT_NE(out_.str().find("shown"), std::string::npos);
}

TEST(LogLevelTest, Parses) {
  EXPECT_EQ(*parseLevel("INFO"), spdlog::level::info);
  EXPECT_EQ(*parseLevel("warning"), spdlog::level::warn);
  EXPECT_EQ(*parseLevel("debug"), spdlog::level::debug);
  StatusOr<spdlog::level::level_enum> bad = parseLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
}

}  // namespace
}  // namespace textgen::log
