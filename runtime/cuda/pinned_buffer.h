// RAII page-locked (pinned) host memory: the source of every async host-to-device copy that
// may happen during capture or right before replay (plans, metadata).
//
//   ASSIGN_OR_RETURN(kiln::PinnedHostBuffer staging, kiln::PinnedHostBuffer::Allocate(bytes));
//   std::memcpy(staging.data(), plan.data(), bytes);
//   RETURN_IF_ERROR(kiln::CopyHostToDevice(dev.data(), staging.data(), bytes, stream));
//
// Allocation is illegal during capture (FailedPrecondition). Movable, not copyable; frees on
// destruction. Not thread-safe.
#ifndef KILN_RUNTIME_CUDA_PINNED_BUFFER_H_
#define KILN_RUNTIME_CUDA_PINNED_BUFFER_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class PinnedHostBuffer {
 public:
  // Allocates `bytes` (> 0) of pinned host memory. `name` appears in errors.
  static absl::StatusOr<PinnedHostBuffer> Allocate(size_t bytes,
                                                   absl::string_view name = "pinned buffer");

  PinnedHostBuffer() = default;
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  PinnedHostBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_PINNED_BUFFER_H_
