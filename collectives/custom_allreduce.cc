#include "collectives/custom_allreduce.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collectives/internal/allreduce_rms_norm.h"
#include "collectives/internal/exchange_failed.h"
#include "graph/capture_context.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

using internal::AllReduceControl;
using internal::DeviceErrorWords;
using internal::kMaxRanks;
using internal::RegisteredInput;

using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange through the runtime's driver entry point: kiln never links libcuda.
absl::StatusOr<GetAddressRangeFn> AddressRangeFunction() {
  static GetAddressRangeFn fn = nullptr;
  if (fn != nullptr) return fn;
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  CUDA_RETURN_IF_ERROR(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &symbol, 12000,
                                                        cudaEnableDefault, &result));
  if (result != cudaDriverEntryPointSuccess || symbol == nullptr) {
    return absl::UnavailableError("The CUDA driver does not provide cuMemGetAddressRange");
  }
  fn = reinterpret_cast<GetAddressRangeFn>(symbol);
  return fn;
}

// The ranks' exchange of `mine` as bootstrap call `call` (each a distinct name, so a rank that
// skips one is caught at the next). A failure is reported by internal::ExchangeFailed: a lost
// peer is Aborted, never the Unavailable that means the ranks agreed the custom path cannot run.
absl::StatusOr<std::vector<std::string>> Exchange(HostBootstrap& bootstrap, absl::string_view call,
                                                  const std::string& mine) {
  absl::StatusOr<std::vector<std::string>> all = bootstrap.AllGather(mine, call);
  if (all.ok()) return all;
  return internal::ExchangeFailed(bootstrap.rank(), call, all.status());
}

// Serialises the outcome of a local step so the ranks can agree on it: "1" or "0<message>".
std::string Outcome(const absl::Status& status) {
  return status.ok() ? "1" : absl::StrCat("0", status.message());
}

// Exchanges `local` as bootstrap call `call`. Returns Unavailable naming the first rank whose
// outcome failed, or OK if all succeeded.
absl::Status AgreeOn(HostBootstrap& bootstrap, absl::string_view call, const absl::Status& local,
                     absl::string_view step) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, Exchange(bootstrap, call, Outcome(local)));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || all[r][0] != '1') {
      return absl::UnavailableError(absl::StrFormat(
          "Custom all-reduce %s failed on rank %d: %s", step, r,
          all[r].empty() ? "no reason given" : absl::string_view(all[r]).substr(1)));
    }
  }
  return absl::OkStatus();
}

// Returns whether a call on a stream of capture status `status` is being captured:
// FailedPrecondition for a capture an earlier error invalidated, or when CaptureContext says
// capture but the stream is not capturing.
absl::StatusOr<bool> Capturing(cudaStreamCaptureStatus status) {
  if (status == cudaStreamCaptureStatusInvalidated) {
    return absl::FailedPreconditionError(
        "The all-reduce stream's capture was invalidated by an earlier error; end the capture "
        "and start it again");
  }
  const bool capturing = status == cudaStreamCaptureStatusActive;
  if (CaptureContext::Phase() == CapturePhase::kCapture && !capturing) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CaptureContext is capturing %s but the all-reduce stream is not; enqueue the "
        "all-reduce on the stream being captured",
        KeyName(CaptureContext::Key())));
  }
  return capturing;
}

// Switches this thread to relaxed capture mode for its lifetime, so that handle queries made
// while another stream captures (global mode forbids "unsafe" calls) cannot invalidate it.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

CustomAllReduce::CustomAllReduce(HostBootstrap& bootstrap, int device,
                                 const AllReduceConfig& config)
    : bootstrap_(bootstrap),
      device_(device),
      config_(config),
      rank_(bootstrap.rank()),
      world_size_(bootstrap.world_size()),
      half_bytes_(static_cast<size_t>(config.buffer_bytes())) {}

