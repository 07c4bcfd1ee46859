#include "collectives/auto_communicator.h"

#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "graph/capture_context.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// Returns whether the policy plans a call on a stream of capture status `capture` as captured:
// the stream captures (or its capture was invalidated), or CaptureContext says it captures.
bool PlannedAsCaptured(cudaStreamCaptureStatus capture) {
  return capture != cudaStreamCaptureStatusNone ||
         CaptureContext::Phase() == CapturePhase::kCapture;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AutoCommunicator>> AutoCommunicator::Create(
    HostBootstrap& bootstrap, int device, const AllReduceConfig& config) {
  RETURN_IF_ERROR(ValidateAllReduceConfig(config));
  bootstrap.set_timeout(absl::Milliseconds(config.bootstrap_timeout_ms()));
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                   NcclCommunicator::Create(bootstrap, device,
                                            absl::Milliseconds(config.bootstrap_timeout_ms())));
  std::unique_ptr<AutoCommunicator> comm(new AutoCommunicator(config, std::move(nccl)));
  if (!config.enable_custom()) {
    comm->custom_reason_ = "disabled by AllReduceConfig.enable_custom";
  } else if (!IsCustomWorldSize(bootstrap.world_size())) {
    comm->custom_reason_ = absl::StrFormat("world size %d (custom needs 2, 4, 6 or 8)",
                                           bootstrap.world_size());
  } else {
    absl::StatusOr<std::unique_ptr<CustomAllReduce>> custom =
        CustomAllReduce::Create(bootstrap, device, config);
    if (custom.ok()) {
      comm->custom_ = std::move(custom).value();
    } else if (absl::IsUnavailable(custom.status())) {
      // Every rank got the same Unavailable (the setup agrees at each step): all use NCCL.
      comm->custom_reason_ = std::string(custom.status().message());
      LOG(WARNING) << "Custom all-reduce unavailable, using NCCL for every call: "
                   << custom.status().message();
    } else {
      return custom.status();
    }
  }
  return comm;
}

AutoCommunicator::~AutoCommunicator() {
  const bool peer_lost = custom_ != nullptr && custom_->peer_lost();
  custom_.reset();
  if (peer_lost) nccl_->Abort();
}

absl::StatusOr<AutoCommunicator::PlannedCall> AutoCommunicator::PlanCall(
    const void* in, const void* out, size_t count, DataType dtype, cudaStream_t stream) const {
  PlannedCall call;
  AllReduceRequest request;
  // Refused before the policy sees them: a null input is 16-byte aligned and a wrapped size may
  // look small, and either would send the call to the custom kernel.
  ASSIGN_OR_RETURN(request.bytes, CheckAllReduceArgs(in, out, count, dtype));
  request.world_size = world_size();
  request.in = in;
  request.out = out;
  request.custom_available = custom_ != nullptr;
  request.custom_max_bytes = custom_ != nullptr ? custom_->max_bytes() : 0;
  if (request.custom_available) {
    // Asked on every call: a decision frozen at warm-up would replay the wrong path.
    ASSIGN_OR_RETURN(call.capture, CustomAllReduce::CaptureStatus(stream));
    request.capturing = PlannedAsCaptured(call.capture);
  }
  call.bytes = request.bytes;
  call.plan = SelectAllReduce(config_, request);
  return call;
}

absl::StatusOr<AllReducePlan> AutoCommunicator::Plan(const void* in, const void* out,
                                                     size_t count, DataType dtype,
                                                     cudaStream_t stream) const {
  ASSIGN_OR_RETURN(const PlannedCall call, PlanCall(in, out, count, dtype, stream));
  return call.plan;
}

void AutoCommunicator::AbortAfterTimeout(const absl::Status& error) {
  aborted_ = error;
  nccl_->AbortWithoutWaiting(error);
}

absl::Status AutoCommunicator::AllReduce(const void* in, void* out, size_t count,
                                         DataType dtype, cudaStream_t stream) {
  RETURN_IF_ERROR(aborted_);
  // A lost peer next, before the arguments and whatever the path: an NCCL call would wait for
  // that peer with no timeout of its own. Asked once; the custom path does not ask again.
  if (custom_ != nullptr) RETURN_IF_ERROR(custom_->CheckTimedOut());
  // The call's only argument checks: CheckAllReduceArgs in PlanCall, and SelectAllReduce, which
  // picks a custom plan only for what CheckCustomAllReducePlan accepts (allreduce_policy_test).
  // Neither communicator below checks them again; the custom path checks the rest of the state
  // here (an unregistered replay), and EnqueueCheckedAllReduce the capture state (from
  // call.capture, read once).
  ASSIGN_OR_RETURN(const PlannedCall call, PlanCall(in, out, count, dtype, stream));
  const AllReducePlan& plan = call.plan;
  if (plan.algorithm != AllReduceAlgorithm::kNccl) {
    RETURN_IF_ERROR(custom_->TakeUnregisteredReplay());
    absl::Status status =
        custom_->EnqueueCheckedAllReduce(in, out, call.bytes, dtype, plan, call.capture, stream);
    if (status.ok()) {
      const bool staged = plan.input == AllReduceInput::kStaged;
      if (plan.algorithm == AllReduceAlgorithm::kOneShot) {
        ++(staged ? stats_.one_shot_staged : stats_.one_shot_registered);
      } else {
        ++(staged ? stats_.two_shot_staged : stats_.two_shot_registered);
      }
      return status;
    }
    // Unavailable: some rank could not export its captured input over IPC, and all ranks
    // agreed on it, so all of them take NCCL for this call. A failed agreement (a lost peer) is
    // never Unavailable (internal::CaptureAgreementLost).
    if (!absl::IsUnavailable(status)) return status;
    ++stats_.ipc_fallbacks;
    if (!logged_ipc_fallback_) {
      logged_ipc_fallback_ = true;
      LOG(WARNING) << "Captured all-reduce falls back to NCCL: " << status.message();
    }
  }
  ++stats_.nccl;
  return nccl_->EnqueueAllReduce(in, out, count, dtype, stream);
}

