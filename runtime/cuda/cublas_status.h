// Conversion of cuBLAS / cuBLASLt status codes to absl::Status.
//
//   CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle, desc, ...));
//
// CUBLAS_STATUS_ALLOC_FAILED becomes ResourceExhausted, CUBLAS_STATUS_INVALID_VALUE and
// CUBLAS_STATUS_NOT_SUPPORTED InvalidArgument, every other error Internal. Thread-safe.
#ifndef KILN_RUNTIME_CUDA_CUBLAS_STATUS_H_
#define KILN_RUNTIME_CUDA_CUBLAS_STATUS_H_

#include <cublas_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {

// Returns OK for CUBLAS_STATUS_SUCCESS, else a Status naming `context` and the code.
absl::Status ToStatus(cublasStatus_t status, absl::string_view context);

// Returns the enumerator's name ("CUBLAS_STATUS_ALLOC_FAILED").
const char* CublasStatusName(cublasStatus_t status);

}  // namespace kiln

#define CUBLAS_RETURN_IF_ERROR(call) RETURN_IF_ERROR(::kiln::ToStatus((call), #call))

#endif  // KILN_RUNTIME_CUDA_CUBLAS_STATUS_H_