absl::StatusOr<std::unique_ptr<CustomAllReduce>> CustomAllReduce::Create(
    HostBootstrap& bootstrap, int device, const AllReduceConfig& config) {
  RETURN_IF_ERROR(ValidateAllReduceConfig(config));
  if (!IsCustomWorldSize(bootstrap.world_size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "The custom all-reduce supports world sizes 2, 4, 6 and 8, not %d; use NCCL",
        bootstrap.world_size()));
  }
  RETURN_IF_ERROR(CheckNotCapturing(cudaStreamLegacy, "CustomAllReduce::Create"));
  std::unique_ptr<CustomAllReduce> ar(new CustomAllReduce(bootstrap, device, config));
  RETURN_IF_ERROR(ar->Init());
  RETURN_IF_ERROR(ar->InitPush());
  return ar;
}

absl::Status CustomAllReduce::Init() {
  // Every rank must cut the same grid and use the same crossovers, or the block-level barriers
  // would pair unrelated work.
  ASSIGN_OR_RETURN(std::vector<std::string> configs,
                   Exchange(bootstrap_, "custom_allreduce.config", config_.SerializeAsString()));
  for (size_t r = 1; r < configs.size(); ++r) {
    if (configs[r] != configs[0]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Rank %d's AllReduceConfig differs from rank 0's; give every rank the same config", r));
    }
  }

  // Step 1 (local): allocate and export.
  cudaIpcMemHandle_t handle{};
  char bus_id[32] = {};
  const uint32_t nonce = std::random_device{}();
  absl::Status local = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ASSIGN_OR_RETURN(GetAddressRangeFn range, AddressRangeFunction());
    (void)range;
    const size_t region_bytes = internal::kStagingOffset + 2 * half_bytes_;
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&region_), region_bytes));
    CUDA_RETURN_IF_ERROR(cudaMemset(region_, 0, region_bytes));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&control_), sizeof(*control_)));
    CUDA_RETURN_IF_ERROR(cudaMemset(control_, 0, sizeof(*control_)));
    const size_t table_bytes = sizeof(RegisteredInput) * config_.max_graph_inputs();
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&table_), table_bytes));
    CUDA_RETURN_IF_ERROR(cudaMemset(table_, 0, table_bytes));
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&errors_), sizeof(*errors_),
                                       cudaHostAllocMapped));
    std::memset(errors_, 0, sizeof(*errors_));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, region_));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id) - 1, device_));
    return absl::OkStatus();
  }();
  std::string mine = Outcome(local);
  mine.append(reinterpret_cast<const char*>(&handle), sizeof(handle));
  mine.append(reinterpret_cast<const char*>(&nonce), sizeof(nonce));
  mine.append(bus_id, sizeof(bus_id));
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   Exchange(bootstrap_, "custom_allreduce.setup", mine));
  std::vector<cudaIpcMemHandle_t> handles(world_size_);
  std::vector<uint32_t> nonces(world_size_);
  std::vector<std::string> bus_ids(world_size_);
  const size_t tail = sizeof(cudaIpcMemHandle_t) + sizeof(uint32_t) + sizeof(bus_id);
  for (int r = 0; r < world_size_; ++r) {
    const std::string& s = all[r];
    if (s.size() < 1 + tail || s[0] != '1') {
      return absl::UnavailableError(absl::StrFormat(
          "Custom all-reduce setup failed on rank %d: %s", r,
          s.size() > tail ? absl::string_view(s).substr(1, s.size() - 1 - tail) : "bad reply"));
    }
    std::memcpy(&handles[r], s.data() + s.size() - tail, sizeof(cudaIpcMemHandle_t));
    std::memcpy(&nonces[r], s.data() + s.size() - sizeof(bus_id) - sizeof(uint32_t),
                sizeof(uint32_t));
    bus_ids[r] = std::string(s.data() + s.size() - sizeof(bus_id));  // NUL-terminated
  }

  // Step 2: map every peer's region and write into it (the real proof of P2P).
  local = [&]() -> absl::Status {
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_) {
        regions_[p] = region_;
        continue;
      }
      ASSIGN_OR_RETURN(bool can, CanAccessPeerFromDevice(bus_ids[p]));
      if (!can) {
        return absl::UnavailableError(absl::StrFormat(
            "the driver reports no P2P access from GPU %d to rank %d's GPU %s", device_, p,
            bus_ids[p]));
      }
      void* mapped = nullptr;
      CUDA_RETURN_IF_ERROR(
          cudaIpcOpenMemHandle(&mapped, handles[p], cudaIpcMemLazyEnablePeerAccess));
      regions_[p] = static_cast<char*>(mapped);
      opened_[{p, std::string(reinterpret_cast<const char*>(&handles[p]), sizeof(handles[p]))}] =
          mapped;
    }
    CUDA_RETURN_IF_ERROR(
        internal::LaunchP2pProbe(regions_, world_size_, rank_, nonces[rank_], nullptr));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }();
  RETURN_IF_ERROR(AgreeOn(bootstrap_, "custom_allreduce.p2p_mapping", local, "P2P mapping"));

  // Step 3: check that every peer's record arrived intact.
  local = [&]() -> absl::Status {
    uint32_t probes[kMaxRanks][4] = {};
    CUDA_RETURN_IF_ERROR(cudaMemcpy(probes, region_ + internal::kProbeOffset, sizeof(probes),
                                    cudaMemcpyDeviceToHost));
    for (int p = 0; p < world_size_; ++p) {
      const uint32_t* got = probes[p];
      if (got[0] != internal::kProbeMagic || got[1] != static_cast<uint32_t>(p) ||
          got[2] != static_cast<uint32_t>(rank_) || got[3] != nonces[p]) {
        return absl::UnavailableError(absl::StrFormat(
            "the P2P test write from rank %d did not arrive intact (got %08x %u %u %08x)", p,
            got[0], got[1], got[2], got[3]));
      }
    }
    return absl::OkStatus();
  }();
  RETURN_IF_ERROR(AgreeOn(bootstrap_, "custom_allreduce.p2p_test_write", local, "P2P test write"));
  initialized_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> CustomAllReduce::CanAccessPeerFromDevice(const std::string& bus_id) {
  // The driver's answer is only a first filter; the probe write decides. A peer GPU that this
  // process cannot see (CUDA_VISIBLE_DEVICES) cannot be asked about: leave it to the probe.
  int peer_device = -1;
  if (cudaDeviceGetByPCIBusId(&peer_device, bus_id.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  if (peer_device == device_) {
    return absl::UnavailableError(absl::StrFormat(
        "two ranks use the same GPU (%s); give each rank its own GPU", bus_id));
  }
  int can = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device_, peer_device));
  return can != 0;
}

