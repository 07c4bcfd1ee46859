// The collective-communication interface kiln's tensor-parallel code is written against, and the
// element types it reduces.
//
//   kiln::Communicator& comm = ...;   // NcclCommunicator or AutoCommunicator
//   RETURN_IF_ERROR(comm.AllReduce(partial, summed, hidden * tokens, kiln::DataType::kBf16,
//                                  stream));
//   ...
//   // Waits for the stream, bounded: a peer that died or hung shows up here as DeadlineExceeded.
//   RETURN_IF_ERROR(comm.SynchronizeStream(stream, absl::Seconds(30)));
//
// AllReduce is a sum over every rank, enqueued on `stream` (asynchronous). Every rank must make
// the same sequence of calls with the same count and dtype. Implementations say whether a call
// may be captured into a CUDA graph (all of kiln's may).
//
// Some implementations also fuse the all-reduce with the residual add and RMSNorm that follow it
// in a transformer layer (one kernel instead of two); ask first, with the step's sizes:
//
//   if (comm.SupportsAllReduceAddRmsNorm(tokens, hidden, kiln::DataType::kBf16)) {
//     kiln::AllReduceAddRmsNormArgs fused;
//     fused.partial = partial;  fused.residual = residual;  fused.weight = gamma;
//     fused.out = normed;  fused.tokens = tokens;  fused.hidden = hidden;  fused.eps = 1e-5f;
//     RETURN_IF_ERROR(comm.AllReduceAddRmsNorm(fused, stream));
//   } else {
//     ... comm.AllReduce(partial, summed, ...), then the add + RMSNorm kernel ...
//   }
#ifndef KILN_COLLECTIVES_COMMUNICATOR_H_
#define KILN_COLLECTIVES_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

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

// Returns the bytes of an all-reduce of `count` elements of `dtype` from `in` into `out` after the
// checks every implementation makes first: `dtype` one of DataType's values, count x element
// size within size_t, and `in` and `out` non-null unless `count` is 0. InvalidArgument naming
// the bad value otherwise (a bad call never reaches a kernel, where a null pointer would end the
// CUDA context and an out-of-range dtype or a wrapped size would reduce the wrong bytes).
// Thread-safe.
absl::StatusOr<size_t> CheckAllReduceArgs(const void* in, const void* out, size_t count,
                                          DataType dtype);

// One fused all-reduce + residual add + RMSNorm over rows of `hidden` elements (device pointers,
// owned by the caller, 16-byte aligned):
//   sum      = Σ over ranks of partial                 (float, ranks in a fixed order; rounded)
//   residual = sum + residual                          (rounded to dtype, written back)
//   out      = residual / sqrt(mean(residual²) + eps) · weight   (rounded to dtype)
// the same arithmetic, rounding and reduction order as an AllReduce followed by runtime/model's
// LaunchFusedAddRmsNorm, so both forms give the same bits (NaN payloads aside), on every rank.
struct AllReduceAddRmsNormArgs {
  const void* partial = nullptr;  // [tokens, hidden] this rank's partial sums
  void* residual = nullptr;       // [tokens, hidden] read and updated; must not overlap the rest
  const void* weight = nullptr;   // [hidden] the norm's weights
  void* out = nullptr;            // [tokens, hidden] the normed rows; may be `partial` itself
  int64_t tokens = 0;
  int64_t hidden = 0;
  float eps = 1e-5f;
  DataType dtype = DataType::kBf16;
};

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

  // Waits up to `timeout` for the work enqueued on `stream` so far (graph replays included),
  // then returns CheckAsyncErrors(). When the work has not finished by then, a peer died or
  // hung: aborts this communicator (NCCL's kernels wait for their peers without a limit) and,
  // within another `timeout`, returns DeadlineExceeded; the communicator is unusable afterwards
  // (every later call fails; recreate it on every rank). Aborted NCCL kernels of eager calls
  // return; those launched from a CUDA graph may keep waiting (NCCL 2.28), which the message
  // then says: the process should exit. Use it instead of cudaStreamSynchronize where a peer may
  // die. InvalidArgument for a `timeout` that is not positive (it would abort the communicator
  // whenever the stream still had work). Not during capture.
  absl::Status SynchronizeStream(cudaStream_t stream, absl::Duration timeout);

  // Returns whether AllReduceAddRmsNorm takes rows of this shape. The answer depends only on the
  // arguments and on how the communicator was created, never on the capture state or on
  // pointers, so it is the same at capture and at replay and on every rank: callers may choose
  // between the fused and the unfused form with it. The default: never. Thread-compatible.
  virtual bool SupportsAllReduceAddRmsNorm(int64_t tokens, int64_t hidden, DataType dtype) const {
    return false;
  }

  // Enqueues the fused all-reduce + residual add + RMSNorm of `args` on `stream` (asynchronous,
  // like AllReduce; every rank must make the same call). InvalidArgument when
  // SupportsAllReduceAddRmsNorm says no for these sizes or the pointers are misaligned or
  // overlap; the default implementation returns Unimplemented. Legal during capture where
  // AllReduce is.
  virtual absl::Status AllReduceAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                           cudaStream_t stream) {
    return absl::UnimplementedError(
        "This communicator has no fused all-reduce + add + RMSNorm; check "
        "SupportsAllReduceAddRmsNorm() and use AllReduce and a separate norm");
  }

 protected:
  // Called by SynchronizeStream when the stream did not finish in time, with the error every
  // later call must return: stops whatever waits for the peers without a limit. Default:
  // nothing (implementations whose waits are all bounded).
  virtual void AbortAfterTimeout(const absl::Status& error) {}
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_COMMUNICATOR_H_
