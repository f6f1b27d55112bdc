// Status propagation helpers. Abseil 20220623 has no status macros yet, so they live here, once.
#ifndef TIERD_COMMON_STATUS_MACROS_H_
#define TIERD_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TIERD_STATUS_CONCAT_INNER_(a, b) a##b
#define TIERD_STATUS_CONCAT_(a, b) TIERD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status tierd_status_ = (expr);         \
    if (!tierd_status_.ok()) return tierd_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr());` binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TIERD_ASSIGN_OR_RETURN_IMPL_(TIERD_STATUS_CONCAT_(tierd_statusor_, __LINE__), lhs, expr)

#define TIERD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TIERD_COMMON_STATUS_MACROS_H_
