// StatusOr<T>: a T, or the Status that says why there is none.
#pragma once

#include <optional>
#include <type_traits>
#include <utility>

#include "textgen/base/check.h"
#include "textgen/base/status.h"

namespace textgen {

template <typename T>
class [[nodiscard]] StatusOr {
  static_assert(!std::is_same_v<std::remove_cvref_t<T>, Status>, "StatusOr<Status> is not allowed");

 public:
  // An error. Constructing from an OK status is a programming error.
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    TG_CHECK(!status_.ok(), "StatusOr constructed from an OK status");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT(google-explicit-constructor)
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::remove_cvref_t<U>, Status> &&
           !std::is_same_v<std::remove_cvref_t<U>, StatusOr<T>> &&
           !std::is_same_v<std::remove_cvref_t<U>, T>) StatusOr(U&& value)
      : value_(std::forward<U>(value)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // Accessors abort (with the status) when there is no value.
  const T& value() const& {
    checkHasValue();
    return *value_;
  }
  T& value() & {
    checkHasValue();
    return *value_;
  }
  T&& value() && {
    checkHasValue();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  template <typename U>
  T valueOr(U&& fallback) const& {
    return ok() ? *value_ : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void checkHasValue() const {
    TG_CHECK(value_.has_value(), "StatusOr has no value: {}", status_.toString());
  }

  Status status_;  // OK exactly when value_ holds a value
  std::optional<T> value_;
};

}  // namespace textgen

#define TG_STATUS_CONCAT_INNER_(a, b) a##b
#define TG_STATUS_CONCAT_(a, b) TG_STATUS_CONCAT_INNER_(a, b)

// TG_ASSIGN_OR_RETURN(auto x, f()); assigns the value of a StatusOr or returns its status.
// (The expression may contain commas.)
#define TG_ASSIGN_OR_RETURN(lhs, ...) \
  TG_ASSIGN_OR_RETURN_IMPL_(TG_STATUS_CONCAT_(tg_status_or_, __LINE__), lhs, __VA_ARGS__)
#define TG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, ...) \
  auto tmp = (__VA_ARGS__);                      \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
