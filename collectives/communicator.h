// The collective-communication interface kiln's tensor-parallel code is written against, and the
// element types it reduces.
//
//   kiln::Communicator& comm = ...;   // NcclCommunicator or AutoCommunicator
//   RETURN_IF_ERROR(comm.AllReduce(partial, summed, hidden * tokens, kiln::DataType::kBf16,
//                                  stream));
//   ...
//   RETURN_IF_ERROR(stream.Synchronize());
//   RETURN_IF_ERROR(comm.CheckAsyncErrors());   // a peer that died or hung shows up here
//
// AllReduce is a sum over every rank, enqueued on `stream` (asynchronous). Every rank must make
// the same sequence of calls with the same count and dtype. Implementations say whether a call
// may be captured into a CUDA graph (all of kiln's may).
#ifndef KILN_COLLECTIVES_COMMUNICATOR_H_
#define KILN_COLLECTIVES_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace kiln {

// Element types of a reduction. Sums accumulate in float for every type.
enum class DataType {
  kBf16,
  kFp16,
  kFp32,
};

// Returns the size of one element in bytes (2, 2, 4).
size_t DataTypeSize(DataType dtype);

// Returns "bf16", "fp16" or "fp32".
const char* DataTypeName(DataType dtype);

// A group of processes, one per GPU, that reduce together. Not copyable. Each instance is used
// by one thread at a time, and its calls must be ordered on the device (one stream, or streams
// ordered by events): the implementations keep per-call state on the device.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // Returns this process's rank in [0, world_size()).
  virtual int rank() const = 0;

  // Returns the number of processes in the group.
  virtual int world_size() const = 0;

  // Enqueues on `stream` the element-wise sum over all ranks of `count` elements of `dtype` at
  // `in` into `out` (device pointers, owned by the caller; `in == out` is allowed). Returns an
  // error if the call could not be enqueued; errors the device finds later (a peer that stopped
  // answering) are reported by CheckAsyncErrors and by the next call.
  virtual absl::Status AllReduce(const void* in, void* out, size_t count, DataType dtype,
                                 cudaStream_t stream) = 0;

  // Returns the first error that earlier, asynchronous calls met on the device, without waiting
  // for them: DeadlineExceeded when a peer stopped answering. Synchronize the stream first to
  // learn about the calls enqueued on it. Legal during capture.
  virtual absl::Status CheckAsyncErrors() = 0;
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_COMMUNICATOR_H_