CustomAllReduce::~CustomAllReduce() {
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  cudaGetLastError();
  // Peers may still read this rank's region (a staged call's data, or flags): wait until every
  // rank is here before freeing. A broken bootstrap (dead peer) returns at once.
  if (initialized_ && sticky_.ok()) bootstrap_.Barrier("custom_allreduce.teardown").IgnoreError();
  for (auto& [key, mapped] : opened_) cudaIpcCloseMemHandle(mapped);
  if (region_ != nullptr) cudaFree(region_);
  if (push_buffer_ != nullptr) cudaFree(push_buffer_);
  if (control_ != nullptr) cudaFree(control_);
  if (table_ != nullptr) cudaFree(table_);
  if (errors_ != nullptr) cudaFreeHost(errors_);
  cudaGetLastError();
}

absl::Status CustomAllReduce::CheckAsyncErrors() {
  RETURN_IF_ERROR(CheckTimedOut());
  return TakeUnregisteredReplay();
}

absl::Status CustomAllReduce::CheckTimedOut() {
  if (!sticky_.ok()) return sticky_;
  const volatile DeviceErrorWords* e = errors_;
  if (e->timed_out != 0) {
    sticky_ = absl::DeadlineExceededError(absl::StrFormat(
        "Custom all-reduce on rank %d waited more than %d ms for rank %d at barrier %d; that "
        "process died or is stuck. This communicator is unusable: recreate it on every rank",
        rank_, config_.barrier_timeout_ms(), e->timed_out_peer, e->timed_out_stage));
  }
  return sticky_;
}

