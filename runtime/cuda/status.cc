#include "runtime/cuda/status.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status ToStatus(cudaError_t error, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The runtime names every code it knows "cudaError..."; any other value (a newer runtime's code
  // passed through, a corrupted one) it calls "unrecognized error code", which would leave the
  // message without the value: name the number then.
  const char* name = cudaGetErrorName(error);
  const char* description = cudaGetErrorString(error);
  std::string message =
      name != nullptr && absl::StartsWith(name, "cuda")
          ? absl::StrCat(context, " failed: ", name, " (",
                         description != nullptr ? description : "no description", ")")
          : absl::StrCat(context, " failed: cudaError_t ", static_cast<int>(error),
                         " (an error code this CUDA runtime does not know)");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

const char* CuResultName(CUresult result) {
  switch (result) {
#define KILN_CU_CASE(x) \
  case x:               \
    return #x;
    KILN_CU_CASE(CUDA_SUCCESS)
    KILN_CU_CASE(CUDA_ERROR_INVALID_VALUE)
    KILN_CU_CASE(CUDA_ERROR_OUT_OF_MEMORY)
    KILN_CU_CASE(CUDA_ERROR_NOT_INITIALIZED)
    KILN_CU_CASE(CUDA_ERROR_DEINITIALIZED)
    KILN_CU_CASE(CUDA_ERROR_STUB_LIBRARY)
    KILN_CU_CASE(CUDA_ERROR_NO_DEVICE)
    KILN_CU_CASE(CUDA_ERROR_INVALID_DEVICE)
    KILN_CU_CASE(CUDA_ERROR_INVALID_CONTEXT)
    KILN_CU_CASE(CUDA_ERROR_MAP_FAILED)
    KILN_CU_CASE(CUDA_ERROR_ALREADY_MAPPED)
    KILN_CU_CASE(CUDA_ERROR_NOT_MAPPED)
    KILN_CU_CASE(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    KILN_CU_CASE(CUDA_ERROR_INVALID_HANDLE)
    KILN_CU_CASE(CUDA_ERROR_NOT_FOUND)
    KILN_CU_CASE(CUDA_ERROR_NOT_READY)
    KILN_CU_CASE(CUDA_ERROR_ILLEGAL_ADDRESS)
    KILN_CU_CASE(CUDA_ERROR_LAUNCH_FAILED)
    KILN_CU_CASE(CUDA_ERROR_LAUNCH_TIMEOUT)
    KILN_CU_CASE(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    KILN_CU_CASE(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    KILN_CU_CASE(CUDA_ERROR_NOT_PERMITTED)
    KILN_CU_CASE(CUDA_ERROR_NOT_SUPPORTED)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    KILN_CU_CASE(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    KILN_CU_CASE(CUDA_ERROR_CAPTURED_EVENT)
    KILN_CU_CASE(CUDA_ERROR_UNKNOWN)
#undef KILN_CU_CASE
    default: {
      // Per thread, so concurrent callers each keep their own text until their next call.
      thread_local char unknown[32];
      std::snprintf(unknown, sizeof(unknown), "CUresult %d", static_cast<int>(result));
      return unknown;
    }
  }
}

absl::Status ToStatus(CUresult result, absl::string_view context) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  std::string message = absl::StrCat(context, " failed: ", CuResultName(result));
  if (result == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace kiln
