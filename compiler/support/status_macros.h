// Early returns for absl::Status and absl::StatusOr, so a function that calls five fallible
// steps reads as five lines instead of fifteen:
//
//   ASSIGN_OR_RETURN(Graph g, decode(bytes));       // declares g, or returns the error
//   ASSIGN_OR_RETURN(auto linear, linearize(g));
//   RETURN_IF_ERROR(verify_linear(*linear));
//
// Both return the callee's status unchanged; add context at the call site with
// ASSIGN_OR_RETURN(lhs, expr, prefix) where prefix is text put in front of the message
// (the code is kept). They work in any function whose return type is constructible from
// absl::Status (absl::Status itself, absl::StatusOr<T>). gRPC handlers return grpc::Status
// and convert once at their edge instead.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace uop::status_internal {

inline const absl::Status& status_of(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& status_of(const absl::StatusOr<T>& s) { return s.status(); }

// The same code with `prefix` in front of the message.
inline absl::Status with_prefix(const absl::Status& s, const std::string& prefix) {
  if (prefix.empty()) return s;
  return absl::Status(s.code(), prefix + std::string(s.message()));
}

}  // namespace uop::status_internal

#define UOP_STATUS_CONCAT_INNER(a, b) a##b
#define UOP_STATUS_CONCAT(a, b) UOP_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr); returns its status when not ok.
#define RETURN_IF_ERROR(expr)                                                      \
  do {                                                                             \
    if (const auto& uop_status_ = (expr); !uop_status_.ok())                       \
      return ::uop::status_internal::status_of(uop_status_);                       \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, prefix): evaluates `expr`, an
// absl::StatusOr<T>; on error returns its status (with `prefix` in front of the message when
// given), otherwise moves the value into `lhs`, which may be a declaration.
#define ASSIGN_OR_RETURN(...)                                                      \
  UOP_ASSIGN_OR_RETURN_PICK(__VA_ARGS__, UOP_ASSIGN_OR_RETURN_3, UOP_ASSIGN_OR_RETURN_2, ) \
  (__VA_ARGS__)
#define UOP_ASSIGN_OR_RETURN_PICK(a, b, c, name, ...) name
#define UOP_ASSIGN_OR_RETURN_2(lhs, expr) \
  UOP_ASSIGN_OR_RETURN_IMPL(UOP_STATUS_CONCAT(uop_statusor_, __LINE__), lhs, expr, std::string())
#define UOP_ASSIGN_OR_RETURN_3(lhs, expr, prefix) \
  UOP_ASSIGN_OR_RETURN_IMPL(UOP_STATUS_CONCAT(uop_statusor_, __LINE__), lhs, expr, prefix)
#define UOP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr, prefix)                          \
  auto tmp = (expr);                                                               \
  if (!tmp.ok()) return ::uop::status_internal::with_prefix(tmp.status(), (prefix)); \
  lhs = std::move(tmp).value()
