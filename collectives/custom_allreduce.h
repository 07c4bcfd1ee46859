// All-reduce over CUDA IPC for the GPUs of one host: one-shot (every rank reads every peer) and
// two-shot (reduce-scatter, then all-gather) kernels with 16-byte loads, float accumulation and
// the same rank order everywhere, so every rank gets the same bits. Most callers use
// AutoCommunicator, which picks this or NCCL per call; use this class directly to force an
// algorithm (benchmarks, tests).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<kiln::CustomAllReduce> ar,
//                    kiln::CustomAllReduce::Create(bootstrap, device, config));
//   kiln::AllReducePlan plan{kiln::AllReduceAlgorithm::kOneShot, kiln::AllReduceInput::kStaged};
//   RETURN_IF_ERROR(ar->AllReduce(in, out, count, kiln::DataType::kBf16, plan, stream));
//
//   // CUDA graphs: capture, register (every rank), then replay.
//   ... capture calls with plan.input = kRegistered (or let AutoCommunicator choose) ...
//   RETURN_IF_ERROR(ar->RegisterGraphBuffers());     // collective, outside capture
//   RETURN_IF_ERROR(ar->CheckReplayable());          // OK now
//   cudaGraphLaunch(exec, stream);
//
// State machine of a captured input (one device table slot per captured registered call):
//   captured (address and IPC handle recorded, slot not ready)
//     ──RegisterGraphBuffers() on every rank──► registered (slot holds every rank's address)
// How a replay before registration is kept from touching peer memory:
//   1. CheckReplayable() returns FailedPrecondition while any captured slot is unregistered; a
//      graph runner calls it before each replay.
//   2. The kernel reads its peers' input addresses from the device table, never from kernel
//      arguments. An unregistered slot has ready == 0 and no addresses; the kernel then touches
//      no peer memory, leaves its output unwritten and sets a host-mapped flag, which
//      CheckAsyncErrors() (and the next AllReduce) reports as FailedPrecondition. Every rank
//      skips alike, so the ranks' call counters stay in step and later calls work.
//   3. Registration is all-or-nothing across ranks: handles are opened everywhere, the ranks
//      agree that all opened, and only then is the table written.
// A dead or stuck peer: every barrier wait is bounded by barrier_timeout_ms (device clock); the
// kernel then sets a host-mapped flag and returns, and later kernels return at once. The host
// sees DeadlineExceeded from CheckAsyncErrors() and every later call; the object is unusable
// and must be recreated on all ranks. Host-side exchanges are bounded by the bootstrap timeout;
// one that fails while recording a captured input (Aborted for a peer that exited) is sticky
// the same way.
//
// Memory: one IPC region per rank of 2 * buffer_bytes + 64 KiB, shared with every peer, plus a
// device table of max_graph_inputs * 136 bytes, plus the fused all-reduce + RMSNorm's push buffer
// of 2 * world_size * 512 KiB (also shared with every peer). Not thread-safe; calls must be ordered
// on the device (see Communicator). The HostBootstrap must outlive this object. Destruction is
// collective (it waits at a bootstrap barrier so no peer still reads this rank's memory).
#ifndef KILN_COLLECTIVES_CUSTOM_ALLREDUCE_H_
#define KILN_COLLECTIVES_CUSTOM_ALLREDUCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/allreduce_config.pb.h"
#include "collectives/allreduce_policy.h"
#include "collectives/communicator.h"
#include "collectives/host_bootstrap.h"
#include "collectives/internal/custom_allreduce_kernels.h"
#include "collectives/internal/graph_input_record.h"

namespace kiln {

class CustomAllReduce {
 public:
  // Allocates this rank's IPC region, exchanges handles with every peer through `bootstrap`,
  // and proves P2P by having every rank write a record into every peer's memory through the
  // mapping and checking what arrived. Collective; every rank gets the same outcome:
  // Unavailable when any rank failed (IPC, P2P, allocation), naming the rank and the cause;
  // InvalidArgument for a world size other than 2, 4, 6, 8 or an invalid config;
  // FailedPrecondition when the ranks' configs differ; Aborted when an exchange itself fails
  // because the bootstrap lost a peer (never Unavailable, which AutoCommunicator takes as the
  // ranks' agreement to use NCCL alone); the bootstrap's other errors keep their code, with
  // this rank and the exchange's call name added. Sets `device` current. Not during capture.
  static absl::StatusOr<std::unique_ptr<CustomAllReduce>> Create(HostBootstrap& bootstrap,
                                                                 int device,
                                                                 const AllReduceConfig& config);

  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Returns the largest input in bytes (config.buffer_bytes).
  size_t max_bytes() const { return half_bytes_; }

