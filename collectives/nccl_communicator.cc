#include "collectives/nccl_communicator.h"

#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/nccl_status.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

ncclDataType_t ToNccl(DataType dtype) {
  switch (dtype) {
    case DataType::kBf16:
      return ncclBfloat16;
    case DataType::kFp16:
      return ncclFloat16;
    case DataType::kFp32:
      return ncclFloat32;
  }
  return ncclFloat32;
}

// Polls a non-blocking communicator until its last operation finished or `deadline` passed.
absl::Status WaitForComm(ncclComm_t comm, absl::Time deadline, const char* what,
                         absl::Duration timeout) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return ToStatus(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s did not finish within %s; a peer rank is missing, stuck or dead", what,
          absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Microseconds(100));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    HostBootstrap& bootstrap, int device, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckNotCapturing(cudaStreamLegacy, "NcclCommunicator::Create"));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  ASSIGN_OR_RETURN(std::string shared, bootstrap.Broadcast(absl::string_view(
                                           reinterpret_cast<const char*>(&id), sizeof(id))));
  if (shared.size() != sizeof(id)) {
    return absl::InternalError(absl::StrFormat("NCCL unique id from rank 0 has %d bytes, not %d",
                                               shared.size(), sizeof(id)));
  }
  std::memcpy(&id, shared.data(), sizeof(id));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer becomes a timeout instead of a hang
  ncclComm_t comm = nullptr;
  const absl::Time deadline = absl::Now() + timeout;
  ncclResult_t started =
      ncclCommInitRankConfig(&comm, bootstrap.world_size(), id, bootstrap.rank(), &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return ToStatus(started, "ncclCommInitRankConfig");
  }
  absl::Status ready = WaitForComm(comm, deadline, "ncclCommInitRankConfig", timeout);
  if (!ready.ok()) {
    ncclCommAbort(comm);
    return ready;
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, bootstrap.rank(), bootstrap.world_size(), timeout));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm_, &state);
  bool clean = state == ncclSuccess;
  if (clean) {
    ncclResult_t r = ncclCommFinalize(comm_);
    clean = (r == ncclSuccess || r == ncclInProgress) &&
            WaitForComm(comm_, absl::Now() + timeout_, "ncclCommFinalize", timeout_).ok();
  }
  if (clean) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

absl::Status NcclCommunicator::Await(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return ToStatus(result, what);
  return WaitForComm(comm_, absl::Now() + timeout_, what, timeout_);
}

absl::Status NcclCommunicator::AllReduce(const void* in, void* out, size_t count, DataType dtype,
                                         cudaStream_t stream) {
  return Await(ncclAllReduce(in, out, count, ToNccl(dtype), ncclSum, comm_, stream),
               "ncclAllReduce");
}

absl::Status NcclCommunicator::CheckAsyncErrors() {
  ncclResult_t state = ncclSuccess;
  NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  return ToStatus(state, "NCCL communicator");
}

}  // namespace kiln
