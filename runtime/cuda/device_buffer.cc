#include "runtime/cuda/device_buffer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"

namespace kiln {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, absl::string_view name) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Device buffer '", name, "' of 0 bytes; ask for at least one byte"));
  }
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, absl::StrCat("cudaMalloc of '", name, "'")));
  void* data = nullptr;
  cudaError_t error = cudaMalloc(&data, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return ToStatus(error, absl::StrCat("cudaMalloc of ", bytes, " bytes for '", name, "'"));
  }
  return DeviceBuffer(data, bytes, std::string(name));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

bool IsPageableHostMemory(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return attributes.type == cudaMemoryTypeUnregistered;
}

absl::Status CopyHostToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if (IsPageableHostMemory(src)) {
    RETURN_IF_ERROR(CheckNotCapturing(
        stream, absl::StrCat("Copy of ", bytes, " bytes from pageable host memory to device")));
  }
  return ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync(host to device)");
}

absl::Status CopyDeviceToHost(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if (IsPageableHostMemory(dst)) {
    RETURN_IF_ERROR(CheckNotCapturing(
        stream, absl::StrCat("Copy of ", bytes, " bytes from device to pageable host memory")));
  }
  return ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync(device to host)");
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  return ToStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync(device to device)");
}

absl::Status FillDeviceAndWait(void* dst, int value, size_t bytes, absl::string_view name) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotCapturing(nullptr, absl::StrCat("Filling '", name, "'")));
  RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(dst, value, bytes, nullptr),
                           absl::StrCat("cudaMemsetAsync of ", bytes, " bytes of '", name, "'")));
  return ToStatus(cudaStreamSynchronize(nullptr),
                  absl::StrCat("cudaStreamSynchronize after filling '", name, "'"));
}

}  // namespace kiln