absl::Status CustomAllReduce::TakeUnregisteredReplay() {
  volatile DeviceErrorWords* e = errors_;
  if (e->unregistered != 0) {
    const int slot = e->unregistered_slot;
    e->unregistered = 0;
    return absl::FailedPreconditionError(absl::StrFormat(
        "A CUDA graph replayed a custom all-reduce whose input (graph input slot %d) was not "
        "registered; its output was not written. Call RegisterGraphBuffers() on every rank "
        "after capture and before replay",
        slot));
  }
  return absl::OkStatus();
}

bool CustomAllReduce::peer_lost() const {
  const volatile DeviceErrorWords* e = errors_;
  return !sticky_.ok() || e->timed_out != 0;
}

absl::Status CustomAllReduce::CheckReplayable() const {
  if (pending_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%d custom all-reduce input(s) captured (first in %s) are not registered; call "
      "RegisterGraphBuffers() on every rank after capture and before replay",
      pending_.size(), pending_.front().key));
}

namespace {

// Finds the allocation holding `address`: its IPC handle and size, and the offset of `address`
// in it.
absl::Status ExportForIpc(const void* address, internal::ExportedBuffer* exported) {
  RelaxedCaptureMode relaxed;
  ASSIGN_OR_RETURN(GetAddressRangeFn range, AddressRangeFunction());
  CUdeviceptr base = 0;
  size_t size = 0;
  RETURN_IF_ERROR(ToStatus(range(&base, &size, reinterpret_cast<CUdeviceptr>(address)),
                           "cuMemGetAddressRange(all-reduce buffer)"));
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&exported->handle, reinterpret_cast<void*>(base)));
  exported->offset = reinterpret_cast<uintptr_t>(address) - static_cast<uintptr_t>(base);
  exported->allocation_bytes = size;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<cudaStreamCaptureStatus> CustomAllReduce::CaptureStatus(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t error = cudaStreamIsCapturing(stream, &status);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return ToStatus(error, "cudaStreamIsCapturing(all-reduce stream)");
  }
  return status;
}

absl::Status CustomAllReduce::RecordGraphInput(const void* in, void* out, size_t bytes, int* slot) {
  PendingInput entry{};
  entry.slot = next_slot_;
  entry.address = in;
  entry.record.bytes = bytes;
  entry.key = CaptureContext::Phase() == CapturePhase::kCapture
                  ? KeyName(CaptureContext::Key())
                  : std::string("a capture outside CaptureContext");
  absl::Status local = [&]() -> absl::Status {
    if (next_slot_ >= config_.max_graph_inputs()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "all %d graph input slots are used; raise AllReduceConfig.max_graph_inputs",
          config_.max_graph_inputs()));
    }
    return ExportForIpc(in, &entry.record.input);
  }();
  // An output that cannot be exported only means this call gathers into staging.
  const bool output_exported =
      local.ok() && out != nullptr && ExportForIpc(out, &entry.record.output).ok();
  // The ranks must agree before any of them records a kernel that waits for the others.
  absl::StatusOr<std::vector<std::string>> all =
      bootstrap_.AllGather(internal::CaptureAgreementMessage(local, output_exported, next_slot_),
                           internal::kCaptureAgreementCall);
  if (!all.ok()) {
    // A lost peer is not an agreement to take NCCL (whose kernel would wait for that peer):
    // sticky, so this and every later call report it.
    sticky_ = internal::CaptureAgreementLost(rank_, all.status());
    return sticky_;
  }
  bool every_output = false;
  RETURN_IF_ERROR(internal::CheckCaptureAgreement(rank_, next_slot_, *all, &every_output));
  every_output = every_output && out != nullptr;
  entry.has_output = every_output;
  entry.output = every_output ? out : nullptr;
  if (!every_output) entry.record.output = internal::ExportedBuffer();
  pending_.push_back(entry);
  *slot = next_slot_++;
  return absl::OkStatus();
}

