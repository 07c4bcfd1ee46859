// Conversion of NCCL results to absl::Status.
//
//   NCCL_RETURN_IF_ERROR(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, stream));
//
// ncclSystemError/ncclUnhandledCudaError that come from a failed allocation are reported by
// NCCL as such only in its log, so only the result code decides: every NCCL error is Internal
// except ncclInvalidArgument/ncclInvalidUsage (InvalidArgument). Thread-safe.
#ifndef KILN_RUNTIME_CUDA_NCCL_STATUS_H_
#define KILN_RUNTIME_CUDA_NCCL_STATUS_H_

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {

// Returns OK for ncclSuccess, else a Status naming `context` and the result.
absl::Status ToStatus(ncclResult_t result, absl::string_view context);

// Returns the enumerator's name ("ncclSystemError").
const char* NcclResultName(ncclResult_t result);

}  // namespace kiln

#define NCCL_RETURN_IF_ERROR(call) RETURN_IF_ERROR(::kiln::ToStatus((call), #call))

#endif  // KILN_RUNTIME_CUDA_NCCL_STATUS_H_
