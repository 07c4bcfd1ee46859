// Status propagation macros for absl::Status and absl::StatusOr (Debian's abseil ships none).
//
//   absl::StatusOr<Plan> MakePlan(...);
//   absl::Status Run() {
//     RETURN_IF_ERROR(Validate());
//     ASSIGN_OR_RETURN(Plan plan, MakePlan(...));
//     ...
//   }
//
// Header-only, host-only, no CUDA: planners and policies use it too.
#ifndef KILN_RUNTIME_CUDA_STATUS_MACROS_H_
#define KILN_RUNTIME_CUDA_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status kiln_status_ = (expr);                       \
    if (!kiln_status_.ok()) return kiln_status_;                \
  } while (false)

#define KILN_STATUS_CONCAT_INNER_(a, b) a##b
#define KILN_STATUS_CONCAT_(a, b) KILN_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::StatusOr<T>); on error returns its status, else moves the value
// into `lhs`, which may be a declaration (`ASSIGN_OR_RETURN(auto x, F())`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_STATUS_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)

#define KILN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // KILN_RUNTIME_CUDA_STATUS_MACROS_H_