absl::Status CustomAllReduce::AllReduce(const void* in, void* out, size_t count, DataType dtype,
                                        const AllReducePlan& plan, cudaStream_t stream) {
  // The state first: once a peer is lost, the sticky error is what every call reports, whatever
  // its arguments.
  RETURN_IF_ERROR(CheckAsyncErrors());
  // The size and alignment checks run on every call, capturing or not: a captured kernel with
  // an oversize input would overrun the staging buffers on every replay.
  AllReduceRequest request;
  ASSIGN_OR_RETURN(request.bytes, CheckAllReduceArgs(in, out, count, dtype));
  request.in = in;
  request.out = out;
  request.custom_max_bytes = half_bytes_;
  RETURN_IF_ERROR(CheckCustomAllReducePlan(plan, request, count, DataTypeName(dtype)));
  ASSIGN_OR_RETURN(const cudaStreamCaptureStatus capture, CaptureStatus(stream));
  return EnqueueCheckedAllReduce(in, out, request.bytes, dtype, plan, capture, stream);
}

absl::Status CustomAllReduce::EnqueueCheckedAllReduce(const void* in, void* out, size_t bytes,
                                                      DataType dtype, const AllReducePlan& plan,
                                                      cudaStreamCaptureStatus capture,
                                                      cudaStream_t stream) {
  ASSIGN_OR_RETURN(const bool capturing, Capturing(capture));
  const bool registered = plan.input == AllReduceInput::kRegistered;
  if (registered && !capturing) {
    return absl::InvalidArgumentError(
        "A registered-input all-reduce is only for graph capture; eager calls use kStaged");
  }
  const bool two_shot = plan.algorithm == AllReduceAlgorithm::kTwoShot;
  int slot = -1;
  if (registered) {
    const bool gather_to_outputs = two_shot && config_.two_shot_gather_to_outputs();
    RETURN_IF_ERROR(RecordGraphInput(in, gather_to_outputs ? out : nullptr, bytes, &slot));
  }

  internal::CustomAllReduceArgs args{};
  args.in = in;
  args.out = out;
  for (int r = 0; r < world_size_; ++r) args.regions[r] = regions_[r];
  args.registered = registered ? table_ + slot : nullptr;
  args.control = control_;
  args.errors = errors_;
  args.packs = bytes / 16;
  args.half_bytes = half_bytes_;
  args.timeout_ns = static_cast<uint64_t>(config_.barrier_timeout_ms()) * 1000000ull;
  args.rank = rank_;
  args.slot = slot;
  const bool push_inputs =
      two_shot ? config_.two_shot_push_inputs() : config_.one_shot_push_inputs();
  args.push_inputs =
      push_inputs && internal::PushedInputsFit(args.packs, world_size_, two_shot, half_bytes_);
  args.push_gather = two_shot && config_.two_shot_push_gather();
  const CustomLaunchShape shape =
      ChooseCustomLaunchShape(config_, plan.algorithm, bytes, world_size_);
  internal::KernelDtype kernel_dtype = internal::KernelDtype::kBf16;
  switch (dtype) {
    case DataType::kBf16:
      kernel_dtype = internal::KernelDtype::kBf16;
      break;
    case DataType::kFp16:
      kernel_dtype = internal::KernelDtype::kFp16;
      break;
    case DataType::kFp32:
      kernel_dtype = internal::KernelDtype::kFp32;
      break;
  }
  return ToStatus(internal::LaunchCustomAllReduce(args, kernel_dtype, world_size_, two_shot,
                                                  shape.blocks, shape.threads,
                                                  config_.programmatic_dependent_launch(), stream),
                  "custom all-reduce launch");
}