  // Enqueues the sum of `count` elements of `dtype` over all ranks from `in` into `out` with
  // `plan` (algorithm kOneShot or kTwoShot). First returns what CheckAsyncErrors reports (the
  // sticky DeadlineExceeded once a barrier timed out), before any check of the arguments: a lost
  // peer is what the caller must act on. Checks on every call, capturing or not, before anything
  // is enqueued: CheckAllReduceArgs (dtype, size overflow, non-null buffers),
  // CheckCustomAllReducePlan (the plan, bytes a positive multiple of 16 and at most max_bytes(),
  // 16-byte-aligned pointers, for a one-shot registered call no overlap of in and out) and a
  // registered input only while `stream` is capturing (InvalidArgument otherwise); an
  // AutoCommunicator call makes the first two once, when it plans (allreduce_policy.h), and
  // skips them here. Reads the capture state on every call (cudaStreamIsCapturing
  // and //graph:capture_context; FailedPrecondition when the context says capture but `stream`
  // is not capturing). Under capture with a registered input it records the input's IPC handle
  // and takes the next table slot after all ranks agree they could (a host exchange);
  // Unavailable when any rank could not export its input (the caller falls back to NCCL); when
  // that exchange itself fails, its error (Aborted for a lost peer, never Unavailable) becomes
  // the sticky error.
  absl::Status AllReduce(const void* in, void* out, size_t count, DataType dtype,
                         const AllReducePlan& plan, cudaStream_t stream);

  // Returns whether AllReduceAddRmsNorm's kernel takes these rows: bf16, hidden a positive
  // multiple of 8 of at most kFusedAddRmsNormMaxHidden, tokens * hidden * 2 bytes at most
  // max_bytes(). (AutoCommunicator also applies its one-shot crossover.) Thread-compatible.
  bool SupportsAddRmsNorm(int64_t tokens, int64_t hidden, DataType dtype) const;

  // Returns whether AllReduceAddRmsNorm moves these rows with the push kernel (rows of at most
  // 512 KiB in all: every rank writes its partial sums into its peers' push buffers, which the
  // readers poll; no barrier, no graph-input registration), else the pull kernel.
  bool AddRmsNormPushes(int64_t tokens, int64_t hidden) const;

  // Enqueues the one-shot all-reduce of args.partial fused with the residual add and RMSNorm
  // (communicator.h, AllReduceAddRmsNormArgs), with programmatic dependent launch (the kernel
  // starts while the one before it finishes; the next one may start before it ends). Rows that
  // AddRmsNormPushes take the push kernel and `input` only has to pass the checks below; larger
  // ones the pull kernel, reading the input as `input` says. First returns what CheckAsyncErrors
  // reports, as AllReduce does. Checks on every call, capturing or not, before anything is
  // enqueued: SupportsAddRmsNorm (an AutoCommunicator call asks it once, in
  // SupportsAllReduceAddRmsNorm), 16-byte-aligned pointers, residual and weight overlapping
  // nothing else, out either exactly partial (staged only) or disjoint from it, and a registered
  // input only while `stream` is capturing (InvalidArgument otherwise). Capture state, graph-input
  // recording (Unavailable when some rank could not export its input: retry staged),
  // registration and the epoch are as for AllReduce; a fused call is one more call of the same
  // sequence.
  absl::Status AllReduceAddRmsNorm(const AllReduceAddRmsNormArgs& args, AllReduceInput input,
                                   cudaStream_t stream);

  // Exchanges the IPC handles of every input captured since the last call and fills their table
  // slots on every rank. Collective; call after capture, before the first replay; a no-op (still
  // collective) when nothing is pending. FailedPrecondition during capture or when the ranks
  // captured different numbers of calls or calls of different sizes; InvalidArgument naming the
  // rank and the value when what a rank sent about a buffer cannot be right (an offset that is
  // not a multiple of 16, or the call's bytes beyond the allocation it exported); every rank
  // checks every rank's buffers before it maps any, so all refuse alike. Unavailable when a
  // handle could not be opened on some rank (then nothing is registered anywhere). First returns
  // the sticky error, as CheckTimedOut does, before any exchange.
  absl::Status RegisterGraphBuffers();

  // Returns FailedPrecondition naming how many captured inputs are not registered yet, else OK.
  // Call before replaying a graph. Legal during capture; thread-compatible.
  absl::Status CheckReplayable() const;

  // Returns what the kernels reported without waiting: DeadlineExceeded (sticky) once a barrier
  // timed out, the sticky error of a failed capture agreement, FailedPrecondition once per
  // replay of an unregistered input, else OK.
  absl::Status CheckAsyncErrors();

  // Returns true once a barrier timed out (a peer died or hung) or a capture agreement failed;
  // reads device-written memory without waiting. Thread-compatible.
  bool peer_lost() const;

  // Returns the number of captured inputs awaiting RegisterGraphBuffers, and of registered ones.
  int pending_graph_inputs() const { return static_cast<int>(pending_.size()); }
  int registered_graph_inputs() const { return next_slot_ - static_cast<int>(pending_.size()); }