bool AutoCommunicator::SupportsAllReduceAddRmsNorm(int64_t tokens, int64_t hidden,
                                                   DataType dtype) const {
  return dtype == DataType::kBf16 && custom_ != nullptr &&
         FusedAddRmsNormEligible(config_, world_size(), true, custom_->max_bytes(), tokens,
                                 hidden) &&
         custom_->SupportsAddRmsNorm(tokens, hidden, dtype);
}

absl::Status AutoCommunicator::AllReduceAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                                   cudaStream_t stream) {
  RETURN_IF_ERROR(aborted_);
  // A lost peer next, before the sizes, as for AllReduce.
  if (custom_ != nullptr) RETURN_IF_ERROR(custom_->CheckTimedOut());
  if (!SupportsAllReduceAddRmsNorm(args.tokens, args.hidden, args.dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "No fused all-reduce + RMSNorm for %d x %d %s here (%s); check "
        "SupportsAllReduceAddRmsNorm() and use AllReduce and a separate norm",
        args.tokens, args.hidden, DataTypeName(args.dtype),
        custom_ == nullptr ? custom_reason_ : "not the custom one-shot's size or dtype"));
  }
  AllReduceRequest request;
  request.bytes = static_cast<size_t>(args.tokens * args.hidden) * DataTypeSize(args.dtype);
  request.world_size = world_size();
  request.in = args.partial;
  request.out = args.out;
  request.custom_available = true;
  request.custom_max_bytes = custom_->max_bytes();
  // Asked on every call, as for AllReduce, and once: the custom all-reduce takes it from here.
  ASSIGN_OR_RETURN(const cudaStreamCaptureStatus capture, CustomAllReduce::CaptureStatus(stream));
  request.capturing = PlannedAsCaptured(capture);
  // The push kernel copies the input into the peers' buffers itself: nothing to register.
  AllReduceInput input = custom_->AddRmsNormPushes(args.tokens, args.hidden)
                             ? AllReduceInput::kStaged
                             : ChooseAllReduceInput(config_, AllReduceAlgorithm::kOneShot, request);
  // SupportsAllReduceAddRmsNorm asked custom_->SupportsAddRmsNorm above: enqueued unchecked.
  RETURN_IF_ERROR(custom_->TakeUnregisteredReplay());
  absl::Status result = custom_->EnqueueCheckedAddRmsNorm(args, input, capture, stream);
  if (absl::IsUnavailable(result) && input == AllReduceInput::kRegistered) {
    // Some rank could not export its captured input, and all ranks agreed on it: all of them
    // copy it into the staging buffer instead, which needs no export.
    if (!logged_ipc_fallback_) {
      logged_ipc_fallback_ = true;
      LOG(WARNING) << "Captured fused all-reduce + RMSNorm reads a staged copy: "
                   << result.message();
    }
    input = AllReduceInput::kStaged;
    // The state was checked for this call already.
    result = custom_->EnqueueCheckedAddRmsNorm(args, input, capture, stream);
  }
  if (!result.ok()) return result;
  ++stats_.fused_add_rms_norm;
  ++(input == AllReduceInput::kStaged ? stats_.one_shot_staged : stats_.one_shot_registered);
  return result;
}

absl::Status AutoCommunicator::CheckAsyncErrors() {
  RETURN_IF_ERROR(aborted_);
  if (custom_ != nullptr) RETURN_IF_ERROR(custom_->CheckAsyncErrors());
  return nccl_->CheckAsyncErrors();
}

absl::Status AutoCommunicator::RegisterGraphBuffers() {
  RETURN_IF_ERROR(aborted_);
  return custom_ != nullptr ? custom_->RegisterGraphBuffers() : absl::OkStatus();
}

absl::Status AutoCommunicator::CheckReplayable() const {
  return custom_ != nullptr ? custom_->CheckReplayable() : absl::OkStatus();
}

}  // namespace kiln
