#include "runtime/cuda/stream.h"

#include <utility>

#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::StatusOr<Stream> Stream::Create(int priority) {
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  return Stream(stream);
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status Stream::Synchronize() const {
  if (stream_ == nullptr) {
    // cudaStreamSynchronize(nullptr) would wait for the legacy default stream, which kiln's
    // non-blocking streams do not order with: it could return before this stream's work ends.
    return absl::FailedPreconditionError(
        "Stream::Synchronize on an empty Stream (default-constructed or moved from); make one "
        "with Stream::Create");
  }
  RETURN_IF_ERROR(CheckNotCapturing(stream_, "Stream::Synchronize (cudaStreamSynchronize)"));
  return ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace kiln