absl::StatusOr<void*> CustomAllReduce::OpenPeerHandle(int peer,
                                                      const cudaIpcMemHandle_t& handle) {
  auto key = std::make_pair(peer, std::string(reinterpret_cast<const char*>(&handle),
                                              sizeof(handle)));
  auto it = opened_.find(key);
  if (it != opened_.end()) return it->second;
  void* mapped = nullptr;
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
  opened_[key] = mapped;
  return mapped;
}

absl::Status CustomAllReduce::RegisterGraphBuffers() {
  if (CaptureContext::IsCapturing()) {
    return absl::FailedPreconditionError(
        "RegisterGraphBuffers() is illegal during capture; call it after the capture ends");
  }
  RETURN_IF_ERROR(CheckNotCapturing(cudaStreamLegacy, "RegisterGraphBuffers"));
  RETURN_IF_ERROR(CheckTimedOut());
  // A header, then per input its record (internal/graph_input_record.h).
  static_assert(internal::kGraphInputsHeaderBytes +
                        size_t{kMaxAllReduceGraphInputs} * internal::kGraphInputRecordBytes <=
                    HostBootstrap::kMaxMessageBytes,
                "every pending graph input must fit one bootstrap message");
  std::string mine;
  const int first = pending_.empty() ? next_slot_ : pending_.front().slot;
  const int n = static_cast<int>(pending_.size());
  internal::AppendGraphInputsHeader(first, n, &mine);
  for (const PendingInput& p : pending_) internal::AppendGraphInputRecord(p.record, &mine);
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   Exchange(bootstrap_, "custom_allreduce.registration", mine));
  for (int r = 0; r < world_size_; ++r) {
    RETURN_IF_ERROR(internal::CheckGraphInputsMessage(rank_, first, n, r, all[r]));
  }
  if (n == 0) return absl::OkStatus();

  // What every rank says about its buffers is checked before anything is mapped: a wrong
  // offset or size would have the kernels read or write outside the peer's allocation. Every
  // rank checks every record, its own included, so every rank refuses alike and none is left
  // waiting in the agreement below. The records are read from the gathered messages, here and
  // again where they are mapped, never copied out: world size x n copies would double the memory
  // the messages take (1.4 GB at 8 ranks and kMaxAllReduceGraphInputs).
  for (int r = 0; r < world_size_; ++r) {
    for (int i = 0; i < n; ++i) {
      const PendingInput& p = pending_[i];
      RETURN_IF_ERROR(internal::CheckGraphInputRecord(
          r, p.slot, internal::ReadGraphInputRecord(all[r], i), p.record.bytes, p.has_output));
    }
  }

  std::vector<RegisteredInput> entries(n);
  absl::Status local = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (int i = 0; i < n; ++i) {
      RegisteredInput& e = entries[i];
      std::memset(&e, 0, sizeof(e));
      const PendingInput& p = pending_[i];
      for (int r = 0; r < world_size_; ++r) {
        if (r == rank_) {
          e.ptrs[r] = p.address;
          e.outs[r] = p.output;
          continue;
        }
        // Maps rank r's exported buffer (checked above).
        auto open = [&](const internal::ExportedBuffer& buffer) -> absl::StatusOr<char*> {
          ASSIGN_OR_RETURN(void* base, OpenPeerHandle(r, buffer.handle));
          return static_cast<char*>(base) + buffer.offset;
        };
        const internal::GraphInputRecord record = internal::ReadGraphInputRecord(all[r], i);
        ASSIGN_OR_RETURN(e.ptrs[r], open(record.input));
        // has_output was agreed by every rank when the call was captured.
        if (p.has_output) {
          ASSIGN_OR_RETURN(e.outs[r], open(record.output));
        }
      }
      e.ready = 1;
    }
    return absl::OkStatus();
  }();
  RETURN_IF_ERROR(AgreeOn(bootstrap_, "custom_allreduce.registration_agreement", local,
                          "graph buffer registration"));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table_ + first, entries.data(),
                                       n * sizeof(RegisteredInput), cudaMemcpyHostToDevice,
                                       cudaStreamLegacy));
  // Replays on other (non-blocking) streams must find the entries in place: wait for the copy
  // to land, and for nothing else the device runs.
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  pending_.clear();
  return absl::OkStatus();
}

