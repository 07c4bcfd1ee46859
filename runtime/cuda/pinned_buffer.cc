#include "runtime/cuda/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::StatusOr<PinnedHostBuffer> PinnedHostBuffer::Allocate(size_t bytes,
                                                            absl::string_view name) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Pinned buffer '", name, "' of 0 bytes; ask for at least one byte"));
  }
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, absl::StrCat("cudaMallocHost of '", name, "'")));
  void* data = nullptr;
  cudaError_t error = cudaMallocHost(&data, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return ToStatus(error, absl::StrCat("cudaMallocHost of ", bytes, " bytes for '", name, "'"));
  }
  return PinnedHostBuffer(data, bytes);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

}  // namespace kiln
