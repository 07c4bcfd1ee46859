#include "collectives/communicator.h"

#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kBf16:
    case DataType::kFp16:
      return 2;
    case DataType::kFp32:
      return 4;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kBf16:
      return "bf16";
    case DataType::kFp16:
      return "fp16";
    case DataType::kFp32:
      return "fp32";
  }
  return "unknown";
}

absl::StatusOr<size_t> CheckAllReduceArgs(const void* in, const void* out, size_t count,
                                          DataType dtype) {
  const size_t element = DataTypeSize(dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "All-reduce dtype %d is not a DataType; pass DataType::kBf16, kFp16 or kFp32",
        static_cast<int>(dtype)));
  }
  if (count > std::numeric_limits<size_t>::max() / element) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "All-reduce of %d %s elements overflows size_t bytes; pass the element count, not a "
        "negative or wrapped value",
        count, DataTypeName(dtype)));
  }
  if (count > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "All-reduce of %d %s elements got a null buffer (in %p, out %p); pass device pointers "
        "(null only with count 0)",
        count, DataTypeName(dtype), in, out));
  }
  return count * element;
}

absl::Status Communicator::SynchronizeStream(cudaStream_t stream, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    // A zero or negative wait would abort the communicator whenever the stream still had work.
    return absl::InvalidArgumentError(absl::StrFormat(
        "Communicator::SynchronizeStream timeout %s must be positive; pass the longest a healthy "
        "step may take (a stuck peer shows up after it)",
        absl::FormatDuration(timeout)));
  }
  RETURN_IF_ERROR(CheckNotCapturing(stream, "Communicator::SynchronizeStream"));
  // Polls: a blocking wait could not be given up. Spins for the first millisecond (a decode
  // step's wait), then sleeps between polls.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return CheckAsyncErrors();
    if (state != cudaErrorNotReady) return ToStatus(state, "cudaStreamQuery");
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    if (now - start < absl::Milliseconds(1)) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(polls < 1000 ? 20 : 200));
    }
  }
  const absl::Status error = absl::DeadlineExceededError(absl::StrFormat(
      "Rank %d of %d: the stream's collectives did not finish within %s; a peer process died or "
      "is stuck. The communicator was aborted: recreate it on every rank",
      rank(), world_size(), absl::FormatDuration(timeout)));
  AbortAfterTimeout(error);
  // Aborted kernels of eager calls return; give them the same time again so the caller may free
  // its buffers. Those of a CUDA graph may not (NCCL 2.28): say so.
  const absl::Time drain = absl::Now() + timeout;
  bool stuck = true;
  while ((stuck = cudaStreamQuery(stream) == cudaErrorNotReady) && absl::Now() < drain) {
    absl::SleepFor(absl::Microseconds(200));
  }
  if (stuck) {
    return absl::DeadlineExceededError(absl::StrCat(
        error.message(), ". The stream's work is still waiting for the lost peer: exit the "
        "process (the GPU's work ends with it)"));
  }
  return error;
}

}  // namespace kiln
