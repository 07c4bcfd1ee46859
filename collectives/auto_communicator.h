// The Communicator tensor-parallel code should use: NCCL plus, where the selection policy allows,
// the custom CUDA-IPC all-reduce, chosen per call (collectives/allreduce_policy.h).
//
//   kiln::AllReduceConfig config;                      // measured defaults
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::AutoCommunicator> comm,
//                    kiln::AutoCommunicator::Create(bootstrap, device, config));
//   RETURN_IF_ERROR(comm->AllReduce(x, x, n, kiln::DataType::kBf16, stream));   // eager
//
//   // Graphs: warm up eagerly, capture, then register on every rank before the first replay.
//   ... capture ...
//   RETURN_IF_ERROR(comm->RegisterGraphBuffers());
//   RETURN_IF_ERROR(comm->CheckReplayable());          // before each replay (cheap)
//
// The custom all-reduce exists only for world sizes 2, 4, 6, 8 when every rank proved P2P with
// a real IPC write; if anything about it fails at creation, every rank uses NCCL alone and one
// log line says why. Under capture, a call whose input cannot be exported over IPC takes NCCL
// (one log line the first time). The capture state is read on every call, from the stream and
// from //graph:capture_context, never cached. Not thread-safe; calls ordered on the device.
// The HostBootstrap must outlive this object; destruction is collective.
#ifndef KILN_COLLECTIVES_AUTO_COMMUNICATOR_H_
#define KILN_COLLECTIVES_AUTO_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/allreduce_policy.h"
#include "collectives/communicator.h"
#include "collectives/custom_allreduce.h"
#include "collectives/host_bootstrap.h"
#include "collectives/nccl_communicator.h"

namespace kiln {

// How many calls each path took, for tests and logs.
struct AllReduceStats {
  int64_t nccl = 0;
  int64_t one_shot_staged = 0;
  int64_t one_shot_registered = 0;
  int64_t two_shot_staged = 0;
  int64_t two_shot_registered = 0;
  int64_t ipc_fallbacks = 0;  // captured calls that wanted custom but took NCCL
  // Fused all-reduce + add + RMSNorm calls (each also counted as one-shot staged or registered).
  int64_t fused_add_rms_norm = 0;
};

class AutoCommunicator : public Communicator {
 public:
  // Creates the NCCL communicator and, when the config and world size allow, the custom
  // all-reduce. Collective. Errors only for NCCL failures or an invalid config; a custom
  // all-reduce that cannot be built is logged and left out on every rank alike.
  static absl::StatusOr<std::unique_ptr<AutoCommunicator>> Create(HostBootstrap& bootstrap,
                                                                  int device,
                                                                  const AllReduceConfig& config);

  // Tears down the custom all-reduce, then NCCL; aborts NCCL instead of finalizing it when a
  // custom barrier found a peer gone (finalizing would wait for that peer).
  ~AutoCommunicator() override;

  int rank() const override { return nccl_->rank(); }
  int world_size() const override { return nccl_->world_size(); }

  // Picks the path with SelectAllReduce and enqueues it. First returns the error that ends every
  // call, before the arguments are checked and whatever the path: the abort after a
  // SynchronizeStream timeout, then the custom all-reduce's sticky error: DeadlineExceeded once
  // one of its barriers timed out, Aborted once its capture agreement lost a peer (a lost peer,
  // which an NCCL call would wait for too, so never a fallback to NCCL). InvalidArgument, on
  // every path and before anything is enqueued, for what CheckAllReduceArgs refuses (a dtype
  // outside the enum, a size that overflows, null buffers). The arguments are checked once,
  // here: the custom or NCCL communicator under it enqueues without checking them again
  // (SelectAllReduce picks the custom kernels only for what CheckCustomAllReducePlan accepts).
  // Legal during capture.
  absl::Status AllReduce(const void* in, void* out, size_t count, DataType dtype,
                         cudaStream_t stream) override;

  // Returns whether AllReduceAddRmsNorm runs these rows fused: bf16, the custom all-reduce
  // present, and the policy picking its one-shot kernel for their size
  // (FusedAddRmsNormEligible). Depends only on the sizes and on how the communicator was
  // created, so every rank, capture and replay agree. Thread-compatible.
  bool SupportsAllReduceAddRmsNorm(int64_t tokens, int64_t hidden, DataType dtype) const override;

  // Enqueues the fused one-shot all-reduce + residual add + RMSNorm (CustomAllReduce). Rows of
  // at most 512 KiB take the push kernel (nothing to register; counted as one-shot staged);
  // larger ones the pull kernel, which under capture reads a registered input where the policy
  // would for a plain one-shot call (ChooseAllReduceInput), else the staging copy, and falls
  // back to staged on every rank when some rank cannot export its captured input. First returns
  // the errors that end every call, as AllReduce does; then InvalidArgument where
  // SupportsAllReduceAddRmsNorm says no. Legal during capture.
  absl::Status AllReduceAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                   cudaStream_t stream) override;

  // Returns the first error of either path (custom: DeadlineExceeded after a barrier timeout,
  // FailedPrecondition for a replay before registration).
  absl::Status CheckAsyncErrors() override;

  // Registers the inputs captured since the last call (collective; see CustomAllReduce). First
  // returns the errors that end every call, as AllReduce does, before any exchange.
  absl::Status RegisterGraphBuffers();

  // Returns FailedPrecondition while captured inputs await RegisterGraphBuffers.
  absl::Status CheckReplayable() const;

  // Returns the plan this call would take (the same decision AllReduce makes; the same
  // InvalidArgument for arguments it refuses).
  absl::StatusOr<AllReducePlan> Plan(const void* in, const void* out, size_t count,
                                     DataType dtype, cudaStream_t stream) const;

  bool custom_available() const { return custom_ != nullptr; }
  // Returns why the custom all-reduce is absent ("" when it is present).
  const std::string& custom_unavailable_reason() const { return custom_reason_; }
  const AllReduceStats& stats() const { return stats_; }
  const AllReduceConfig& config() const { return config_; }

  // Returns the parts (owned by this object; custom() may be null).
  NcclCommunicator* nccl() const { return nccl_.get(); }
  CustomAllReduce* custom() const { return custom_.get(); }

 private:
  AutoCommunicator(const AllReduceConfig& config, std::unique_ptr<NcclCommunicator> nccl)
      : config_(config), nccl_(std::move(nccl)) {}
  // Aborts NCCL; every later call returns `error`.
  void AbortAfterTimeout(const absl::Status& error) override;

  // One call as planned: its bytes (from CheckAllReduceArgs), its plan, and the stream's capture
  // status read for it (cudaStreamCaptureStatusNone, unread, when there is no custom all-reduce).
  struct PlannedCall {
    size_t bytes = 0;
    AllReducePlan plan;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  };
  // Checks the arguments (CheckAllReduceArgs) and plans the call, as Plan() documents.
  absl::StatusOr<PlannedCall> PlanCall(const void* in, const void* out, size_t count,
                                       DataType dtype, cudaStream_t stream) const;

  AllReduceConfig config_;
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<CustomAllReduce> custom_;  // destroyed first (collective barrier)
  absl::Status aborted_;  // set by SynchronizeStream's timeout
  std::string custom_reason_;
  AllReduceStats stats_;
  bool logged_ipc_fallback_ = false;
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_AUTO_COMMUNICATOR_H_
