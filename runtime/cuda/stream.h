// RAII CUDA stream.
//
//   ASSIGN_OR_RETURN(kiln::Stream stream, kiln::Stream::Create());
//   kernel<<<grid, block, 0, stream.get()>>>(...);
//   RETURN_IF_ERROR(stream.Synchronize());
//
// Create makes a non-blocking stream on the current device (graph capture needs a stream other
// than the legacy default stream). Movable, not copyable; destroys the stream on destruction.
// A Stream is used by one thread at a time.
#ifndef KILN_RUNTIME_CUDA_STREAM_H_
#define KILN_RUNTIME_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

class Stream {
 public:
  // Creates a non-blocking stream on the current device. `priority` follows
  // cudaDeviceGetStreamPriorityRange (lower is higher priority; 0 is the default).
  static absl::StatusOr<Stream> Create(int priority = 0);

  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  // Returns the raw handle; the Stream keeps ownership.
  cudaStream_t get() const { return stream_; }

  // Waits for all work on the stream. FailedPrecondition during capture (a synchronize would
  // invalidate it) and on an empty Stream (default-constructed or moved from).
  absl::Status Synchronize() const;

 private:
  explicit Stream(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_ = nullptr;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_STREAM_H_
