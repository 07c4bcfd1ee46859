// RAII device memory and the host<->device copies kiln uses.
//
//   ASSIGN_OR_RETURN(kiln::DeviceBuffer kv, kiln::DeviceBuffer::Allocate(bytes, "kv cache"));
//   RETURN_IF_ERROR(kiln::CopyHostToDevice(kv.data(), pinned.data(), bytes, stream));
//   RETURN_IF_ERROR(kiln::FillDeviceAndWait(counters.data(), 0, counters.size(), "counters"));
//
// Allocate uses cudaMalloc and names the buffer in its ResourceExhausted message. Allocation
// is illegal during capture (FailedPrecondition; graph memory comes from GraphMemoryPool).
// Copies are asynchronous on the given stream; a copy to or from pageable host memory is
// illegal during capture (FailedPrecondition naming it) because it synchronizes.
// Movable, not copyable; frees on destruction. Not thread-safe.
#ifndef KILN_RUNTIME_CUDA_DEVICE_BUFFER_H_
#define KILN_RUNTIME_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class DeviceBuffer {
 public:
  // Allocates `bytes` (> 0) on the current device. `name` appears in errors.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, absl::string_view name = "buffer");

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  DeviceBuffer(void* data, size_t size, std::string name)
      : data_(data), size_(size), name_(std::move(name)) {}
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
};

// Returns true if `ptr` is host memory that CUDA does not know (pageable).
bool IsPageableHostMemory(const void* ptr);

// Copies `bytes` from host `src` to device `dst` on `stream`. Pinned `src` is asynchronous;
// pageable `src` is allowed only outside capture.
absl::Status CopyHostToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Copies `bytes` from device `src` to host `dst` on `stream`; asynchronous for pinned `dst`.
// Pageable `dst` is allowed only outside capture.
absl::Status CopyDeviceToHost(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Copies `bytes` between device buffers on `stream`; legal during capture.
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// Sets `bytes` bytes at device `dst` to `value` and returns once they are set, so that work on
// any stream sees them, kiln's non-blocking streams included: a bare cudaMemset is ordered only
// with the default stream's work and may land after a later copy or kernel on another stream
// (it overwrote a freshly uploaded KV block table under compute-sanitizer). For state a
// component initialises once, when it is created; not during capture. `name` appears in errors.
absl::Status FillDeviceAndWait(void* dst, int value, size_t bytes, absl::string_view name);

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_DEVICE_BUFFER_H_
