// Status: the error value of textgen. A code from the gRPC/absl canonical set plus a message.
// Request and input errors travel as Status (or StatusOr<T>) and map onto HTTP and gRPC codes at
// the edges; exceptions never cross a module or thread boundary.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <utility>

namespace textgen {

// Values equal gRPC's status codes, so the shard service can hand them to grpc::Status unchanged.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
    if (code_ == StatusCode::kOk) message_.clear();
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message", or "OK".
  std::string toString() const;

  // Returns a copy whose message is "context: message"; OK stays OK.
  Status withContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status okStatus() {
  return Status();
}
inline Status cancelledError(std::string m) {
  return {StatusCode::kCancelled, std::move(m)};
}
inline Status unknownError(std::string m) {
  return {StatusCode::kUnknown, std::move(m)};
}
inline Status invalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status deadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status notFoundError(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status alreadyExistsError(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status permissionDeniedError(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status resourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status failedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status abortedError(std::string m) {
  return {StatusCode::kAborted, std::move(m)};
}
inline Status outOfRangeError(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
inline Status unimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status internalError(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
inline Status unavailableError(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status dataLossError(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status unauthenticatedError(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}

}  // namespace textgen

// Returns from the enclosing function if the expression (a Status) is not OK; variadic so that
// expressions with commas (template arguments) need no extra parentheses.
#define TG_RETURN_IF_ERROR(...)                   \
  do {                                            \
    ::textgen::Status tg_status_ = (__VA_ARGS__); \
    if (!tg_status_.ok()) return tg_status_;      \
  } while (0)
