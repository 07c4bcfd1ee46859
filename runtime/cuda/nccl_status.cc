#include "runtime/cuda/nccl_status.h"

#include "absl/strings/str_cat.h"

namespace kiln {

const char* NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult(unknown)";
  }
}

absl::Status ToStatus(ncclResult_t result, absl::string_view context) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(context, " failed: ", NcclResultName(result), " (",
                                     ncclGetErrorString(result), ")");
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

}  // namespace kiln