static_assert(internal::kRmsNormMaxHidden == kFusedAddRmsNormMaxHidden,
              "the fused kernel's row limit and the policy's disagree");

absl::Status CustomAllReduce::InitPush() {
  cudaIpcMemHandle_t handle{};
  absl::Status local = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const size_t bytes = internal::PushBufferBytes(world_size_);
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&push_buffer_), bytes));
    // Every byte 0xff: every bf16 lane holds the sentinel (no value pending).
    CUDA_RETURN_IF_ERROR(cudaMemset(push_buffer_, 0xff, bytes));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, push_buffer_));
    return absl::OkStatus();
  }();
  std::string mine = Outcome(local);
  mine.append(reinterpret_cast<const char*>(&handle), sizeof(handle));
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   Exchange(bootstrap_, "custom_allreduce.push_setup", mine));
  for (int r = 0; r < world_size_; ++r) {
    const std::string& s = all[r];
    if (s.size() < 1 + sizeof(handle) || s[0] != '1') {
      return absl::UnavailableError(absl::StrFormat(
          "Custom all-reduce push buffer setup failed on rank %d: %s", r,
          s.size() > sizeof(handle) ? absl::string_view(s).substr(1, s.size() - 1 - sizeof(handle))
                                    : "bad reply"));
    }
  }
  local = [&]() -> absl::Status {
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_) {
        push_buffers_[p] = push_buffer_;
        continue;
      }
      cudaIpcMemHandle_t theirs;
      std::memcpy(&theirs, all[p].data() + all[p].size() - sizeof(theirs), sizeof(theirs));
      ASSIGN_OR_RETURN(void* mapped, OpenPeerHandle(p, theirs));
      push_buffers_[p] = static_cast<char*>(mapped);
    }
    return absl::OkStatus();
  }();
  return AgreeOn(bootstrap_, "custom_allreduce.push_mapping", local, "push buffer mapping");
}

bool CustomAllReduce::AddRmsNormPushes(int64_t tokens, int64_t hidden) const {
  // hidden is bounded before it is doubled: hidden * 2 would overflow int64 for any hidden
  // above 2^62 (signed overflow), and no such row fits a push slot anyway.
  constexpr int64_t kSlotBytes = static_cast<int64_t>(internal::kPushSlotBytes);
  return push_buffer_ != nullptr && tokens >= 1 && hidden >= 1 && hidden <= kSlotBytes / 2 &&
         tokens <= kSlotBytes / (hidden * 2);
}

bool CustomAllReduce::SupportsAddRmsNorm(int64_t tokens, int64_t hidden, DataType dtype) const {
  return dtype == DataType::kBf16 && tokens >= 1 && hidden >= 8 && hidden % 8 == 0 &&
         hidden <= kFusedAddRmsNormMaxHidden && tokens <= 0x7fffffff &&
         tokens <= static_cast<int64_t>(half_bytes_) / (hidden * 2);
}

absl::Status CustomAllReduce::AllReduceAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                                  AllReduceInput input, cudaStream_t stream) {
  // The state first, as for AllReduce.
  RETURN_IF_ERROR(CheckAsyncErrors());
  // Checked on every call, capturing or not, like AllReduce's size check.
  if (!SupportsAddRmsNorm(args.tokens, args.hidden, args.dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Fused all-reduce + RMSNorm of %d x %d %s: needs bf16 rows of a multiple of 8 elements "
        "up to %d, and at most buffer_bytes %d in all; use AllReduce and a separate norm",
        args.tokens, args.hidden, DataTypeName(args.dtype), kFusedAddRmsNormMaxHidden,
        half_bytes_));
  }
  ASSIGN_OR_RETURN(const cudaStreamCaptureStatus capture, CaptureStatus(stream));
  return EnqueueCheckedAddRmsNorm(args, input, capture, stream);
}