 private:
  struct PendingInput {
    int slot;
    const void* address;  // this rank's input
    // Where the call gathers into outputs (every rank exported its output): this rank's.
    bool has_output;
    void* output;
    // What RegisterGraphBuffers sends: the call's bytes, the exported input and output.
    internal::GraphInputRecord record;
    std::string key;  // capture key, for messages
  };

  // AutoCommunicator asks CheckTimedOut first on every call, whatever its path, checks a call's
  // arguments once, when it plans it, reads the stream's capture status once (CaptureStatus),
  // then asks TakeUnregisteredReplay and enqueues the call through EnqueueCheckedAllReduce or
  // EnqueueCheckedAddRmsNorm.
  friend class AutoCommunicator;

  CustomAllReduce(HostBootstrap& bootstrap, int device, const AllReduceConfig& config);
  // Returns the sticky error: DeadlineExceeded once a barrier timed out (a peer died or hung; read
  // from the device-written word without waiting), or the failed capture agreement's (see
  // RecordGraphInput), else OK. The first half of CheckAsyncErrors.
  absl::Status CheckTimedOut();
  // Returns FailedPrecondition once per replay that found its input unregistered (and clears
  // the device's flag), else OK. The second half of CheckAsyncErrors.
  absl::Status TakeUnregisteredReplay();
  // Returns `stream`'s capture status, read on the call that needs it (never from an earlier
  // call or the warm-up); a failed query is cleared and returned as its error. Thread-safe.
  static absl::StatusOr<cudaStreamCaptureStatus> CaptureStatus(cudaStream_t stream);
  // Enqueues an all-reduce of `bytes` whose arguments passed CheckAllReduceArgs (which gave
  // `bytes`) and CheckCustomAllReducePlan with this object's max_bytes(), once the state was
  // checked (AllReduce: CheckAsyncErrors, before the arguments; AutoCommunicator: CheckTimedOut,
  // then TakeUnregisteredReplay); `capture` is CaptureStatus(stream), read for this call. Checks
  // the capture state (FailedPrecondition for an invalidated capture, or a CaptureContext capture
  // on a stream that is not capturing) and a registered input only while capturing
  // (InvalidArgument).
  absl::Status EnqueueCheckedAllReduce(const void* in, void* out, size_t bytes, DataType dtype,
                                       const AllReducePlan& plan, cudaStreamCaptureStatus capture,
                                       cudaStream_t stream);
  // Enqueues a fused call whose sizes passed SupportsAddRmsNorm, once the state was checked as
  // above (AllReduceAddRmsNorm checks it before the sizes; AutoCommunicator's retry of a
  // registered call as staged checks it once for both tries), `capture` as above: checks
  // everything else AllReduceAddRmsNorm documents.
  absl::Status EnqueueCheckedAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                        AllReduceInput input, cudaStreamCaptureStatus capture,
                                        cudaStream_t stream);
  absl::Status Init();
  // Allocates this rank's push buffer (sentinel-filled), exchanges and maps every peer's.
  // Collective; Unavailable on every rank when any rank failed.
  absl::Status InitPush();
  // Records a captured call's input of `bytes` bytes, and its output when `out` is not null (a
  // two-shot call that may gather into outputs; used only if every rank can export its output).
  // Unavailable on every rank when a rank could not export its input; when the all-gather fails,
  // sets sticky_ to internal::CaptureAgreementLost of its error and returns it.
  absl::Status RecordGraphInput(const void* in, void* out, size_t bytes, int* slot);
  absl::StatusOr<void*> OpenPeerHandle(int peer, const cudaIpcMemHandle_t& handle);
  absl::StatusOr<bool> CanAccessPeerFromDevice(const std::string& bus_id);

  HostBootstrap& bootstrap_;
  const int device_;
  const AllReduceConfig config_;
  const int rank_;
  const int world_size_;
  size_t half_bytes_ = 0;
  bool initialized_ = false;  // every rank finished Create

  char* region_ = nullptr;                          // this rank's IPC region
  char* regions_[internal::kMaxRanks] = {};         // every rank's, mapped here
  internal::AllReduceControl* control_ = nullptr;   // device
  internal::RegisteredInput* table_ = nullptr;      // device, max_graph_inputs entries
  internal::DeviceErrorWords* errors_ = nullptr;    // host-mapped
  char* push_buffer_ = nullptr;                     // this rank's push buffer
  char* push_buffers_[internal::kMaxRanks] = {};    // every rank's, mapped here
  std::map<std::pair<int, std::string>, void*> opened_;  // (peer, handle bytes) -> mapping

  int next_slot_ = 0;
  std::vector<PendingInput> pending_;
  // DeadlineExceeded after a barrier timeout; a failed capture agreement's error (never
  // Unavailable).
  absl::Status sticky_;
};

}  // namespace kiln

#endif  // KILN_COLLECTIVES_CUSTOM_ALLREDUCE_H_
