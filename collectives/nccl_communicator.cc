#include "collectives/nccl_communicator.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
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
  if (timeout <= absl::ZeroDuration()) {
    // Checked before the id goes out: a rank that gave up at once would leave its peers'
    // initialisation waiting and its own helper thread joining without it.
    return absl::InvalidArgumentError(absl::StrFormat(
        "NcclCommunicator::Create timeout %s must be positive; pass how long every rank may "
        "take to join",
        absl::FormatDuration(timeout)));
  }
  RETURN_IF_ERROR(CheckNotCapturing(cudaStreamLegacy, "NcclCommunicator::Create"));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  ASSIGN_OR_RETURN(
      std::string shared,
      bootstrap.Broadcast(absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id)),
                          "nccl_communicator.unique_id"));
  if (shared.size() != sizeof(id)) {
    return absl::InternalError(absl::StrFormat("NCCL unique id from rank 0 has %d bytes, not %d",
                                               shared.size(), sizeof(id)));
  }
  std::memcpy(&id, shared.data(), sizeof(id));

  // A blocking communicator: in NCCL's non-blocking mode every collective is launched from a
  // helper thread and returns ncclInProgress, which measured ~190 us per eager call on H200s
  // (against ~6 us replayed in a graph). The one step that can hang on a missing peer, the
  // initialisation, runs on a thread of its own so that this call still returns within
  // `timeout`; on a timeout that thread is left blocked inside NCCL (the job is lost anyway:
  // a peer never joined) and the state it shares is kept alive by the shared_ptr.
  struct InitState {
    absl::Mutex mu;
    bool done = false;
    ncclResult_t result = ncclInternalError;
    ncclComm_t comm = nullptr;
  };
  auto state = std::make_shared<InitState>();
  const int world = bootstrap.world_size();
  const int rank = bootstrap.rank();
  std::thread([state, world, id, rank, device]() {
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclUnhandledCudaError;
    if (cudaSetDevice(device) == cudaSuccess) {  // NCCL binds to the calling thread's device
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      result = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    }
    absl::MutexLock lock(&state->mu);
    state->comm = comm;
    state->result = result;
    state->done = true;
  }).detach();
  absl::MutexLock lock(&state->mu);
  if (!state->mu.AwaitWithTimeout(absl::Condition(&state->done), timeout)) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "ncclCommInitRankConfig (rank %d of %d) did not finish within %s; a peer rank is "
        "missing, stuck or dead. Its thread stays blocked in NCCL: end this process",
        rank, world, absl::FormatDuration(timeout)));
  }
  if (state->result != ncclSuccess) {
    if (state->comm != nullptr) ncclCommAbort(state->comm);
    return ToStatus(state->result, "ncclCommInitRankConfig");
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(state->comm, rank, world, timeout));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm_, &state);
  // Finalize flushes outstanding work (it talks to the peers); after an error, abort instead.
  if (state == ncclSuccess && ncclCommFinalize(comm_) == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

namespace {

// Returns the error later calls of an aborted communicator return: `reason`, or a
// FailedPrecondition when it is OK (those calls must not pass for all-reduces that never ran).
absl::Status AbortedStatus(absl::Status reason) {
  if (!reason.ok()) return reason;
  return absl::FailedPreconditionError(
      "The NCCL communicator was aborted; recreate it on every rank");
}

}  // namespace

void NcclCommunicator::Abort(absl::Status reason) {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  if (aborted_.ok()) aborted_ = AbortedStatus(std::move(reason));
}

void NcclCommunicator::AbortWithoutWaiting(absl::Status reason) {
  if (aborted_.ok()) aborted_ = AbortedStatus(std::move(reason));
  if (comm_ == nullptr) return;
  ncclComm_t comm = comm_;
  comm_ = nullptr;
  std::thread([comm] { ncclCommAbort(comm); }).detach();
}

absl::Status NcclCommunicator::Await(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return ToStatus(result, what);
  return WaitForComm(comm_, absl::Now() + timeout_, what, timeout_);
}

absl::Status NcclCommunicator::AllReduce(const void* in, void* out, size_t count, DataType dtype,
                                         cudaStream_t stream) {
  // The abort's reason first: once a peer is lost, it is what every call reports, whatever its
  // arguments (EnqueueAllReduce asks again for AutoCommunicator's calls, which skip this).
  if (comm_ == nullptr) return aborted_;
  // ToNccl would read a dtype outside the enum as fp32, over twice the bytes of a 16-bit one.
  RETURN_IF_ERROR(CheckAllReduceArgs(in, out, count, dtype).status());
  return EnqueueAllReduce(in, out, count, dtype, stream);
}

absl::Status NcclCommunicator::EnqueueAllReduce(const void* in, void* out, size_t count,
                                                DataType dtype, cudaStream_t stream) {
  if (comm_ == nullptr) return aborted_;
  return Await(ncclAllReduce(in, out, count, ToNccl(dtype), ncclSum, comm_, stream),
               "ncclAllReduce");
}

absl::Status NcclCommunicator::CheckAsyncErrors() {
  if (comm_ == nullptr) return aborted_;
  ncclResult_t state = ncclSuccess;
  NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  return ToStatus(state, "NCCL communicator");
}

}  // namespace kiln