absl::Status CustomAllReduce::EnqueueCheckedAddRmsNorm(const AllReduceAddRmsNormArgs& args,
                                                       AllReduceInput input,
                                                       cudaStreamCaptureStatus capture,
                                                       cudaStream_t stream) {
  // SupportsAddRmsNorm bounded tokens and hidden: the products below do not overflow.
  const size_t bytes = static_cast<size_t>(args.tokens * args.hidden) * 2;
  const size_t weight_bytes = static_cast<size_t>(args.hidden) * 2;
  for (const void* p : {args.partial, static_cast<const void*>(args.residual), args.weight,
                        static_cast<const void*>(args.out)}) {
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Fused all-reduce + RMSNorm needs non-null 16-byte-aligned buffers (partial %p, "
          "residual %p, weight %p, out %p)",
          args.partial, args.residual, args.weight, args.out));
    }
  }
  // [a, a + a_bytes) and [b, b + b_bytes) overlap.
  auto overlap = [](const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    const uintptr_t x = reinterpret_cast<uintptr_t>(a);
    const uintptr_t y = reinterpret_cast<uintptr_t>(b);
    return x < y + b_bytes && y < x + a_bytes;
  };
  if (overlap(args.residual, bytes, args.partial, bytes) ||
      overlap(args.residual, bytes, args.out, bytes) ||
      overlap(args.weight, weight_bytes, args.residual, bytes) ||
      overlap(args.weight, weight_bytes, args.out, bytes)) {
    return absl::InvalidArgumentError(
        "Fused all-reduce + RMSNorm: the residual and the weights must not overlap the other "
        "buffers");
  }
  const bool in_place = args.out == args.partial;
  if (!in_place && overlap(args.out, bytes, args.partial, bytes)) {
    return absl::InvalidArgumentError(
        "Fused all-reduce + RMSNorm: out must be partial itself or not overlap it");
  }
  ASSIGN_OR_RETURN(const bool capturing, Capturing(capture));
  const bool registered = input == AllReduceInput::kRegistered;
  if (registered && !capturing) {
    return absl::InvalidArgumentError(
        "A registered-input all-reduce is only for graph capture; eager calls use kStaged");
  }
  if (registered && in_place) {
    return absl::InvalidArgumentError(
        "An in-place fused all-reduce cannot read a registered input (peers would read data "
        "this rank is overwriting); use kStaged");
  }
  const bool push = AddRmsNormPushes(args.tokens, args.hidden);
  int slot = -1;
  if (registered && !push) {
    RETURN_IF_ERROR(RecordGraphInput(args.partial, nullptr, bytes, &slot));
  }

  internal::AllReduceRmsNormArgs k{};
  k.base.in = args.partial;
  k.base.out = args.out;
  for (int r = 0; r < world_size_; ++r) k.base.regions[r] = regions_[r];
  k.base.registered = registered && !push ? table_ + slot : nullptr;
  k.base.control = control_;
  k.base.errors = errors_;
  k.base.packs = bytes / 16;
  k.base.half_bytes = half_bytes_;
  k.base.timeout_ns = static_cast<uint64_t>(config_.barrier_timeout_ms()) * 1000000ull;
  k.base.rank = rank_;
  k.base.slot = slot;
  k.residual = args.residual;
  k.weight = args.weight;
  k.tokens = static_cast<int>(args.tokens);
  k.hidden = static_cast<int>(args.hidden);
  k.eps = args.eps;
  if (push) {
    for (int r = 0; r < world_size_; ++r) k.push[r] = push_buffers_[r];
  }
  // One block per row up to the block cap; a block owns whole rows (the norm needs them).
  const int blocks = static_cast<int>(
      std::min<int64_t>(args.tokens, std::min(config_.max_blocks(), internal::kMaxBlocks)));
  return ToStatus(internal::LaunchAllReduceRmsNorm(k, world_size_, blocks, stream),
                  "fused all-reduce + RMSNorm launch");
}

}  // namespace kiln
