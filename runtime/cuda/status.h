// Conversion of CUDA runtime and driver errors to absl::Status, at the component boundary.
//
//   RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(p, 0, n, s), "cudaMemsetAsync(kv cache)"));
//   CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));   // context is the call's text
//
// Out-of-memory errors become ResourceExhausted; every other error becomes Internal with the
// context and the error's name and description. Thread-safe; may be called during capture.
#ifndef KILN_RUNTIME_CUDA_STATUS_H_
#define KILN_RUNTIME_CUDA_STATUS_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {

// Returns OK for cudaSuccess, else a Status naming `context` and the error: its name and
// description, or "cudaError_t <n>" for a value this CUDA runtime does not know.
absl::Status ToStatus(cudaError_t error, absl::string_view context);

// Returns OK for CUDA_SUCCESS, else a Status naming `context` and the error. Needs no driver
// library: names come from a table in kiln, so it works where libcuda is absent.
absl::Status ToStatus(CUresult result, absl::string_view context);

// Returns the name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult <n>" if unknown
// (never null; that text lives in a per-thread buffer until this thread's next unknown code).
const char* CuResultName(CUresult result);

}  // namespace kiln

// Evaluates a CUDA runtime or driver call; on error returns its Status with the call's text.
#define CUDA_RETURN_IF_ERROR(call) RETURN_IF_ERROR(::kiln::ToStatus((call), #call))

#endif  // KILN_RUNTIME_CUDA_STATUS_H_
