// Communicator over NCCL for the processes of one host (one per GPU). The NCCL unique id travels
// through the HostBootstrap; initialisation is bounded by a timeout (it runs on a helper thread),
// and the communicator itself is a blocking one, the fast kind for eager calls.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::NcclCommunicator> nccl,
//                    kiln::NcclCommunicator::Create(bootstrap, device, absl::Seconds(120)));
//   RETURN_IF_ERROR(nccl->AllReduce(in, out, count, kiln::DataType::kBf16, stream));
//
// AllReduce may be captured into a CUDA graph (make one eager call of each size first, so NCCL
// connects outside the capture). NCCL's kernels have no timeout: a peer that dies inside an
// NCCL collective hangs it until the communicator is aborted: wait for the stream with
// SynchronizeStream(stream, timeout), which aborts it after the timeout (AutoCommunicator also
// prefers the custom all-reduce, whose waits are bounded, wherever it applies). Not
// thread-safe; the bootstrap is needed only during Create.
#ifndef KILN_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define KILN_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/host_bootstrap.h"

namespace kiln {

class NcclCommunicator : public Communicator {
 public:
  // Makes `device` current and joins the NCCL communicator of the bootstrap's ranks (rank 0
  // creates the unique id and broadcasts it). Collective. DeadlineExceeded if the ranks have not
  // all joined within `timeout`; the helper thread then stays blocked in NCCL, so the process
  // should exit. InvalidArgument for a `timeout` that is not positive. Not during capture.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(HostBootstrap& bootstrap,
                                                                  int device,
                                                                  absl::Duration timeout);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  // Enqueues ncclAllReduce(sum). Once aborted, returns the abort's reason, before any check of
  // the arguments. InvalidArgument for what CheckAllReduceArgs refuses (a dtype outside the enum,
  // a size that overflows, null buffers), before anything is enqueued; an AutoCommunicator call
  // checks them once, when it plans, and skips them here. Legal during capture.
  absl::Status AllReduce(const void* in, void* out, size_t count, DataType dtype,
                         cudaStream_t stream) override;

  // Returns ncclCommGetAsyncError as a Status.
  absl::Status CheckAsyncErrors() override;

  // Aborts the communicator now (ncclCommAbort) instead of finalizing it with its peers on
  // destruction: for when a peer is known to be gone. NCCL kernels still waiting for peers
  // return. Later calls return `reason` (a FailedPrecondition when `reason` is OK).
  void Abort(absl::Status reason =
                 absl::FailedPreconditionError("The NCCL communicator was aborted"));

  // Like Abort, but ncclCommAbort runs on a detached thread of its own and this returns at once:
  // with NCCL 2.28, ncclCommAbort blocks while kernels launched from a CUDA graph still wait for
  // a dead peer (kernels of eager calls return and it completes). Later calls return `reason`
  // (a FailedPrecondition when `reason` is OK).
  // If those kernels never end, the process cannot use this GPU any more and should exit.
  void AbortWithoutWaiting(absl::Status reason);

  // Returns the raw communicator; this object keeps ownership.
  ncclComm_t comm() const { return comm_; }

 private:
  // AutoCommunicator checks a call's arguments once, when it plans it, then enqueues it through
  // EnqueueAllReduce.
  friend class AutoCommunicator;

  NcclCommunicator(ncclComm_t comm, int rank, int world_size, absl::Duration timeout)
      : comm_(comm), rank_(rank), world_size_(world_size), timeout_(timeout) {}
  // Enqueues ncclAllReduce(sum) of arguments that passed CheckAllReduceArgs; returns the abort
  // reason once aborted.
  absl::Status EnqueueAllReduce(const void* in, void* out, size_t count, DataType dtype,
                                cudaStream_t stream);
  absl::Status Await(ncclResult_t result, const char* what);
  void AbortAfterTimeout(const absl::Status& error) override { AbortWithoutWaiting(error); }

  ncclComm_t comm_;
  int rank_;
  int world_size_;
  absl::Duration timeout_;
  absl::Status aborted_;  // what every call returns once aborted
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_NCCL_COMMUNICATOR_H_
