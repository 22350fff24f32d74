// Status helpers shared by every layer.
//
// Abseil 20220623 ships no status macros and no logging, so we keep small ones here.
// RESHARD_CHECK is for broken internal invariants only: it aborts with a message and is never a
// way to report bad user input (that is an absl::Status).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RESHARD_CONCAT_INNER(a, b) a##b
#define RESHARD_CONCAT(a, b) RESHARD_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RESHARD_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::absl::Status reshard_status_ = (expr);          \
    if (!reshard_status_.ok()) return reshard_status_; \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns its status on error.
#define RESHARD_ASSIGN_OR_RETURN(lhs, expr) \
  RESHARD_ASSIGN_OR_RETURN_IMPL(RESHARD_CONCAT(reshard_statusor_, __LINE__), lhs, expr)
#define RESHARD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

namespace reshard::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const char* message);
}  // namespace reshard::internal

// Aborts with file, line and the failed condition. For invariants, never for user input.
#define RESHARD_CHECK(cond)                                                  \
  do {                                                                       \
    if (!(cond)) ::reshard::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define RESHARD_CHECK_MSG(cond, msg)                                            \
  do {                                                                          \
    if (!(cond)) ::reshard::internal::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
