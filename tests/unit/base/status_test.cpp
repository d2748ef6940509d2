#include "textgen/base/status.h"

#include <gtest/gtest.h>

#include <sstream>

namespace textgen {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.toString(), "OK");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = invalidArgumentError("temperature must be strictly positive");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "temperature must be strictly positive");
  EXPECT_EQ(s.toString(), "INVALID_ARGUMENT: temperature must be strictly positive");
}

TEST(StatusTest, CodesMatchGrpcNumbering) {
  // The shard service passes codes to grpc::Status by value; these numbers are gRPC's.
  EXPECT_EQ(static_cast<int>(StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(StatusCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(StatusCode::kFailedPrecondition), 9);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnimplemented), 12);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnavailable), 14);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnauthenticated), 16);
}

TEST(StatusTest, OkCodeDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(s.message().empty());
}

TEST(StatusTest, WithContextPrefixesErrorsOnly) {
  EXPECT_EQ(notFoundError("no such file").withContext("config.json").message(),
            "config.json: no such file");
  EXPECT_EQ(notFoundError("x").withContext("y").code(), StatusCode::kNotFound);
  EXPECT_TRUE(okStatus().withContext("anything").ok());
}

TEST(StatusTest, EveryCodeHasAName) {
  for (int c = 0; c <= 16; ++c) {
    EXPECT_NE(statusCodeName(static_cast<StatusCode>(c)), "UNKNOWN_CODE") << c;
  }
}

TEST(StatusTest, Streams) {
  std::ostringstream os;
  os << unavailableError("shard 1 is down");
  EXPECT_EQ(os.str(), "UNAVAILABLE: shard 1 is down");
}

Status failsAt(int step, int failStep) {
  return step == failStep ? internalError("step " + std::to_string(step)) : okStatus();
}

Status runSteps(int failStep, int* completed) {
  for (int i = 0; i < 3; ++i) {
    TG_RETURN_IF_ERROR(failsAt(i, failStep));
    ++*completed;
  }
  return okStatus();
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstError) {
  int completed = 0;
  Status s = runSteps(1, &completed);
  EXPECT_EQ(s, internalError("step 1"));
  EXPECT_EQ(completed, 1);
  completed = 0;
  EXPECT_TRUE(runSteps(-1, &completed).ok());
  EXPECT_EQ(completed, 3);
}

}  // namespace
}  // namespace textgen
